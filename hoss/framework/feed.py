"""The worker's node state from the ledger alone: one load, then the ledger's change stream as deltas.

Workers do not watch nodes or pods on the apiserver. The resolver's sync writes each node's compact description
into the ledger, and every ledger script that changes a node's used totals appends them to ``{hoss}:changes``
(`hoss.ledger.results.Change`). A worker loads every node once (`Ledger.load`: descriptions, used totals and the id
of the last change, read at one instant) and then applies the stream in order. A worker's cost per change is a
dictionary update, whatever the number of nodes and workers; it never re-reads the whole ledger except after a
rebuild (an ``r`` entry), when the stream was trimmed past the worker's position, or when Redis lost its data.

Entries carry totals, not increments, so applying one twice is harmless: the latest entry is the ledger's truth at
that moment. What the worker counts itself rides on top of them (`NodeTable.set_totals`): a decision's tentative
placement while its reservation call is under way, and a reservation until the feed applies the entry its call
wrote (the call's reply names it; `NodeTable.expect`, `NodeTable.settle`). The reply and the feed's read of the entry
come on different connections, in either order; adding the reservation after its entry's totals were applied
would count it twice, and with nothing else touching the node (a bind in place writes no entry) the worker would
see the node fuller than it is until the next change there.

The feed also keeps the table's pod index (`NodeTable.pods`: which pods run or are reserved on each node, with
their namespace, labels and host ports): the load brings every entry, and each ``u`` entry says which pods the
call placed (``p:<uid>``) or removed (``x:<uid>``). NodePorts, InterPodAffinity and PodTopologySpread read it.

And the rescheduler's holds (``h`` entries, `holds`): a pod the rescheduler made room for, or the replacement of a
pod it moved, is steered onto the node where its room is held (`held_nodes`; see rescheduler/execute.py).

A worker with nothing to do stops reading (``idle``, ``pause_after_seconds``): the dispatcher keeps a load that
one worker keeps up with on that worker (dispatcher/routing.py), so the others would otherwise spend CPU on every
change of the busy one's for nothing (measured: 0.11-0.14 ms per pod per idle worker, the parse of each entry's
pods and totals). When work comes, `ready` catches up before the first decision: the entries since the pause if
they are fewer than the table holds (nodes + pods), else one load, which reads the state once instead of every
change that led to it. A pause therefore costs a worker at most one load per wake-up, however long it lasted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from hoss.errors import HossError, LedgerUnavailable
from hoss.framework.nodes import NodeTable, stream_position
from hoss.framework.podindex import parse_placed
from hoss.ledger.client import Ledger
from hoss.ledger.replies import decode_nominations, parse_used
from hoss.ledger.results import Change, Nomination
from hoss.model import compact
from hoss.supervise import first_of

log = logging.getLogger(__name__)

CHECK_TRIM_SECONDS = 10.0
CATCH_UP_MIN_ENTRIES = 256
"""A paused feed applies up to this many entries (or as many as its table has nodes and pods) rather than load."""


class NodeFeed:
    """Keeps a `NodeTable` equal to the ledger: ``load`` once, then ``follow`` until cancelled."""

    def __init__(self, ledger: Ledger, table: NodeTable, *, on_room: Callable[[], None] | None = None,
                 batch: int = 2000, block_ms: int = 200, linger_ms: float = 0.0,
                 idle: Callable[[], bool] | None = None, pause_after_seconds: float = 0.0) -> None:
        self.ledger = ledger
        self.table = table
        self.on_room = on_room
        """Called when some node gained room or a node appeared (pods waiting for room may now fit)."""
        self.position = "0-0"
        self.epoch: str | None = None
        self.holds: dict[str, Nomination] = {}
        """The rescheduler's holds in force (``h`` entries; `Ledger.hold_moves`), by key: the pod each is for is
        steered onto its node (`held_node`)."""
        self.loaded = asyncio.Event()
        self.reloads = 0
        self.applied = 0
        self._batch = batch
        self._block_ms = block_ms
        self._linger = linger_ms / 1000
        self.reads = 0
        self._idle = idle
        """True while the owner has nothing to decide or bind: after ``pause_after_seconds`` of it, stop reading."""
        self._pause_after = pause_after_seconds
        self._idle_since: float | None = None
        self.current = asyncio.Event()
        """Set while the feed follows the stream; clear while it is paused (``ready`` wakes it)."""
        self.current.set()
        self._wake = asyncio.Event()
        self.pauses = 0
        self.catch_up_loads = 0

    async def load(self) -> bool:
        """Replace the table with the ledger's nodes; False (table untouched) while the ledger is not ready."""
        snapshot = await self.ledger.load()
        if not snapshot.ready:
            return False
        present = set()
        for name, (spec, used) in snapshot.nodes.items():
            if not spec:
                continue  # registered by a binding before the sync described it: not schedulable yet
            if self._upsert(name, spec):
                self.table.set_totals(name, used)
                present.add(name)
        for name in list(self.table.names):
            if name not in present:
                self.table.remove_node(name)
        self.table.clear_pods()
        for uid, node, meta in snapshot.pods:
            self.table.place_pod(parse_placed(uid, node, meta))
        self.position = snapshot.last_change
        self.table.settle(self.position)
        self.epoch = snapshot.epoch
        # Read after the load: a hold that changed in between is in the stream after this position as well.
        self.holds = {key: hold for key, hold in (await self.ledger.nominations()).items() if hold.pin}
        self.reloads += 1
        self.loaded.set()
        if self.on_room is not None:
            self.on_room()
        log.info("node table loaded from the ledger: %d nodes, epoch %s", len(self.table), snapshot.epoch)
        return True

    def _upsert(self, name: str, spec: str) -> bool:
        try:
            self.table.upsert_node(compact.decode(spec))
        except (HossError, ValueError) as error:
            log.warning("node %s ignored: %s", name, error)
            self.table.remove_node(name)
            return False
        return True

    def apply(self, changes: list[Change]) -> bool:
        """Apply entries in order; True when the ledger was rebuilt and must be loaded again."""
        room = False
        for change in changes:
            self.position = change.id
            self.applied += 1
            if change.kind == "r":
                return True  # the load that follows settles the table
            room = self._apply_one(change) or room
        self.table.settle(self.position)
        if room and self.on_room is not None:
            self.on_room()
        return False

    def _apply_one(self, change: Change) -> bool:
        """Apply one entry; True when it gave room back (usage fell, a host port was freed, a node appeared)."""
        room = False
        for name, value in change.items:
            if change.kind == "u" and name[:2] == "p:":
                node, _, meta = value.partition("\n")
                self.table.place_pod(parse_placed(name[2:], node, meta))
            elif change.kind == "u" and name[:2] == "x:":
                gone = self.table.remove_pod(name[2:])
                room = room or (gone is not None and bool(gone.ports))  # a host port was freed
            elif change.kind == "u":
                if name in self.table:
                    before = self.table.used_of(name)
                    self.table.set_totals(name, parse_used(value))
                    after = self.table.used_of(name)
                    room = room or any(after.get(r, 0) < amount for r, amount in before.items())
            elif change.kind == "s":
                new = name not in self.table
                if value and self._upsert(name, value):
                    room = room or new
                elif not value:
                    self.table.remove_node(name)
            elif change.kind == "d":
                self.table.remove_node(name)
            elif change.kind == "h":
                self._hold(name, value)
        return room

    def _hold(self, key: str, raw: str) -> None:
        if not raw:
            self.holds.pop(key, None)
            return
        for hold in decode_nominations([key, raw]).values():
            self.holds[key] = hold

    def held_nodes(self, uid: str, owner: str, request: Mapping[str, int] | None = None) -> list[str]:
        """The nodes where the rescheduler holds room for this pod: its own hold (by uid), else the holds its
        controller's replacement pods may claim (by owner), only those asking no less than `request` (a replacement
        that asks more cannot claim the hold: it is placed as any pod). Empty: none."""
        own = self.holds.get(uid)
        if own is not None:
            return [own.node]
        if not owner:
            return []
        return sorted({hold.node for hold in self.holds.values() if hold.owner == owner
                       and all(amount <= hold.request.get(resource, 0)
                               for resource, amount in (request or {}).items() if amount > 0)})

    async def step(self) -> None:
        """Read and apply what the stream holds after our position (waiting briefly for it); after a read that
        brought changes, linger (``linger_ms``) so that the next read brings several."""
        changes = await self.ledger.changes(self.position, count=self._batch, block_ms=self._block_ms)
        self.reads += 1
        if self.apply(changes):
            await self.load()
        elif changes and self._linger > 0 and len(changes) < self._batch:
            await asyncio.sleep(self._linger)

    async def ready(self) -> None:
        """Return once the table is current: at once while following; a paused feed catches up first."""
        if not self.current.is_set():
            self._wake.set()
            await self.current.wait()

    def _should_pause(self, now: float) -> bool:
        if self._idle is None or self._pause_after <= 0 or not self._idle():
            self._idle_since = None
            return False
        if self._idle_since is None:
            self._idle_since = now
        return now - self._idle_since >= self._pause_after

    async def _pause(self, stopping: asyncio.Event) -> None:
        """Read nothing until ``ready`` asks (or ``stopping``), then catch up."""
        self.current.clear()
        self.pauses += 1
        log.debug("idle: change stream paused at %s", self.position)
        try:
            await first_of(self._wake.wait(), stopping.wait())
            self._wake.clear()
            self._idle_since = None
            if not stopping.is_set():
                await self.catch_up()
        finally:
            self.current.set()

    async def catch_up(self) -> None:
        """Apply what the stream gained since our position, or load once when that is more than the table holds
        (or the stream no longer holds our position, or the ledger was rebuilt)."""
        await self.check_trimmed()
        limit = max(CATCH_UP_MIN_ENTRIES, len(self.table) + len(self.table.pods))
        changes = await self.ledger.changes(self.position, count=limit)
        if len(changes) >= limit:
            self.catch_up_loads += 1
            await self.load()
        elif self.apply(changes):
            await self.load()

    async def check_trimmed(self) -> None:
        """Load again when the oldest entry in the stream is newer than our position (we missed entries), or when
        the ledger's epoch changed without us seeing the rebuild (Redis lost the stream with its data)."""
        first = await self.ledger.first_change()
        if first is not None and self.position != "0-0" and stream_position(first) > stream_position(self.position):
            log.warning("the change stream no longer holds this worker's position; loading the ledger again")
            await self.load()
            return
        if self.epoch is not None and await self.ledger.epoch() != self.epoch:
            log.warning("the ledger was rebuilt (epoch changed); loading it again")
            await self.load()

    async def follow(self, stopping: asyncio.Event) -> None:
        """Load (waiting for a ready ledger), then apply changes until `stopping` is set. Survives Redis loss."""
        loop = asyncio.get_running_loop()
        last_check = loop.time()
        while not stopping.is_set():
            try:
                if (not self.loaded.is_set() or self.epoch is None) and not await self.load():
                    await asyncio.sleep(0.5)
                    continue
                if self._should_pause(loop.time()):
                    await self._pause(stopping)
                    last_check = loop.time()
                    continue
                await self.step()
                if loop.time() - last_check >= CHECK_TRIM_SECONDS:
                    last_check = loop.time()
                    await self.check_trimmed()
            except LedgerUnavailable as error:
                log.warning("cannot follow the ledger: %s; retrying", error)
                self.epoch = None  # load again once Redis answers: it may have lost its data
                await asyncio.sleep(0.5)
