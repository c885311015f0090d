"""A stream's administration calls that answer with the publisher's JSON: cancel and mint a read token.

Functions over a :class:`~fanout_client.client.FanoutClient` (its session, credentials and
problem handling), for ``fanout cancel`` and ``fanout token``; unlike
:meth:`FanoutClient.cancel <fanout_client.client.FanoutClient.cancel>`, which returns the
HTTP status, a refusal raises with the publisher's problem attached.
"""

from __future__ import annotations

from typing import Any

from fanout_client.client import FanoutClient


async def cancel_stream(client: FanoutClient, stream_id: str) -> dict[str, Any]:
    """Cancel a stream (API key) and return the ``202`` answer, ``{"stream_id", "state": "cancelling"}``.

    Raises:
        StreamUnavailableError: Refused: 401, 404, or 409 ``already-terminal`` (its
            problem names the end in ``stream_status``).
        PublisherUnreachableError: No connection could be made to the publisher.
    """
    async with client._request("POST", f"/v1/streams/{stream_id}/cancel", headers=client._auth()) as resp:
        return await client._json_or_raise(resp, expect=(202,))


async def mint_token(client: FanoutClient, stream_id: str, scope: str = "public") -> dict[str, Any]:
    """Mint a read token (API key): ``{"stream_id", "token", "token_expires_at", "token_scope"}``.

    Raises:
        StreamUnavailableError: Refused: 401, 404, 400 (a scope other than ``public``/``internal``).
        PublisherUnreachableError: No connection could be made to the publisher.
    """
    async with client._request("POST", f"/v1/streams/{stream_id}/tokens", json={"scope": scope},
                               headers=client._auth()) as resp:
        return await client._json_or_raise(resp, expect=(201,))
