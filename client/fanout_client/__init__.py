"""fanout's Python client: submit generation jobs and follow their streams with exact resume.

Install it on its own (``pip install ./client`` from a fanout checkout); it depends on
``aiohttp`` and ``msgspec`` only and imports nothing of the server. What it exports:

* :class:`FanoutClient`: ``submit``, ``events`` (reconnects with ``Last-Event-ID``),
  ``result``, ``status``, ``cancel``; :class:`Submission` is what ``submit`` returns;
* the event contract (:mod:`fanout_client.contract`: ``StreamStart``, ``BlockDelta``, ...)
  and the reducer (:mod:`fanout_client.reducer`: events → assembled result);
* the errors (:mod:`fanout_client.errors`);
* ``fanout-client submit|tail|status|cancel|token``, the command line (:mod:`fanout_client.cli`,
  :mod:`fanout_client.cli_manage`).
"""

from fanout_client.client import FanoutClient as FanoutClient
from fanout_client.client import Submission as Submission
from fanout_client.contract import Event as Event
from fanout_client.errors import FanoutError as FanoutError
from fanout_client.errors import HistoryResetError as HistoryResetError
from fanout_client.errors import PublisherUnreachableError as PublisherUnreachableError
from fanout_client.errors import StreamUnavailableError as StreamUnavailableError
from fanout_client.reducer import AssembledResult as AssembledResult

__version__ = "0.1.0"
"""The distribution's version (``fanout-client``)."""
