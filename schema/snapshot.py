"""``stream.snapshot`` (contract 1.1), re-exported from :mod:`fanout_client.snapshot`.

The assembled state of a stream as of one seq, sent to a reader that asks for it
instead of the history up to there; never stored. Pure.
"""

from fanout_client.snapshot import (
    SNAPSHOT_TYPE as SNAPSHOT_TYPE,
)
from fanout_client.snapshot import (
    StreamSnapshot as StreamSnapshot,
)
from fanout_client.snapshot import (
    assembler_from as assembler_from,
)
from fanout_client.snapshot import (
    decode_snapshot as decode_snapshot,
)
from fanout_client.snapshot import (
    encode_snapshot as encode_snapshot,
)
from fanout_client.snapshot import (
    snapshot_json as snapshot_json,
)
