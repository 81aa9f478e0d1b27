"""The tests' one wait helper: it returns once the condition holds and fails naming what it waited for."""

from __future__ import annotations

import pytest

from tests.waiting import until


async def test_until_returns_what_an_async_check_saw_once_it_holds() -> None:
    asked = 0

    async def third_time() -> tuple[bool, str]:
        nonlocal asked
        asked += 1
        return asked == 3, f"asked {asked} times"

    assert await until(third_time, timeout=5, what="the third ask") == "asked 3 times"


async def test_until_fails_naming_what_it_waited_for_and_what_it_saw_last() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"waiting for the door to open; last seen: shut"):
        await until(lambda: (False, "shut"), timeout=0.05, what="the door to open")


async def test_until_lets_a_checks_own_timeout_through() -> None:
    def check() -> bool:
        raise TimeoutError("the check's own")

    with pytest.raises(TimeoutError, match="the check's own"):
        await until(check, timeout=5, what="anything")
