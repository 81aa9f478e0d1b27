"""The write fence: how a writer of the ledger notices that Redis lost writes it made.

Redis can come back with an older copy of the ledger that still says it is ready: a restart from a snapshot, a
failover to a replica that lagged. The writes made after the copy are gone; an admitted entry among them leaves its
pod's room free in the ledger while the pod runs there. Nothing inside Redis can tell, because everything in it went
back together: only a writer remembers what it wrote. A stamp that one process bumps now and then sees only copies
older than its last bump.

So a fenced writer (a `hoss.ledger.client.Ledger` made with ``fenced=True``; the resolver's two are) owns a counter
in Redis, ``{hoss}:fence:<random id>``, that every script it runs increments in the same atomic call as its writes,
and it counts the calls Redis answered. While Redis keeps every write, the counter is at least that count; only this
writer increments it, so other writers' calls after a restore cannot make up for a loss. A script that finds the
counter below the count (common.lua, 'The write fence') marks the ledger not ready, counts a stale ledger in
``{hoss}:stats`` and writes nothing; the writer then takes a fresh counter and runs the call once more (refused as
not ready, or a rebuild, which runs anyway). The syncing replica rebuilds the ledger from the apiserver at its next
watchdog tick.

Invariant: while Redis keeps every write, the counter of `WriteFence.key` is at least `WriteFence.answered`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Final

from hoss.ledger.keys import KEY_PREFIX

FENCE_PREFIX: Final = f"{KEY_PREFIX}:fence:"
"""A fenced writer's counter is ``{hoss}:fence:<id>`` (it expires a day after the writer's last check, see
hoss/ledger/lua/fence.lua, so the counters of writers that are gone do not stay)."""
LOST_WRITES: Final = "lost_writes"
"""The first element of a script's reply when its fence found writes lost (then: at least how many)."""


def _new_key() -> str:
    return f"{FENCE_PREFIX}{secrets.token_hex(8)}"


@dataclass
class WriteFence:
    """One writer's counter and how many of its calls Redis answered."""

    key: str = field(default_factory=_new_key)
    answered: int = 0

    def answer(self, key: str) -> None:
        """A call made under `key` was answered (a call made under a counter given up since does not count)."""
        if key == self.key:
            self.answered += 1

    def renew(self) -> None:
        """Start over on a fresh counter: the old one is short of writes Redis lost, and every call still in flight
        under it would find it short again."""
        self.key = _new_key()
        self.answered = 0
