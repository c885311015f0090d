"""Waiting for a condition in the fault scenarios: bounded polling, never a fixed sleep taken for an outcome."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

GUARD_S = 30.0
"""Hang guard of one wait; never a performance limit."""


async def until(check: Callable[[], bool | Awaitable[bool]], what: str, *, guard_s: float = GUARD_S,
                step_s: float = 0.02) -> None:
    """Poll ``check()`` (plain or awaitable) every ``step_s`` until it is true.

    Raises:
        AssertionError: Not true within ``guard_s``; the message names ``what`` was awaited.
    """
    try:
        async with asyncio.timeout(guard_s):
            while True:
                value = check()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return
                await asyncio.sleep(step_s)
    except TimeoutError:
        raise AssertionError(f"not within {guard_s} s: {what}") from None
