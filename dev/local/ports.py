"""Free loopback ports for the processes that the local plane, the tests and the bench start.

A port from ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral range, the same range every outgoing
connection of every process on the machine takes its local port from. Between picking a port and the child
binding it (seconds, during a plane start), a connection of a neighbouring plane can take it, and the child dies
with "Address already in use" (seen in CI with two test workers starting planes at once). Ports below the
ephemeral range are never given to outgoing connections, so only another picker could take one; a random choice
makes that rare, and this process never hands out the same port twice.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)
LOWEST_PORT = 10000
"""Below this are the ports services on a machine tend to be configured with."""
MIN_CHOICES = 1000
"""Fewer ports than this outside the ephemeral range: fall back to the kernel's choice."""
ATTEMPTS = 200

_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default when it cannot be read)."""
    try:
        low, high = (int(field) for field in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return low, high


def bind_error(port: int) -> OSError | None:
    """Why ``port`` cannot be bound on 127.0.0.1 now, or None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as error:
            return error
    return None


def _kernel_choice() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A port nothing is bound to on 127.0.0.1, outside the ephemeral range when there is room for it."""
    low, high = ephemeral_range()
    spans = [(start, end) for start, end in ((LOWEST_PORT, low - 1), (high + 1, 65535)) if end >= start]
    if sum(end - start + 1 for start, end in spans) < MIN_CHOICES:
        return _kernel_choice()
    weights = [end - start + 1 for start, end in spans]
    for _ in range(ATTEMPTS):
        start, end = random.choices(spans, weights)[0]
        port = random.randint(start, end)
        if port not in _handed_out and bind_error(port) is None:
            _handed_out.add(port)
            return port
    return _kernel_choice()
