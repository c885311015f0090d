"""The publisher fixtures (a running app, a session, a fresh stream id) for the tools' tests of its plug-ins."""

from tests.publisher.conftest import ctx, http, server, sid, start_app

__all__ = ["ctx", "http", "server", "sid", "start_app"]
