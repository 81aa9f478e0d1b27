"""Ports for the processes the local plane starts: outside the range outgoing connections take theirs from."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from dev.local import ports


def test_a_port_is_outside_the_ephemeral_range_free_and_never_handed_out_twice() -> None:
    low, high = ports.ephemeral_range()
    picked = [ports.free_port() for _ in range(300)]
    assert len(set(picked)) == len(picked)
    for port in picked:
        assert ports.LOWEST_PORT <= port < low or high < port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked[-1]))  # nothing holds it


def test_a_bound_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    draws: list[int] = []
    randint = random.randint

    def draw(start: int, end: int) -> int:
        draws.append(busy if not draws else randint(start, end))
        return draws[-1]

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        monkeypatch.setattr(random, "randint", draw)
        port = ports.free_port()
    # the busy port was drawn first and passed over; the port handed out is a later draw (usually the second: a
    # later one when the second was itself taken on this machine or handed out already)
    assert draws[0] == busy and len(draws) >= 2 and port == draws[-1] != busy


def test_with_no_room_outside_the_ephemeral_range_the_kernel_chooses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = tmp_path / "ip_local_port_range"
    whole.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", whole)
    assert ports.ephemeral_range() == (1024, 65535)
    assert 1024 <= ports.free_port() <= 65535
