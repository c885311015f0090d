"""The reducer (events → assembled result), re-exported from :mod:`fanout_client.reducer`.

It lives in the client distribution so ``fanout-client`` assembles results with the very
code the status route uses. Pure.
"""

from fanout_client.reducer import (
    AssembledBlock as AssembledBlock,
)
from fanout_client.reducer import (
    AssembledResult as AssembledResult,
)
from fanout_client.reducer import (
    Assembler as Assembler,
)
from fanout_client.reducer import (
    ReasoningBlock as ReasoningBlock,
)
from fanout_client.reducer import (
    RefusalBlock as RefusalBlock,
)
from fanout_client.reducer import (
    ResultStatus as ResultStatus,
)
from fanout_client.reducer import (
    TextBlock as TextBlock,
)
from fanout_client.reducer import (
    ToolCallBlock as ToolCallBlock,
)
from fanout_client.reducer import (
    parse_arguments as parse_arguments,
)
from fanout_client.reducer import (
    reduce as reduce,
)
from fanout_client.reducer import (
    result_to_builtins as result_to_builtins,
)
