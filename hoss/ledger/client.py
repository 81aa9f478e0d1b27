"""The ledger: which pod holds which resources on which node, shared by every worker and the webhook, in Redis.

`Ledger` is the one way in: every operation is one Lua script (`hoss.ledger.scripts`), so it is atomic, and each is
idempotent by pod uid. It encodes the arguments (`hoss.ledger.arguments`), runs the script and decodes the flat reply
into typed results (`hoss.ledger.replies`, `hoss.ledger.results`); the keys are laid out in `hoss.ledger.keys`.

Invariants, kept by the scripts alone (clients never write these keys):

- A pod uid holds resources on at most one node: its single entry ``{hoss}:pod:<uid>``.
- ``used`` of a node is the per-resource sum of the requests of its entries, assumed and bound.
- After any reserve, reserve_gang or confirm, ``used[r] <= alloc[r]`` for every resource the call added to; a
  resource a node does not list has 0 allocatable. Only ``bind`` (the apiserver's truth) and a shrinking
  ``sync_node`` can leave a node overcommitted, and then nothing is admitted that grows the excess.
- Entries are in one of three states. ``assumed``: a worker's reservation, with a deadline on the Redis server's
  clock after which ``expire`` drops it; its worker may release it (``release_assumed``, ``release_owner``) or a
  later reservation of the same pod may move it. ``admitted``: the webhook allowed a binding of the pod, or its
  creation with spec.nodeName; it never expires, never moves and no worker releases it: it stays counted until
  the sync sees the pod bound (it becomes ``bound``) or proves by a GET that the write failed or the pod is gone
  (``verify_due`` / ``drop_admitted``). ``bound``: the apiserver's truth, written only by the sync.
- An assumed or admitted entry never holds less than its pod asks for when the webhook allows a write of it: a
  binding that asks more than the entry (the pod was resized since) is fit-checked for the growth, and so is a
  resize of a pod not bound yet that has an entry (``confirm``, ``resize``).
- Every write except ``rebuild`` refuses to run while ``{hoss}:ready`` is missing (Redis restarted empty or was
  flushed): the ledger fails closed until it is rebuilt from the apiserver.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Self

from redis.asyncio import Redis

from hoss.ledger.arguments import (
    MOVE_PRIORITY,
    AttachSlots,
    BatchPod,
    BoundPod,
    ElasticQuota,
    GangMember,
    MoveHold,
    NodeRow,
    Placement,
    Via,
    batch_payload,
    label_args,
    move_holds_payload,
    placement_args,
    placements_args,
    quota_args,
    rebuild_args,
    ttl_ms,
    vector_args,
)
from hoss.ledger.confirm import ConfirmBatcher
from hoss.ledger.connection import LedgerClient, ScriptClient, StreamReader, redis_call
from hoss.ledger.fence import WriteFence
from hoss.ledger.keys import CHANGES_KEY, EPOCH_KEY, KEY_PREFIX, READY_KEY, STAMP_KEY, STATS_KEY, reservation_key
from hoss.ledger.replies import (
    as_text,
    as_texts,
    decode_batch_reply,
    decode_bind_reply,
    decode_changes,
    decode_confirm_reply,
    decode_entries_reply,
    decode_hold_moves_reply,
    decode_load_reply,
    decode_nominations,
    decode_quota_drift,
    decode_quotas_reply,
    decode_refusals,
    decode_reservation_owners,
    decode_reserve_reply,
    decode_snapshot_reply,
    decode_used_drift,
    decode_verify_batch,
    ready_or_raise,
)
from hoss.ledger.results import (
    AdmittedEntry,
    BatchResult,
    Change,
    Confirmed,
    ConfirmResult,
    Conflict,
    GangReserved,
    GangResult,
    LedgerLoad,
    LedgerNotReady,
    LedgerSnapshot,
    Nomination,
    Overcommit,
    PodEntry,
    QuotaReport,
    Rebuilt,
    ReservationRefused,
    ReservationShares,
    Reserved,
    ReserveResult,
    UnknownNode,
    VerifyBatch,
)
from hoss.ledger.scripts import ScriptRunner
from hoss.model.devices.counters import CounterDraw
from hoss.model.resources import ResourceVector

logger = logging.getLogger(__name__)

GROWTH_MEMORY_SECONDS = 600.0
"""How long the growth a resize allowed a pod without a node is remembered (see 'Growth' in common.lua): far longer
than a review takes to be written and the resolver's watch to deliver the resized pod, so no binding is judged from
a view of the pod older than the resize while the growth is forgotten."""


class Ledger:
    """The Redis ledger. Every method is one atomic script call; Redis errors raise `LedgerUnavailable`."""

    def __init__(self, client: LedgerClient, *, owns_client: bool = False, scripts: ScriptClient | None = None,
                 reads: StreamReader | None = None, fenced: bool = False) -> None:
        """``client`` is redis-py's client or a `hoss.ledger.redisclient.PipelinedRedis` (the webhook's: a fraction
        of redis-py's cost per call). ``scripts``, when given, runs the ledger's scripts (every operation but the
        change stream's reads and a few pipelined reads), as the workers run them on a `PipelinedRedis` of their
        own. ``reads``, when given, is a connection of its own for `changes` (a blocking read would hold up every
        other call on a shared one). Both stay their owner's to close. ``fenced``: every script call carries this
        ledger's write fence (`hoss.ledger.fence`), so a Redis that lost writes made through it is noticed at the
        next call (and by `check_fence`), marked not ready and rebuilt by the sync."""
        self._redis = client
        self._scripts = ScriptRunner(client if scripts is None else scripts, fence=WriteFence() if fenced else None)
        self._reads = client if reads is None else reads
        self._owns_client = owns_client
        self._confirms = ConfirmBatcher(self._scripts.run)

    @classmethod
    def from_url(cls, url: str) -> Ledger:
        """A ledger on its own connection pool to `url` (``redis://host:port/db``), closed by `close`."""
        return cls(Redis.from_url(url, decode_responses=True), owns_client=True)

    async def close(self) -> None:
        """Close the connection pool if `from_url` made it; a client passed in stays its owner's to close."""
        if self._owns_client:
            await self._redis.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- admission -------------------------------------------------------------------------------------------

    async def reserve(
        self, *, uid: str, pod: str, node: str, request: Mapping[str, int], owner: str, ttl_seconds: float
    ) -> ReserveResult:
        """Hold `request` on `node` for `uid` as an assumed entry until the deadline.

        Already assumed on `node`: the deadline (and request, owner) are refreshed. Assumed on another node: it
        moves here if it fits, else the old reservation stays. Bound: Reserved if bound here, else HeldElsewhere.
        """
        placement = Placement(uid=uid, pod=pod, node=node, request=request)
        reply = await self._scripts.run("reserve", [owner, ttl_ms(ttl_seconds), 1, *placement_args(placement)])
        result = decode_reserve_reply(reply)
        if isinstance(result, GangReserved):
            logger.debug("reserved %s on %s for %s", pod, node, owner)
            return Reserved(node, change=result.change)
        return result

    async def reserve_gang(self, *, members: Sequence[GangMember], owner: str, ttl_seconds: float,
                           position: str = "", inter_pod_keys: Sequence[str] = ()) -> GangResult:
        """Reserve every member on its node, or nothing; members sharing a node must fit together. With the
        change-stream `position` the members were planned at, and each member's `inter_pod_keys` ('k1,k2', in
        the members' order), a member whose inter-pod domains changed since refuses the whole gang (a
        `Conflict` naming the domain), as `reserve_batch` refuses a single pod."""
        uids = [member.uid for member in members]
        if len(set(uids)) != len(uids):
            raise ValueError(f"gang members must have distinct uids, got {uids}")
        if position and len(inter_pod_keys) != len(members):
            raise ValueError("inter_pod_keys needs one entry per member")
        args: list[str | int] = [owner, ttl_ms(ttl_seconds), len(members), *placements_args(members)]
        if position:
            args.extend([position, *inter_pod_keys])
        result = decode_reserve_reply(await self._scripts.run("reserve", args))
        if isinstance(result, GangReserved):
            logger.info("reserved gang of %d pods for %s", len(members), owner)
            return GangReserved(tuple(uids), change=result.change)
        return result

    async def reserve_batch(self, pods: Sequence[BatchPod], *, owner: str, ttl_seconds: float) -> list[BatchResult] \
            | LedgerNotReady:
        """Reserve each pod on the first of its candidates it fits (independently, in order), in one call."""
        if not pods:
            return []
        return decode_batch_reply(
            await self._scripts.run("reserve_batch", [owner, ttl_ms(ttl_seconds), batch_payload(pods)]))

    async def confirm(
        self, *, uid: str, pod: str, node: str, request: Mapping[str, int] | None, owner: str,
        verify_after_seconds: float, dry_run: bool = False, via: Via = "binding", ports: str = "", meta: str = "",
        limit_owner: bool = False,
    ) -> ConfirmResult:
        """Allow a binding of `uid` to `node` (or the creation of a pod on it, `via` "create"): its own
        reservation, or a foreign one that fits. Either way the entry becomes ``admitted`` (held for `owner` when
        new): it stays counted until the sync sees the pod bound or proves the write failed, which it first looks
        at `verify_after_seconds` later. `dry_run`: the same answer, nothing written.

        Without a `request` only an existing entry can confirm; no entry answers `NeedRequest`. `meta`
        (`hoss.model.compact.pod_meta`) is kept in a new entry; its priority decides which nominations it must leave
        room for. `limit_owner` (a foreign user's create): a new entry is refused (`UnconfirmedCreates`) when
        `owner`'s admitted creates not yet settled by the sync would hold, with it, more of a resource than the
        node's allocatable.
        """
        placement = Placement(uid=uid, pod=pod, node=node, request=request or {}, ports=ports, meta=meta)
        has_request = 0 if request is None else 1
        result = decode_confirm_reply(
            await self._confirms.confirm([owner, ttl_ms(verify_after_seconds), has_request, int(dry_run), via,
                                          int(limit_owner), *placement_args(placement)])
        )
        if isinstance(result, Confirmed) and result.foreign:
            logger.info("confirmed foreign binding of %s to %s for %s", pod, node, owner)
        return result

    # -- nominations (preemption) ----------------------------------------------------------------------------

    async def nominate(self, *, uid: str, node: str, priority: int, request: Mapping[str, int],
                       ttl_seconds: float) -> str:
        """Hold room on `node` for the preempting pod `uid` for `ttl_seconds` (replacing its earlier nomination).

        Returns "nominated", "assumed" or "bound" (the pod holds an entry already: nothing is held), or
        "unknown_node"."""
        reply = ready_or_raise(await self._scripts.run(
            "nominate", [uid, node, int(priority), ttl_ms(ttl_seconds), *vector_args(request)]))
        return as_text(reply[0])

    async def promise_claims(self, *, uid: str, claims: Sequence[str], ttl_seconds: float) -> tuple[str, str] | None:
        """Promise the ReadWriteOncePod `claims` ('<namespace>/<claim>') to pod `uid` for `ttl_seconds`, all or
        none (hoss/ledger/lua/promise_claims.lua): None when promised, else (claim, uid of the pod holding it)."""
        return await self._promise(uid=uid, keys=[f"rwop:{claim}" for claim in claims], ttl_seconds=ttl_seconds)

    async def unpromise_claims(self, *, uid: str, claims: Sequence[str]) -> int:
        """Drop the promises of `claims` made to `uid` (its binding failed); how many were dropped."""
        return await self._unpromise(uid=uid, keys=[f"rwop:{claim}" for claim in claims])

    async def promise_devices(self, *, uid: str, devices: Sequence[str], ttl_seconds: float) -> tuple[str, str] | None:
        """Promise the DRA `devices` ('<driver>/<pool>/<device>') to pod `uid` for `ttl_seconds`, all or none:
        None when promised, else (device, uid of the pod holding it)."""
        return await self._promise(uid=uid, keys=[f"device:{device}" for device in devices], ttl_seconds=ttl_seconds)

    async def unpromise_devices(self, *, uid: str, devices: Sequence[str]) -> int:
        """Drop the promises of `devices` made to `uid` (its binding failed); how many were dropped."""
        return await self._unpromise(uid=uid, keys=[f"device:{device}" for device in devices])

    async def promise_counters(self, *, uid: str, draws: Sequence[CounterDraw],
                               ttl_seconds: float) -> tuple[str, str, str] | None:
        """Take what a pod's DRA devices draw on shared counters for `ttl_seconds`, all or none
        (hoss/ledger/lua/promise_counters.lua): None when taken, else (counter set, counter, uid of a pod whose
        promise it would overdraw with)."""
        args: list[str | int] = [uid, ttl_ms(ttl_seconds), len(draws)]
        for draw in draws:
            args += [draw.key, len(draw.counters)]
            for counter in draw.counters:
                args += list(counter)
            args += [len(draw.seen_devices), *draw.seen_devices, len(draw.mine_devices)]
            for device, amounts in draw.mine_devices:
                args += [device, amounts]
        texts = as_texts(ready_or_raise(await self._scripts.run("promise_counters", args)))
        if texts[0] == "promised":
            return None
        return texts[1].split(":counters:", 1)[1], texts[2], texts[3]

    async def unpromise_counters(self, *, uid: str, keys: Sequence[str]) -> int:
        """Drop what `promise_counters` took for `uid` on the counter sets `keys` ('<driver>/<pool>/<set>')."""
        reply = ready_or_raise(await self._scripts.run("unpromise_counters", [uid, len(keys), *keys]))
        return int(reply[1])

    async def _promise(self, *, uid: str, keys: Sequence[str], ttl_seconds: float) -> tuple[str, str] | None:
        reply = ready_or_raise(await self._scripts.run(
            "promise_claims", [uid, ttl_ms(ttl_seconds), len(keys), *keys]))
        texts = as_texts(reply)
        if texts[0] == "promised":
            return None
        return texts[1].split(":", 1)[1], texts[2]

    async def _unpromise(self, *, uid: str, keys: Sequence[str]) -> int:
        reply = ready_or_raise(await self._scripts.run("unpromise_claims", [uid, len(keys), *keys]))
        return int(reply[1])

    async def promise_attach(self, *, uid: str, node: str, drivers: Sequence[AttachSlots],
                             ttl_seconds: float) -> tuple[str, int, int] | None:
        """Promise pod `uid` the attach slots its volumes take on `node`, per CSI driver, for `ttl_seconds`
        (hoss/ledger/lua/promise_attach.lua): None when promised, else (driver, volumes counted, limit)."""
        args: list[str | int] = [uid, ttl_ms(ttl_seconds), node, len(drivers)]
        for slots in drivers:
            args += [slots.driver, slots.limit, len(slots.attached), *slots.attached, len(slots.handles),
                     *slots.handles]
        texts = as_texts(ready_or_raise(await self._scripts.run("promise_attach", args)))
        if texts[0] == "promised":
            return None
        return texts[1], int(texts[2]), int(texts[3])

    async def unpromise_attach(self, *, uid: str, node: str, drivers: Sequence[str]) -> int:
        """Drop the attach slots promised to `uid` on `node` (its binding failed); how many were dropped."""
        reply = ready_or_raise(await self._scripts.run("unpromise_attach", [uid, node, len(drivers), *drivers]))
        return int(reply[1])

    async def promise_disks(self, *, uid: str, node: str, disks: Sequence[tuple[str, str, bool]],
                            ttl_seconds: float) -> tuple[str, str] | None:
        """Promise pod `uid` its in-tree `disks` (kind, id, read-only) on `node` for `ttl_seconds`
        (hoss/ledger/lua/promise_disks.lua): None when promised, else (``kind/id``, uid of the pod holding it)."""
        args: list[str | int] = [uid, ttl_ms(ttl_seconds), node, len(disks)]
        for kind, ident, read_only in disks:
            args += [kind, ident, 1 if read_only else 0]
        texts = as_texts(ready_or_raise(await self._scripts.run("promise_disks", args)))
        if texts[0] == "promised":
            return None
        return texts[1], texts[2]

    async def unpromise_disks(self, *, uid: str, node: str) -> int:
        """Drop the disks promised to `uid` on `node` (its binding failed); how many were dropped."""
        return int(ready_or_raise(await self._scripts.run("unpromise_disks", [uid, node]))[1])

    async def unnominate(self, uid: str) -> bool:
        """End the nomination of `uid`; False when it had none."""
        return int(ready_or_raise(await self._scripts.run("unnominate", [uid]))[1]) == 1

    async def hold_moves(self, holds: Sequence[MoveHold], *, ttl_seconds: float,
                         priority: int = MOVE_PRIORITY) -> Conflict | UnknownNode | str | None:
        """Hold every room of a move plan for `ttl_seconds`, all or nothing (hoss/ledger/lua/hold_moves.lua).

        None when held; a Conflict or UnknownNode naming the first hold that does not fit; or the node of a
        pending pod that already holds an entry."""
        reply = await self._scripts.run("hold_moves", [ttl_ms(ttl_seconds), int(priority), move_holds_payload(holds)])
        return decode_hold_moves_reply(ready_or_raise(reply))

    async def nominations(self) -> dict[str, Nomination]:
        """The nominations in force, by uid."""
        return decode_nominations(ready_or_raise(await self._scripts.run("nominations", []))[1:])

    # -- Reservations: room held for pods that do not exist yet ----------------------------------------------

    async def hold_reservation(self, *, uid: str, name: str, candidates: Sequence[str], request: Mapping[str, int],
                               meta: str = "", owner: str, ttl_seconds: float) -> BatchResult | LedgerNotReady:
        """Step 1 of holding room for a future pod (a Koordinator Reservation `name` with metadata.uid `uid`):
        an assumed entry on the first of `candidates` it fits, fit-checked like any pod's reservation (nominations
        included), expiring after `ttl_seconds` unless step 2 follows. Step 2, once the Reservation's status names
        the node (phase Available), is `keep_reservation`; the sync keeps it from then on and releases it when the
        Reservation leaves Available or is deleted. An owner pod takes the room by naming `uid` in
        `BatchPod.reservation`."""
        results = await self.reserve_batch(
            [BatchPod(uid=uid, pod=reservation_key(name), digest="", candidates=candidates, request=request,
                      meta=meta)], owner=owner, ttl_seconds=ttl_seconds)
        return results if isinstance(results, LedgerNotReady) else results[0]

    async def keep_reservation(self, *, uid: str, name: str, node: str, request: Mapping[str, int],
                               meta: str = "") -> None:
        """Step 2: the Reservation's status names `node`, so its entry is the apiserver's truth (bound, never
        expires); the same write the sync makes when it sees the Reservation Available."""
        await self.bind_many([Placement(uid=uid, pod=reservation_key(name), node=node, request=request, meta=meta)])

    async def reservation_owners(self, uids: Sequence[str]) -> dict[str, ReservationShares]:
        """What each Reservation's entry still holds and the owner pods holding a share of it (only those whose
        entry is there are answered)."""
        if not uids:
            return {}
        return decode_reservation_owners(uids, await self._scripts.run("reservation_owners", [len(uids), *uids]))

    async def resize(
        self, *, uid: str, pod: str, node: str, request: Mapping[str, int], owner: str,
        verify_after_seconds: float, grown_ttl_seconds: float = GROWTH_MEMORY_SECONDS, dry_run: bool = False,
        check_after_seconds: float = 0.0,
    ) -> ConfirmResult:
        """Judge an in-place resize of `uid` on `node` to `request`: its entry takes the new request when the
        growth fits (an entry that did not exist yet is held as admitted). A pod not bound yet (`node` ""): judged
        on the node of its entry when it has one (which grows to the larger of both requests), and the growth
        remembered for `grown_ttl_seconds`, so a binding judged from an older view of the pod counts it
        (`Confirmed` with node "" when it has no entry). `dry_run`: the answer only. `check_after_seconds` > 0 (a
        review nobody authenticated): an entry grown is due for `resized_due` that much later."""
        placement = Placement(uid=uid, pod=pod, node=node, request=request)
        return decode_confirm_reply(
            await self._scripts.run("resize", [owner, ttl_ms(verify_after_seconds), int(dry_run),
                                               ttl_ms(grown_ttl_seconds),
                                               ttl_ms(check_after_seconds) if check_after_seconds > 0 else 0,
                                               *placement_args(placement)])
        )

    # -- the apiserver's truth -------------------------------------------------------------------------------

    async def bind(self, *, uid: str, pod: str, node: str, request: Mapping[str, int]) -> None:
        """Record that `uid` runs on `node` (spec.nodeName is set): its entry becomes bound there, unchecked (a
        Reservation entering the ledger is checked: see `bind_many`)."""
        placement = Placement(uid=uid, pod=pod, node=node, request=request)
        reply = ready_or_raise(await self._scripts.run("bind", placement_args(placement)))
        if as_text(reply[0]) == "refused":
            logger.warning("%s holds no room on %s: %s %s wanted, %s free", pod, node, *as_texts(reply[1:4]))
            return
        previous_node, previous_state = as_text(reply[1]), as_text(reply[2])
        if not previous_node:
            logger.info("bound %s to %s without a reservation", pod, node)
        elif previous_node != node:
            logger.warning("bound %s to %s, moved from its %s entry on %s", pod, node, previous_state, previous_node)

    async def bind_many(self, placements: Sequence[Placement]) -> list[Overcommit | ReservationRefused]:
        """`bind` for many pods in one call (a uid listed twice ends on its last placement). Returns the
        placements that overcommitted their node (counted in ``{hoss}:stats`` too), and the Reservations refused
        room: one entering the ledger (no entry of it on its node yet) holds room only if it fits there."""
        if not placements:
            return []
        reply = await self._scripts.run("bind_many", [len(placements), *placements_args(placements)])
        return decode_bind_reply(ready_or_raise(reply))

    async def release_many(self, uids: Sequence[str]) -> int:
        """`release` for many uids in one call; returns how many had an entry."""
        if not uids:
            return 0
        return int(ready_or_raise(await self._scripts.run("release_many", [len(uids), *uids]))[1])

    async def release(self, uid: str) -> bool:
        """Drop the entry of `uid` wherever it is (pod deleted or finished); False when there was none."""
        reply = ready_or_raise(await self._scripts.run("release", [uid, "", "", 0]))
        return int(reply[1]) == 1

    async def release_assumed(self, *, uid: str, node: str, answered: bool = False) -> bool:
        """Drop the reservation of `uid` on `node` (its binding failed); an admitted or bound entry, or one
        elsewhere, stays.

        A binding the webhook admitted may have succeeded even when its binder saw an error (a timeout, a reset
        connection, a 409 for a duplicate): dropping it would let the node be oversold, so only the sync drops an
        admitted entry, on proof. `answered`: the apiserver answered the binding with an error, so the write is
        over; an admitted entry is then checked by the sync at once. False when nothing was dropped.
        """
        reply = ready_or_raise(await self._scripts.run("release", [uid, node, "assumed", int(answered)]))
        return int(reply[1]) == 1

    async def release_owner(self, owner: str) -> int:
        """Drop every assumed entry held by `owner` (a worker shutting down); returns how many."""
        uids = as_texts(ready_or_raise(await self._scripts.run("release_owner", [owner]))[1:])
        if uids:
            logger.info("released %d reservations of %s", len(uids), owner)
        return len(uids)

    async def expire(self) -> list[str]:
        """Drop assumed entries whose deadline passed on the Redis clock; returns their uids."""
        uids = as_texts(ready_or_raise(await self._scripts.run("expire", []))[1:])
        if uids:
            logger.warning("expired %d reservations: %s", len(uids), ", ".join(uids))
        return uids

    async def verify_due(self, *, limit: int = 256, retry_seconds: float = 5.0) -> VerifyBatch:
        """The admitted entries whose check is due, at most `limit`; each comes round again `retry_seconds`
        later unless `drop_admitted` or a bind settles it first."""
        return decode_verify_batch(
            ready_or_raise(await self._scripts.run("verify_due", [limit, ttl_ms(retry_seconds)])))

    async def resized_due(self, *, limit: int = 256) -> list[str]:
        """The uids of entries an unauthenticated resize grew whose check is due, at most `limit`, taken out of line
        (see `resize`): the sync sets each back to its pod's request as the apiserver has it."""
        return [as_text(uid) for uid in ready_or_raise(await self._scripts.run("resized_due", [limit]))[1:]]

    async def drop_admitted(self, entry: AdmittedEntry) -> bool:
        """Drop `entry` on proof that its write failed or its pod is gone, if it is still that admitted entry."""
        reply = ready_or_raise(await self._scripts.run("drop_admitted", [entry.uid, entry.node, entry.admitted_ms]))
        dropped = int(reply[1]) == 1
        if dropped:
            logger.info("dropped the admitted entry of %s on %s: its %s did not happen", entry.pod, entry.node,
                        entry.via)
        return dropped

    async def stats(self) -> dict[str, str]:
        """The counters in ``{hoss}:stats`` (overcommits, audit_drift and the last of each)."""
        reply = await redis_call(self._redis.hgetall(STATS_KEY))
        return {as_text(k): as_text(v) for k, v in (reply or {}).items()}

    async def count(self, counter: str, found: int, what: str) -> None:
        """Add `found` to the counter `counter` in ``{hoss}:stats`` and keep `what` under ``last_<counter>``."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hincrby(STATS_KEY, counter, found)
        pipe.hset(STATS_KEY, f"last_{counter}", what[:1000])
        await redis_call(pipe.execute())

    async def tick(self) -> tuple[str | None, int]:
        """The epoch and the next value of the sync's stamp (``{hoss}:stamp``, incremented by every call), read
        together. The syncing replica expects each stamp to be one more than the last: a Redis that comes back
        from an older copy (a restart from a snapshot, a failover to a lagging replica) answers a smaller one, or
        another epoch, and is rebuilt instead of trusted."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(EPOCH_KEY)
        pipe.incr(STAMP_KEY)
        epoch, stamp = await redis_call(pipe.execute())
        return (None if epoch is None else as_text(epoch)), int(stamp)

    async def sync_node(
        self, *, node: str, allocatable: Mapping[str, int], labels: Mapping[str, str] | None = None,
        spec: str = "",
    ) -> None:
        """Register `node` or replace its allocatable, labels and compact description (`spec`, JSON); its
        entries stay. Workers learn the change from the change stream."""
        reply = ready_or_raise(
            await self._scripts.run("sync_node", [node, *vector_args(allocatable), *label_args(labels or {}), spec])
        )
        if int(reply[1]):
            logger.info("node %s joined the ledger", node)

    async def remove_node(self, node: str) -> list[str]:
        """Forget `node` and drop every entry on it; returns the dropped uids."""
        uids = as_texts(ready_or_raise(await self._scripts.run("remove_node", [node]))[1:])
        logger.info("node %s left the ledger, dropping %d entries", node, len(uids))
        return uids

    async def rebuild(
        self,
        *,
        nodes: Iterable[NodeRow],
        bound: Iterable[BoundPod],
    ) -> Rebuilt:
        """Replace nodes and bound entries with the apiserver's truth in one step and mark the ledger ready.

        Assumed entries survive when their node is still listed and their uid is not in `bound`; every used total
        is recomputed. A Reservation in `bound` whose entry was not on its node before enters the ledger only if it
        fits (as in `bind_many`). Returns the new epoch and the Reservations refused.
        """
        epoch = secrets.token_hex(8)
        node_list, bound_list = list(nodes), list(bound)
        reply = await self._scripts.run("rebuild", rebuild_args(epoch, node_list, bound_list))
        logger.info("rebuilt the ledger: %d nodes, %d bound pods, epoch %s", len(node_list), len(bound_list), epoch)
        return Rebuilt(epoch=epoch, refused=tuple(decode_refusals(as_texts(reply[2:]))))

    async def set_quotas(self, quotas: Iterable[ElasticQuota], *, deleted: Iterable[str] = (),
                         replace: bool = False) -> int:
        """Write elastic quotas (and drop those of the `deleted` namespaces); `replace`: `quotas` are all of them,
        every other namespace loses its quota. Runs whether or not the ledger is ready. Returns how many
        namespaces have a quota."""
        reply = await self._scripts.run("set_quotas", quota_args(quotas, deleted=deleted, replace=replace))
        return int(as_text(reply[1]))

    async def quotas(self) -> QuotaReport:
        """Every elastic quota with its namespace's use, read at one instant."""
        return decode_quotas_reply(await self._scripts.run("quotas", []))

    async def quota_drift(self) -> list[str]:
        """Where, at one instant, a quota namespace's used total (or the quota namespaces' sum) differs from the
        sum of its entries: '<ns>/<resource>: kept K, entries S' ('sum/<resource>' for the sum); [] when none."""
        return decode_quota_drift(await self._scripts.run("quota_audit", []))

    async def used_drift(self) -> list[str]:
        """Where, at one instant, a node's used total of a resource differs from the sum of its entries' requests:
        'node <n> <resource>: used K, entries S'; [] when none."""
        return decode_used_drift(await self._scripts.run("used_audit", []))

    async def check_fence(self) -> bool:
        """The write fence's check alone (a fenced ledger: Redis lost none of its writes, else the ledger is marked
        not ready, see `hoss.ledger.fence`); whether the ledger is ready."""
        return int(as_text((await self._scripts.run("fence", []))[1])) == 1

    async def mark_not_ready(self) -> None:
        """Make every write but rebuild refuse until the next rebuild (e.g. while the sync re-lists)."""
        await redis_call(self._redis.delete(READY_KEY))

    async def is_ready(self) -> bool:
        return int(await redis_call(self._redis.exists(READY_KEY))) == 1

    async def epoch(self) -> str | None:
        value = await redis_call(self._redis.get(EPOCH_KEY))
        return None if value is None else as_text(value)

    # -- reading ---------------------------------------------------------------------------------------------

    async def snapshot(self) -> LedgerSnapshot:
        """One consistent view of every node's allocatable, used totals, entry counts and labels."""
        return decode_snapshot_reply(await self._scripts.run("snapshot", [0]))

    async def node_usage(self, nodes: Sequence[str]) -> dict[str, tuple[ResourceVector, ResourceVector]]:
        """(alloc, used) of each named node the ledger knows, read at one instant; unknown names are left out."""
        if not nodes:
            return {}
        snapshot = decode_snapshot_reply(await self._scripts.run("snapshot", [len(nodes), *nodes]))
        return {name: (node.alloc, node.used) for name, node in snapshot.nodes.items()}

    async def load(self) -> LedgerLoad:
        """Every node's description and used totals, and the change-stream id to follow from, at one instant."""
        return decode_load_reply(await self._scripts.run("load", []))

    async def changes(self, after: str, *, count: int = 2000, block_ms: int | None = None) -> list[Change]:
        """Change-stream entries after id `after` (at most `count`; waits up to `block_ms` for the first)."""
        return decode_changes(
            await redis_call(self._reads.xread({CHANGES_KEY: after}, count=count, block=block_ms)))

    async def first_change(self) -> str | None:
        """The id of the oldest entry still in the change stream (older ones were trimmed), or None."""
        reply = await redis_call(self._redis.xrange(CHANGES_KEY, count=1))
        return as_text(reply[0][0]) if reply else None

    async def bound_nodes(self, uids: Sequence[str]) -> dict[str, str]:
        """uid -> node of those `uids` whose entry is bound (the apiserver has them on a node)."""
        if not uids:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for uid in uids:
            pipe.hmget(f"{KEY_PREFIX}:pod:{uid}", ["state", "node"])
        replies = await redis_call(pipe.execute())
        return {uid: as_text(node) for uid, (state, node) in zip(uids, replies, strict=True)
                if state is not None and as_text(state) == "bound"}

    async def entries(self) -> list[PodEntry]:
        """Every pod entry, read at one instant, ordered by node and uid (for audits, status pages and tests)."""
        return decode_entries_reply(await self._scripts.run("entries", []))
