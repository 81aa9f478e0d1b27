"""The ledger: which pod holds which resources on which node, shared by every worker and the webhook, in Redis.

Every operation is one Lua script (``hoss/ledger/lua/<operation>.lua``, with ``common.lua`` prepended), so it is
atomic; each is idempotent by pod uid. This module encodes arguments, runs the script and decodes its flat reply
into typed results; the decoding functions are pure.

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
- Every write except ``rebuild`` refuses to run while ``{hoss}:ready`` is missing (Redis restarted empty or was
  flushed): the ledger fails closed until it is rebuilt from the apiserver.

Key layout (one hash tag, so every script's keys are in one slot and it runs on Redis Cluster too)::

    {hoss}:ready                   "1" once rebuilt; missing means not ready
    {hoss}:epoch                   random id of the last rebuild
    {hoss}:nodes                   set of node names
    {hoss}:node:<name>:alloc       hash resource -> allocatable (base units)
    {hoss}:node:<name>:used        hash resource -> sum of the requests of its entries (zero fields removed)
    {hoss}:node:<name>:labels      hash label -> value
    {hoss}:node:<name>:assumed     set of uids with an assumed entry on the node
    {hoss}:node:<name>:admitted    set of uids with an admitted entry on the node
    {hoss}:node:<name>:bound       set of uids with a bound entry on the node
    {hoss}:pod:<uid>               hash node, pod, state (assumed|admitted|bound), owner, deadline (ms, assumed
                                   only), admitted (ms), via (binding|create|resize) and answered (admitted only),
                                   r:<resource> -> request (base units), ports (host ports, if any), meta
                                   (`hoss.model.compact.pod_meta`: namespace, labels, host ports; for workers)
    {hoss}:node:<name>:ports       hash '<protocol>/<port>' and '<protocol>/<ip>/<port>' -> how many entries on
                                   the node hold that host port; reserve and reserve_batch refuse a conflict
    {hoss}:assumed                 zset uid by deadline (ms)
    {hoss}:verify                  zset uid of admitted entries by when the sync looks at them again (ms)
    {hoss}:stats                   hash overcommits (bound entries the apiserver put on a node without room),
                                   audit_drift (entries the audit repaired), stale_ledger (stale copies of
                                   the ledger detected), each with last_<counter>
    {hoss}:stamp                   counter the syncing replica increments on every watchdog tick (see tick)
    {hoss}:node:<name>:spec        the node's compact description (JSON, `hoss.model.compact.compact_node`)
    {hoss}:changes                 stream of changes (used totals, pods placed and removed, node descriptions,
                                   removals, rebuilds) that workers follow instead of re-reading nodes; see
                                   common.lua for the entries
    {hoss}:podver                  hash uid -> digest or "gone": the dispatcher's word that a queued pod changed
                                   or left; a reservation of another version answers "stale"
    {hoss}:nominated               hash uid -> JSON (node, priority, deadline, request): room held for a preempting
                                   pod; new entries of lower priority must fit beside it (common.lua, Nominations)
    {hoss}:node:<name>:nominated   set of the uids nominated to the node
    {hoss}:quotas                  set of the namespaces with an elastic quota (scheduler-plugins' ElasticQuota)
    {hoss}:quota:ns:<ns>           hash min:<resource> / max:<resource> -> amount (base units)
    {hoss}:nsused                  hash '<ns>/<resource>' -> sum of the requests of the namespace's entries
    {hoss}:quota:sum:used, :sum:min  hash resource -> sum over the quota namespaces of used, of min
                                   (see 'Elastic quotas' in common.lua: the rule every entry-creating script checks)
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.resources
import logging
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, Self

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError, ResponseError

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.ledger.redisclient import PipelinedRedis
from hoss.model.resources import MAX_UNITS, ResourceVector

logger = logging.getLogger(__name__)

KEY_PREFIX: Final = "{hoss}"
READY_KEY: Final = f"{KEY_PREFIX}:ready"
EPOCH_KEY: Final = f"{KEY_PREFIX}:epoch"
NOMINATED_KEY: Final = f"{KEY_PREFIX}:nominated"
"""Room held for preempting pods (see 'Nominations' in hoss/ledger/lua/common.lua); the dispatcher ends the
nomination of a pod that left the pending set."""

EntryState = Literal["assumed", "admitted", "bound"]
STATS_KEY: Final = f"{KEY_PREFIX}:stats"
STAMP_KEY: Final = f"{KEY_PREFIX}:stamp"
CONFIRM_BATCH: Final = 64
"""Most confirms the webhook's concurrent reviews send in one script call (Ledger._gathered_confirm)."""
Via = Literal["binding", "create", "resize"]
"""What the webhook admitted: a binding, the creation of a pod with spec.nodeName, or an in-place resize."""


@dataclass(frozen=True)
class Reserved:
    """The pod holds an assumed entry on `node` (new, refreshed or moved there), or is already bound there."""

    node: str
    consumed: bool = False
    """The pod took a share of the room of the Reservation it named (`BatchPod.reservation`); the share goes back
    to the Reservation when the pod's entry goes."""
    change: str = field(default="", compare=False)
    """The id of the change-stream entry the reserving call wrote ('' when unknown): its totals count the pod."""


@dataclass(frozen=True)
class ReservationOwner:
    """An owner pod holding a share of a Reservation's room (`Ledger.reservation_owners`)."""

    uid: str
    pod: str
    """namespace/name"""
    node: str
    state: str
    share: Mapping[str, int]


@dataclass(frozen=True)
class ReservationShares:
    """A Reservation's entry: the room it still holds and its owners' shares."""

    room: Mapping[str, int]
    owners: tuple[ReservationOwner, ...]


@dataclass(frozen=True)
class GangReserved:
    """Every member of the gang holds an entry on its node."""

    uids: tuple[str, ...]
    change: str = field(default="", compare=False)
    """The id of the change-stream entry the call wrote: its totals count every member."""


@dataclass(frozen=True)
class Overcommit:
    """The sync bound a pod on a node that had no room for it (the apiserver's truth, recorded and counted)."""

    pod: str
    node: str
    what: str
    """e.g. 'cpu used 5000 of 4000'"""


@dataclass(frozen=True)
class AdmittedEntry:
    """An admitted entry the sync should check: does the pod run on the node, or did the admitted write fail?"""

    uid: str
    node: str
    pod: str
    """namespace/name"""
    via: str
    admitted_ms: int
    """Redis time of the (last) admission"""
    answered: bool
    """the binder saw the apiserver answer its binding with an error: the write is over"""


@dataclass(frozen=True)
class VerifyBatch:
    """`Ledger.verify_due`: the Redis time of the read and the entries due."""

    now_ms: int
    entries: list[AdmittedEntry]


@dataclass(frozen=True)
class Confirmed:
    """The binding may go ahead. `foreign`: there was no reservation, so the call fit-checked and added one."""

    node: str
    foreign: bool


@dataclass(frozen=True)
class Conflict:
    """`resource` does not fit on `node`: the pod (or gang members on that node) want `wanted`, `free` is left.

    ``free`` is allocatable minus used, counting what the pods' own current reservations give back; it is
    negative when the node is overcommitted.
    """

    node: str
    resource: str
    wanted: int
    free: int

    def __str__(self) -> str:
        return f"{self.resource} does not fit on node {self.node}: wanted {self.wanted}, free {self.free}"


@dataclass(frozen=True)
class QuotaExceeded(Conflict):
    """The pod's namespace's elastic quota refuses it (on every node): `resource` is the whole message, e.g.
    'quota team-a: nvidia.com/gpu 6 used + 2 requested > max 6'; `free` is what the quota leaves. A Conflict,
    so code that knows only conflicts still refuses."""

    @property
    def namespace(self) -> str:
        return self.resource.removeprefix("quota ").split(":", 1)[0]

    def __str__(self) -> str:
        return self.resource


def _conflict(node: str, resource: str, wanted: int, free: int) -> Conflict:
    if not node and resource.startswith("quota "):
        return QuotaExceeded(node=node, resource=resource, wanted=wanted, free=free)
    return Conflict(node=node, resource=resource, wanted=wanted, free=free)


@dataclass(frozen=True)
class ElasticQuota:
    """A namespace's elastic quota as the ledger enforces it (base units; a resource missing from `max` is not
    limited, one missing from `min` is guaranteed 0)."""

    namespace: str
    min: ResourceVector
    max: ResourceVector


@dataclass(frozen=True)
class QuotaUse:
    """An elastic quota and what its namespace's entries (assumed, admitted and bound) use now."""

    quota: ElasticQuota
    used: ResourceVector

    @property
    def borrowed(self) -> ResourceVector:
        """What the namespace uses above its min, of the resources its quota names (in min or max)."""
        named = self.quota.min.keys() | self.quota.max.keys()
        return {r: a - self.quota.min.get(r, 0) for r, a in self.used.items()
                if r in named and a > self.quota.min.get(r, 0)}


@dataclass(frozen=True)
class QuotaReport:
    """Every elastic quota with its use, and the sums the borrowing rule compares (used <= min)."""

    quotas: list[QuotaUse]
    sum_min: ResourceVector
    sum_used: ResourceVector


@dataclass(frozen=True)
class UnknownNode:
    """The ledger has no node of that name (not synced yet, or deleted)."""

    node: str


@dataclass(frozen=True)
class LedgerNotReady:
    """The ledger has not been rebuilt since Redis started or lost its data; nothing may be admitted."""

    reason: str


@dataclass(frozen=True)
class NeedRequest:
    """A confirm without a request found no entry for the pod: call again with the pod's request."""


@dataclass(frozen=True)
class Stale:
    """The dispatcher marked the pod changed (a newer digest) or gone since this version was queued."""

    marker: str


@dataclass(frozen=True)
class HeldElsewhere:
    """The pod already holds resources on another node, in `state`."""

    node: str
    state: EntryState


ReserveResult = Reserved | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere
GangResult = GangReserved | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere
ConfirmResult = Confirmed | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere | NeedRequest
BatchResult = Reserved | Conflict | UnknownNode | Stale | HeldElsewhere
"""Per pod of `Ledger.reserve_batch`: reserved on a node, bound already (HeldElsewhere with state bound, on
whatever node), stale, or refused everywhere (the last candidate's conflict, or unknown nodes)."""


@dataclass(frozen=True)
class BatchPod:
    """One pod of a batch reservation: its candidates, best first, and the digest of the version decided on."""

    uid: str
    pod: str
    digest: str
    candidates: Sequence[str]
    request: Mapping[str, int]
    ports: str = ""
    """Host ports (`hoss.model.compact.pod_meta`): the reservation is refused on a node where one is taken."""
    meta: str = ""
    """The pod's compact description for the workers' pod index (`hoss.model.compact.pod_meta`)."""
    inter_pod_keys: str = ""
    """The topology keys of the pod's required inter-pod terms and DoNotSchedule spread constraints ('k1,k2'),
    whose domains are checked."""
    position: str = ""
    """The change-stream id the decision saw: refused on a node whose inter-pod domains changed since ('' = not
    checked); see 'Inter-pod domains' in hoss/ledger/lua/common.lua."""
    tentative: bool = False
    """The worker counted this pod as placed when it decided the later pods of the batch: if it is refused, a
    later pod with inter_pod_keys is refused too (its decision may have relied on it)."""
    reservation: str = ""
    """uid of a Reservation the pod may consume: on that Reservation's node its room is given to the pod in the
    same call (`Reserved.consumed`); see 'Reservations' in hoss/ledger/lua/reserve_batch.lua."""


@dataclass(frozen=True)
class Nomination:
    """Room held on `node` for a preempting pod (see 'Nominations' in hoss/ledger/lua/common.lua)."""

    uid: str
    node: str
    priority: int
    request: ResourceVector
    owner: str = ""
    """For the rescheduler's hold of a moved pod's room: the controller whose replacement pod claims it."""
    pin: bool = False
    """A rescheduler's hold (`Ledger.hold_moves`): workers steer the pod it is for onto its node."""


MOVE_PRIORITY: Final = 2**31
"""Priority of the rescheduler's holds: above every pod's (system-node-critical is 2,000,001,000), so no other
pod and no foreign binding takes held room."""


@dataclass(frozen=True)
class MoveHold:
    """Room the rescheduler holds before it evicts: for the pending pod (`key` its uid, `owner` ''), or for the
    replacement of a moved pod (`key` 'move/<uid>', `owner` its controller's uid). `freeing`: what the plan's
    evictions free on `node` (the hold may count it)."""

    key: str
    node: str
    request: ResourceVector
    owner: str = ""
    freeing: ResourceVector = field(default_factory=dict)


@dataclass(frozen=True)
class LedgerLoad:
    """What a worker reads at start (and after a rebuild): every node's description and used totals, and the
    change-stream id to follow from."""

    ready: bool
    epoch: str | None
    last_change: str
    nodes: dict[str, tuple[str, ResourceVector]]
    """node -> (compact description JSON, '' when the sync has not written one; used totals)"""
    pods: list[tuple[str, str, str]] = field(default_factory=list)
    """Every pod entry as (uid, node, meta)."""


@dataclass(frozen=True)
class Change:
    """One change-stream entry: ``kind`` u (used totals, pods placed and removed), s (node description), d (node
    gone), r (rebuilt)."""

    id: str
    kind: str
    items: list[tuple[str, str]]
    """(node, used text | spec JSON | '') pairs; for r: [("epoch", epoch)]. A u entry then holds
    ("p:<uid>", "<node>\n<meta>") for a pod that holds an entry after the call and ("x:<uid>", node) for one that
    holds none any more (node names cannot contain ':')."""


CHANGES_KEY: Final = f"{KEY_PREFIX}:changes"
RESCHED_STATUS_KEY: Final = f"{KEY_PREFIX}:resched:status"
"""The rescheduler leader's last plans and outcomes (JSON), which the dispatcher's /status shows."""
PODVER_KEY: Final = f"{KEY_PREFIX}:podver"


def parse_used(text: str) -> ResourceVector:
    """The used totals of a change entry: 'cpu=100,memory=5' -> {'cpu': 100, 'memory': 5}."""
    if not text:
        return {}
    used: ResourceVector = {}
    for part in text.split(","):
        name, _, amount = part.partition("=")
        used[name] = int(amount)
    return used


@dataclass(frozen=True)
class Placement:
    """A pod with its request on a node."""

    uid: str
    pod: str
    """namespace/name, for messages and logs"""
    node: str
    request: Mapping[str, int]
    ports: str = ""
    """Host ports the pod holds on the node (`hoss.model.compact.pod_meta`), checked by reserve."""
    meta: str = ""
    """The pod's compact description for the workers' pod index (`hoss.model.compact.pod_meta`)."""


GangMember = Placement
BoundPod = Placement

RESERVATION_PREFIX: Final = "Reservation/"
"""The `pod` of a Reservation's entry is 'Reservation/<name>' (no pod key has an upper-case namespace)."""


def reservation_key(name: str) -> str:
    """The ledger's name for the entry of the Reservation `name`."""
    return f"{RESERVATION_PREFIX}{name}"


@dataclass(frozen=True)
class NodeSnapshot:
    """One node as the ledger sees it: allocatable, used (bound + assumed), entry counts and labels."""

    alloc: ResourceVector
    used: ResourceVector
    assumed: int
    """number of assumed entries on the node"""
    bound: int
    """number of bound entries on the node"""
    labels: dict[str, str] = field(default_factory=dict)
    admitted: int = 0
    """number of admitted entries on the node (the webhook allowed them; not bound yet as far as the sync saw)"""

    @property
    def free(self) -> ResourceVector:
        """alloc - used for every resource either side names; negative when overcommitted."""
        return {r: self.alloc.get(r, 0) - self.used.get(r, 0) for r in {*self.alloc, *self.used}}


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ready flag, the epoch of the last rebuild and every node, read at one instant."""

    ready: bool
    epoch: str | None
    nodes: dict[str, NodeSnapshot]


@dataclass(frozen=True)
class PodEntry:
    """One pod's hold on a node, as stored."""

    uid: str
    pod: str
    node: str
    state: EntryState
    owner: str
    deadline_ms: int | None
    """Redis server time in milliseconds after which an assumed entry expires; None for bound entries"""
    request: ResourceVector


class Ledger:
    """The Redis ledger. Every method is one atomic script call; Redis errors raise `LedgerUnavailable`."""

    def __init__(self, client: Redis, *, owns_client: bool = False, scripts: Redis | None = None,
                 reads: PipelinedRedis | None = None) -> None:
        """``scripts``, when given, runs the ledger's scripts (every operation but the change stream's reads and a
        few pipelined reads): `hoss.ledger.redisclient.PipelinedRedis`, whose cost per call is a fraction of
        redis-py's, as the webhook and the workers use it. ``reads``, when given, is a pipelined connection of its
        own for `changes` (a blocking read would hold up every other call on a shared one). Both stay their
        owner's to close."""
        self._redis = client
        self._script_client = client if scripts is None else scripts
        self._reads = reads
        self._owns_client = owns_client
        self._scripts: dict[str, AsyncScript | _ReadOnlyScript] = {}
        self._confirms: list[tuple[list[str | int], asyncio.Future[list[Any]]]] = []
        """Confirms waiting for the next confirm call (`_gathered_confirm`)."""
        self._confirming: asyncio.Task[None] | None = None

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
        reply = await self._run("reserve", [owner, _ttl_ms(ttl_seconds), 1, *_placement_args(placement)])
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
        args: list[str | int] = [owner, _ttl_ms(ttl_seconds), len(members)]
        for member in members:
            args.extend(_placement_args(member))
        if position:
            args.extend([position, *inter_pod_keys])
        result = decode_reserve_reply(await self._run("reserve", args))
        if isinstance(result, GangReserved):
            logger.info("reserved gang of %d pods for %s", len(members), owner)
            return GangReserved(tuple(uids), change=result.change)
        return result

    async def reserve_batch(self, pods: Sequence[BatchPod], *, owner: str, ttl_seconds: float) -> list[BatchResult] \
            | LedgerNotReady:
        """Reserve each pod on the first of its candidates it fits (independently, in order), in one call."""
        if not pods:
            return []
        encoded = orjson.dumps([
            [item.uid, item.pod, item.digest, list(item.candidates), _vector_args(item.request)[1:], item.ports,
             item.meta, item.inter_pod_keys, item.position, 1 if item.tentative else 0, item.reservation]
            for item in pods
        ])
        reply = await self._run("reserve_batch", [owner, _ttl_ms(ttl_seconds), encoded.decode()])
        refusal = _refusal(reply) if reply and _text(reply[0]) == "not_ready" else None
        if isinstance(refusal, LedgerNotReady):
            return refusal
        change = _text(reply[-1]) if len(reply) % 5 == 1 else ""
        return [decode_batch_result(reply[i:i + 5], change=change) for i in range(0, len(reply) - len(reply) % 5, 5)]

    async def confirm(
        self, *, uid: str, pod: str, node: str, request: Mapping[str, int] | None, owner: str,
        verify_after_seconds: float, dry_run: bool = False, via: Via = "binding", ports: str = "", meta: str = "",
    ) -> ConfirmResult:
        """Allow a binding of `uid` to `node` (or the creation of a pod on it, `via` "create"): its own
        reservation, or a foreign one that fits. Either way the entry becomes ``admitted`` (held for `owner` when
        new): it stays counted until the sync sees the pod bound or proves the write failed, which it first looks
        at `verify_after_seconds` later. `dry_run`: the same answer, nothing written.

        Without a `request` only an existing entry can confirm; no entry answers `NeedRequest`. `meta`
        (`hoss.model.compact.pod_meta`) is kept in a new entry; its priority decides which nominations it must leave
        room for.
        """
        placement = Placement(uid=uid, pod=pod, node=node, request=request or {}, ports=ports, meta=meta)
        has_request = 0 if request is None else 1
        result = decode_confirm_reply(
            await self._gathered_confirm([owner, _ttl_ms(verify_after_seconds), has_request, int(dry_run), via,
                                          *_placement_args(placement)])
        )
        if isinstance(result, Confirmed) and result.foreign:
            logger.info("confirmed foreign binding of %s to %s for %s", pod, node, owner)
        return result

    async def _gathered_confirm(self, args: list[str | int]) -> list[Any]:
        """One confirm's reply. A confirm made while no confirm call is in flight goes out at once; those made
        while one is wait for it, then go out together in one call (up to CONFIRM_BATCH confirms), in the order
        they were made. So the webhook's concurrent reviews share the script's fixed cost and one round trip
        instead of queueing one call each behind it; a quiet webhook pays nothing for this."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._confirms.append((args, future))
        if self._confirming is None or self._confirming.done():
            self._confirming = asyncio.create_task(self._send_confirms())
        return await future

    async def _send_confirms(self) -> None:
        """Send the waiting confirms, a call at a time, until none wait. A caller that stopped waiting (its
        review timed out) before its call went is left out; every error reaches every caller of its call."""
        while self._confirms:
            batch = [(args, future) for args, future in self._confirms[:CONFIRM_BATCH] if not future.done()]
            del self._confirms[:CONFIRM_BATCH]
            if not batch:
                continue
            try:
                reply = await self._confirm_call([args for args, _ in batch])
            except asyncio.CancelledError:
                for _, future in (*batch, *self._confirms):
                    future.cancel()
                self._confirms.clear()
                raise
            except Exception as error:  # each caller raises it, as a call of its own would
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), answer in zip(batch, reply, strict=True):
                if not future.done():
                    future.set_result(answer)

    async def _confirm_call(self, confirms: Sequence[Sequence[str | int]]) -> list[Any]:
        """One confirm script call for ``confirms``: a reply for each, in order."""
        reply = await self._run("confirm", [len(confirms), *(arg for args in confirms for arg in args)])
        if reply and not isinstance(reply[0], list):  # not ready: the one answer for every confirm
            return [reply] * len(confirms)
        if len(reply) != len(confirms):
            raise LedgerUnavailable(f"ledger script confirm answered {len(reply)} of {len(confirms)} confirms")
        return reply

    # -- nominations (preemption) ----------------------------------------------------------------------------

    async def nominate(self, *, uid: str, node: str, priority: int, request: Mapping[str, int],
                       ttl_seconds: float) -> str:
        """Hold room on `node` for the preempting pod `uid` for `ttl_seconds` (replacing its earlier nomination).

        Returns "nominated", "assumed" or "bound" (the pod holds an entry already: nothing is held), or
        "unknown_node"."""
        reply = _ready_or_raise(await self._run(
            "nominate", [uid, node, int(priority), _ttl_ms(ttl_seconds), *_vector_args(request)]))
        return _text(reply[0])

    async def unnominate(self, uid: str) -> bool:
        """End the nomination of `uid`; False when it had none."""
        return int(_ready_or_raise(await self._run("unnominate", [uid]))[1]) == 1

    async def hold_moves(self, holds: Sequence[MoveHold], *, ttl_seconds: float,
                         priority: int = MOVE_PRIORITY) -> Conflict | UnknownNode | str | None:
        """Hold every room of a move plan for `ttl_seconds`, all or nothing (hoss/ledger/lua/hold_moves.lua).

        None when held; a Conflict or UnknownNode naming the first hold that does not fit; or the node of a
        pending pod that already holds an entry."""
        payload = orjson.dumps([[h.key, h.node, h.owner, [x for r, a in h.request.items() for x in (r, str(a))],
                                 {r: str(a) for r, a in h.freeing.items()}] for h in holds]).decode()
        reply = _ready_or_raise(await self._run("hold_moves", [_ttl_ms(ttl_seconds), int(priority), payload]))
        kind = _text(reply[0])
        if kind == "held":
            return None
        if kind == "placed":
            return _text(reply[2])
        refusal = _refusal(reply)
        if isinstance(refusal, Conflict | UnknownNode):
            return refusal
        raise LedgerUnavailable(f"unexpected hold_moves reply {reply!r}")

    async def nominations(self) -> dict[str, Nomination]:
        """The nominations in force, by uid."""
        return decode_nominations(_ready_or_raise(await self._run("nominations", []))[1:])

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
        reply = await self._run("reservation_owners", [len(uids), *uids])
        found: dict[str, ReservationShares] = {}
        at = 0
        for uid in uids:
            held, room, count = int(reply[at]), _text(reply[at + 1]), int(reply[at + 2])
            at += 3
            owners = []
            for _ in range(count):
                owner, pod, node, state, share = (_text(v) for v in reply[at:at + 5])
                owners.append(ReservationOwner(uid=owner, pod=pod, node=node, state=state,
                                               share=_amounts(share)))
                at += 5
            if held:
                found[uid] = ReservationShares(room=_amounts(room), owners=tuple(owners))
        return found

    async def resize(
        self, *, uid: str, pod: str, node: str, request: Mapping[str, int], owner: str,
        verify_after_seconds: float, dry_run: bool = False,
    ) -> ConfirmResult:
        """Judge an in-place resize of `uid` on `node` to `request`: its entry takes the new request when the
        growth fits (an entry that did not exist yet is held as admitted). `dry_run`: the answer only."""
        placement = Placement(uid=uid, pod=pod, node=node, request=request)
        return decode_confirm_reply(
            await self._run("resize", [owner, _ttl_ms(verify_after_seconds), int(dry_run),
                                       *_placement_args(placement)])
        )

    # -- the apiserver's truth -------------------------------------------------------------------------------

    async def bind(self, *, uid: str, pod: str, node: str, request: Mapping[str, int]) -> None:
        """Record that `uid` runs on `node` (spec.nodeName is set): its entry becomes bound there, unchecked."""
        placement = Placement(uid=uid, pod=pod, node=node, request=request)
        reply = _ready_or_raise(await self._run("bind", _placement_args(placement)))
        previous_node, previous_state = _text(reply[1]), _text(reply[2])
        if not previous_node:
            logger.info("bound %s to %s without a reservation", pod, node)
        elif previous_node != node:
            logger.warning("bound %s to %s, moved from its %s entry on %s", pod, node, previous_state, previous_node)

    async def bind_many(self, placements: Sequence[Placement]) -> list[Overcommit]:
        """`bind` for many pods in one call (a uid listed twice ends on its last placement). Returns the
        placements that overcommitted their node (counted in ``{hoss}:stats`` too)."""
        if not placements:
            return []
        args: list[str | int] = [len(placements)]
        for placement in placements:
            args.extend(_placement_args(placement))
        reply = _texts(_ready_or_raise(await self._run("bind_many", args))[2:])
        return [Overcommit(pod=reply[i], node=reply[i + 1], what=reply[i + 2]) for i in range(0, len(reply), 3)]

    async def release_many(self, uids: Sequence[str]) -> int:
        """`release` for many uids in one call; returns how many had an entry."""
        if not uids:
            return 0
        return int(_ready_or_raise(await self._run("release_many", [len(uids), *uids]))[1])

    async def release(self, uid: str) -> bool:
        """Drop the entry of `uid` wherever it is (pod deleted or finished); False when there was none."""
        reply = _ready_or_raise(await self._run("release", [uid, "", "", 0]))
        return int(reply[1]) == 1

    async def release_assumed(self, *, uid: str, node: str, answered: bool = False) -> bool:
        """Drop the reservation of `uid` on `node` (its binding failed); an admitted or bound entry, or one
        elsewhere, stays.

        A binding the webhook admitted may have succeeded even when its binder saw an error (a timeout, a reset
        connection, a 409 for a duplicate): dropping it would let the node be oversold, so only the sync drops an
        admitted entry, on proof. `answered`: the apiserver answered the binding with an error, so the write is
        over; an admitted entry is then checked by the sync at once. False when nothing was dropped.
        """
        reply = _ready_or_raise(await self._run("release", [uid, node, "assumed", int(answered)]))
        return int(reply[1]) == 1

    async def release_owner(self, owner: str) -> int:
        """Drop every assumed entry held by `owner` (a worker shutting down); returns how many."""
        uids = _texts(_ready_or_raise(await self._run("release_owner", [owner]))[1:])
        if uids:
            logger.info("released %d reservations of %s", len(uids), owner)
        return len(uids)

    async def expire(self) -> list[str]:
        """Drop assumed entries whose deadline passed on the Redis clock; returns their uids."""
        uids = _texts(_ready_or_raise(await self._run("expire", []))[1:])
        if uids:
            logger.warning("expired %d reservations: %s", len(uids), ", ".join(uids))
        return uids

    async def verify_due(self, *, limit: int = 256, retry_seconds: float = 5.0) -> VerifyBatch:
        """The admitted entries whose check is due, at most `limit`; each comes round again `retry_seconds`
        later unless `drop_admitted` or a bind settles it first."""
        cursor = _Cursor(_ready_or_raise(await self._run("verify_due", [limit, _ttl_ms(retry_seconds)])))
        now = cursor.number()
        entries = []
        for _ in range(cursor.number()):
            uid, node, pod, via, admitted = (cursor.text() for _ in range(5))
            entries.append(AdmittedEntry(uid=uid, node=node, pod=pod, via=via, admitted_ms=int(admitted),
                                         answered=cursor.number() == 1))
        return VerifyBatch(now_ms=now, entries=entries)

    async def drop_admitted(self, entry: AdmittedEntry) -> bool:
        """Drop `entry` on proof that its write failed or its pod is gone, if it is still that admitted entry."""
        reply = _ready_or_raise(await self._run("drop_admitted", [entry.uid, entry.node, entry.admitted_ms]))
        dropped = int(reply[1]) == 1
        if dropped:
            logger.info("dropped the admitted entry of %s on %s: its %s did not happen", entry.pod, entry.node,
                        entry.via)
        return dropped

    async def stats(self) -> dict[str, str]:
        """The counters in ``{hoss}:stats`` (overcommits, audit_drift and the last of each)."""
        reply: Any = await self._call(self._redis.hgetall(STATS_KEY))
        return {_text(k): _text(v) for k, v in (reply or {}).items()}

    async def count(self, counter: str, found: int, what: str) -> None:
        """Add `found` to the counter `counter` in ``{hoss}:stats`` and keep `what` under ``last_<counter>``."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.hincrby(STATS_KEY, counter, found)
        pipe.hset(STATS_KEY, f"last_{counter}", what[:1000])
        await self._call(pipe.execute())

    async def tick(self) -> tuple[str | None, int]:
        """The epoch and the next value of the sync's stamp (``{hoss}:stamp``, incremented by every call), read
        together. The syncing replica expects each stamp to be one more than the last: a Redis that comes back
        from an older copy (a restart from a snapshot, a failover to a lagging replica) answers a smaller one, or
        another epoch, and is rebuilt instead of trusted."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.get(EPOCH_KEY)
        pipe.incr(STAMP_KEY)
        epoch, stamp = await self._call(pipe.execute())
        return (None if epoch is None else _text(epoch)), int(stamp)

    async def sync_node(
        self, *, node: str, allocatable: Mapping[str, int], labels: Mapping[str, str] | None = None,
        spec: str = "",
    ) -> None:
        """Register `node` or replace its allocatable, labels and compact description (`spec`, JSON); its
        entries stay. Workers learn the change from the change stream."""
        label_args: list[str | int] = [len(labels or {})]
        for name, value in (labels or {}).items():
            label_args.extend([name, value])
        reply = _ready_or_raise(
            await self._run("sync_node", [node, *_vector_args(allocatable), *label_args, spec])
        )
        if int(reply[1]):
            logger.info("node %s joined the ledger", node)

    async def remove_node(self, node: str) -> list[str]:
        """Forget `node` and drop every entry on it; returns the dropped uids."""
        uids = _texts(_ready_or_raise(await self._run("remove_node", [node]))[1:])
        logger.info("node %s left the ledger, dropping %d entries", node, len(uids))
        return uids

    async def rebuild(
        self,
        *,
        nodes: Iterable[tuple[str, Mapping[str, int], Mapping[str, str]] | tuple[str, Mapping[str, int],
                        Mapping[str, str], str]],
        bound: Iterable[BoundPod],
    ) -> str:
        """Replace nodes and bound entries with the apiserver's truth in one step and mark the ledger ready.

        Assumed entries survive when their node is still listed and their uid is not in `bound`; every used total
        is recomputed. Returns the new epoch.
        """
        epoch = secrets.token_hex(8)
        args: list[str | int] = [epoch]
        node_list = list(nodes)
        args.append(len(node_list))
        for name, allocatable, labels, *spec in node_list:
            args.extend([name, *_vector_args(allocatable), len(labels)])
            for label, value in labels.items():
                args.extend([label, value])
            args.append(spec[0] if spec else "")
        bound_list = list(bound)
        args.append(len(bound_list))
        for placement in bound_list:
            args.extend(_placement_args(placement))
        await self._run("rebuild", args)
        logger.info("rebuilt the ledger: %d nodes, %d bound pods, epoch %s", len(node_list), len(bound_list), epoch)
        return epoch

    async def set_quotas(self, quotas: Iterable[ElasticQuota], *, deleted: Iterable[str] = (),
                         replace: bool = False) -> int:
        """Write elastic quotas (and drop those of the `deleted` namespaces); `replace`: `quotas` are all of them,
        every other namespace loses its quota. Runs whether or not the ledger is ready. Returns how many
        namespaces have a quota."""
        args: list[str | int] = [1 if replace else 0]
        items: list[str | int] = []
        count = 0
        for quota in quotas:
            items.extend([quota.namespace, 1, *_vector_args(quota.min), *_vector_args(quota.max)])
            count += 1
        for namespace in deleted:
            items.extend([namespace, 0, 0, 0])
            count += 1
        reply = await self._run("set_quotas", [*args, count, *items])
        return int(_text(reply[1]))

    async def quotas(self) -> QuotaReport:
        """Every elastic quota with its namespace's use, read at one instant."""
        return decode_quotas_reply(await self._run("quotas", []))

    async def quota_drift(self) -> list[str]:
        """Where, at one instant, a quota namespace's used total (or the quota namespaces' sum) differs from the
        sum of its entries: '<ns>/<resource>: kept K, entries S' ('sum/<resource>' for the sum); [] when none."""
        reply = _texts(await self._run("quota_audit", []))
        return [f"quota {reply[i]}: kept {reply[i + 1]}, entries {reply[i + 2]}" for i in range(0, len(reply), 3)]

    async def mark_not_ready(self) -> None:
        """Make every write but rebuild refuse until the next rebuild (e.g. while the sync re-lists)."""
        await self._call(self._redis.delete(READY_KEY))

    async def is_ready(self) -> bool:
        return int(await self._call(self._redis.exists(READY_KEY))) == 1

    async def epoch(self) -> str | None:
        value = await self._call(self._redis.get(EPOCH_KEY))
        return None if value is None else _text(value)

    # -- reading ---------------------------------------------------------------------------------------------

    async def snapshot(self) -> LedgerSnapshot:
        """One consistent view of every node's allocatable, used totals, entry counts and labels."""
        return decode_snapshot_reply(await self._run("snapshot", [0]))

    async def node_usage(self, nodes: Sequence[str]) -> dict[str, tuple[ResourceVector, ResourceVector]]:
        """(alloc, used) of each named node the ledger knows, read at one instant; unknown names are left out."""
        if not nodes:
            return {}
        snapshot = decode_snapshot_reply(await self._run("snapshot", [len(nodes), *nodes]))
        return {name: (node.alloc, node.used) for name, node in snapshot.nodes.items()}

    async def load(self) -> LedgerLoad:
        """Every node's description and used totals, and the change-stream id to follow from, at one instant."""
        cursor = _Cursor(await self._run("load", []))
        ready = cursor.number() == 1
        epoch = cursor.text() or None
        last = cursor.text()
        nodes = {}
        for _ in range(cursor.number()):
            name = cursor.text()
            spec = cursor.text()
            nodes[name] = (spec, parse_used(cursor.text()))
        pods = [(cursor.text(), cursor.text(), cursor.text()) for _ in range(cursor.number())]
        return LedgerLoad(ready=ready, epoch=epoch, last_change=last, nodes=nodes, pods=pods)

    async def changes(self, after: str, *, count: int = 2000, block_ms: int | None = None) -> list[Change]:
        """Change-stream entries after id `after` (at most `count`; waits up to `block_ms` for the first)."""
        reply: Any
        if self._reads is not None:  # the raw reply: entries' fields as flat lists, which decode_change reads
            block = () if block_ms is None else ("BLOCK", block_ms)
            reply = await self._call(self._reads.execute("XREAD", "COUNT", count, *block, "STREAMS", CHANGES_KEY,
                                                         after))
        else:
            reply = await self._call(self._redis.xread({CHANGES_KEY: after}, count=count, block=block_ms))
        changes: list[Change] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                changes.append(decode_change(_text(entry_id), fields))
        return changes

    async def first_change(self) -> str | None:
        """The id of the oldest entry still in the change stream (older ones were trimmed), or None."""
        reply: Any = await self._call(self._redis.xrange(CHANGES_KEY, count=1))
        return _text(reply[0][0]) if reply else None

    async def bound_nodes(self, uids: Sequence[str]) -> dict[str, str]:
        """uid -> node of those `uids` whose entry is bound (the apiserver has them on a node)."""
        if not uids:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for uid in uids:
            pipe.hmget(f"{KEY_PREFIX}:pod:{uid}", ["state", "node"])
        replies = await self._call(pipe.execute())
        return {uid: _text(node) for uid, (state, node) in zip(uids, replies, strict=True)
                if state is not None and _text(state) == "bound"}

    async def entries(self) -> list[PodEntry]:
        """Every pod entry, read at one instant, ordered by node and uid (for audits, status pages and tests)."""
        return decode_entries_reply(await self._run("entries", []))

    # -- plumbing --------------------------------------------------------------------------------------------

    async def _run(self, name: str, args: Sequence[str | int]) -> list[Any]:
        script = self._scripts.get(name)
        if script is None:
            source = _script_source(name)
            script = self._scripts[name] = (
                _ReadOnlyScript(self._script_client, source) if name in READ_ONLY_SCRIPTS
                else self._script_client.register_script(source)
            )
        reply = await self._call(script(keys=[READY_KEY], args=[KEY_PREFIX, *args]))
        if not isinstance(reply, list):
            raise LedgerUnavailable(f"ledger script {name} replied {reply!r}, expected a list")
        return reply

    @staticmethod
    async def _call(awaitable: Any) -> Any:
        try:
            return await awaitable
        except RedisError as exc:
            raise LedgerUnavailable(f"ledger Redis failed: {exc}") from exc


# -- encoding (pure) -----------------------------------------------------------------------------------------


def _amounts(text: str) -> dict[str, int]:
    """'cpu=1000,pods=1' (the ledger's encoding of amounts) as a mapping."""
    pairs = (part.split("=", 1) for part in text.split(",") if "=" in part)
    return {name: int(amount) for name, amount in pairs}


def _ttl_ms(ttl_seconds: float) -> int:
    if not ttl_seconds > 0:
        raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
    return max(1, round(ttl_seconds * 1000))


def _vector_args(vector: Mapping[str, int]) -> list[str | int]:
    """count, then resource/amount pairs in the vector's order (the order conflicts are looked for in)."""
    args: list[str | int] = [len(vector)]
    for resource, amount in vector.items():
        if not resource:
            raise ValueError("resource names must not be empty")
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= MAX_UNITS:
            raise ValueError(f"{resource}: amount must be an integer in [0, {MAX_UNITS}], got {amount!r}")
        args.extend([resource, str(amount)])
    return args


def _placement_args(placement: Placement) -> list[str | int]:
    return [placement.uid, placement.pod, placement.node, *_vector_args(placement.request), placement.ports,
            placement.meta]


READ_ONLY_SCRIPTS: Final = frozenset({"snapshot", "entries", "load", "nominations", "quotas", "quota_audit",
                                      "reservation_owners"})
"""The scripts that only read; they run with EVALSHA_RO."""


class _ReadOnlyScript:
    """A script run with EVALSHA_RO (Redis 7.0): Redis refuses any write it attempts and counts the keys it declares
    ({hoss}:ready) as read, so a user that may only read the ledger (the dispatcher's) can run it. Plain EVALSHA
    counts declared keys as written, whatever the script does.

    A server that does not know EVALSHA_RO (Redis before 7.0, or fakeredis in unit tests) gets plain EVALSHA; the
    ACL still decides there (a read-only user is refused with NOPERM), so nothing is opened by it."""

    def __init__(self, client: Redis, source: str) -> None:
        self._client = client
        self._source = source
        self._sha = hashlib.sha1(source.encode()).hexdigest()  # Redis names scripts by their SHA-1
        self._plain: AsyncScript | None = None

    async def __call__(self, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        if self._plain is not None:
            return await self._plain(keys=keys, args=args)
        try:
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)
        except NoScriptError:
            await self._client.script_load(self._source)
            return await self._client.evalsha_ro(self._sha, len(keys), *keys, *args)
        except ResponseError as error:
            if not str(error).lower().startswith("unknown command"):
                raise
            logger.warning("Redis has no EVALSHA_RO (before 7.0): read-only ledger scripts run with EVALSHA")
            self._plain = self._client.register_script(self._source)
            return await self._plain(keys=keys, args=args)


@functools.cache
def _script_source(name: str) -> str:
    scripts = importlib.resources.files("hoss.ledger") / "lua"
    return (scripts / "common.lua").read_text() + "\n" + (scripts / f"{name}.lua").read_text()


# -- decoding (pure) -----------------------------------------------------------------------------------------


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(values: Iterable[object]) -> list[str]:
    return [_text(value) for value in values]


class _Cursor:
    """Reads a script's flat reply front to back."""

    def __init__(self, reply: Sequence[object]) -> None:
        self._items: Iterator[object] = iter(reply)

    def text(self) -> str:
        return _text(next(self._items))

    def number(self) -> int:
        return int(self.text())

    def pairs(self) -> dict[str, str]:
        return {self.text(): self.text() for _ in range(self.number())}

    def vector(self) -> ResourceVector:
        return {resource: int(amount) for resource, amount in self.pairs().items()}


def _refusal(reply: Sequence[object]) -> Conflict | UnknownNode | LedgerNotReady | HeldElsewhere | None:
    """The typed result of a refusing reply, None for any other reply."""
    cursor = _Cursor(reply)
    kind = cursor.text()
    if kind == "conflict":
        return _conflict(cursor.text(), cursor.text(), cursor.number(), cursor.number())
    if kind == "unknown_node":
        return UnknownNode(cursor.text())
    if kind == "not_ready":
        return LedgerNotReady(cursor.text())
    if kind == "held_elsewhere":
        return HeldElsewhere(node=cursor.text(), state=_state(cursor.text()))
    return None


def _state(value: str) -> EntryState:
    if value == "assumed":
        return "assumed"
    if value == "bound":
        return "bound"
    if value == "admitted":
        return "admitted"
    raise LedgerUnavailable(f"ledger entry has unknown state {value!r}")


def decode_reserve_reply(reply: Sequence[object]) -> GangResult:
    """The result of reserve.lua; a success is GangReserved with no uids (the caller knows them)."""
    refusal = _refusal(reply)
    if refusal is not None:
        return refusal
    if _text(reply[0]) != "reserved":
        raise LedgerUnavailable(f"unexpected reserve reply {reply!r}")
    return GangReserved((), change=_text(reply[1]) if len(reply) > 1 else "")


def decode_confirm_reply(reply: Sequence[object]) -> ConfirmResult:
    refusal = _refusal(reply)
    if refusal is not None:
        return refusal
    if _text(reply[0]) == "need_request":
        return NeedRequest()
    cursor = _Cursor(reply)
    if cursor.text() != "confirmed":
        raise LedgerUnavailable(f"unexpected confirm reply {reply!r}")
    return Confirmed(node=cursor.text(), foreign=cursor.number() == 1)


def _ready_or_raise(reply: list[Any]) -> list[Any]:
    """The reply of a write that returns a plain value; not ready raises (there is no result to carry it)."""
    refusal = _refusal(reply)
    if isinstance(refusal, LedgerNotReady):
        raise LedgerNotReadyError(refusal.reason)
    return reply


def decode_snapshot_reply(reply: Sequence[object]) -> LedgerSnapshot:
    cursor = _Cursor(reply)
    ready = cursor.number() == 1
    epoch = cursor.text() or None
    nodes: dict[str, NodeSnapshot] = {}
    for _ in range(cursor.number()):
        name = cursor.text()
        alloc, used, assumed, bound = cursor.vector(), cursor.vector(), cursor.number(), cursor.number()
        admitted = cursor.number()
        nodes[name] = NodeSnapshot(alloc=alloc, used=used, assumed=assumed, bound=bound, labels=cursor.pairs(),
                                   admitted=admitted)
    return LedgerSnapshot(ready=ready, epoch=epoch, nodes=nodes)


def decode_entries_reply(reply: Sequence[object]) -> list[PodEntry]:
    cursor = _Cursor(reply)
    entries = []
    for _ in range(cursor.number()):
        uid, node, pod, state, owner, deadline = (cursor.text() for _ in range(6))
        entries.append(
            PodEntry(
                uid=uid,
                pod=pod,
                node=node,
                state=_state(state),
                owner=owner,
                deadline_ms=int(deadline) if deadline else None,
                request=cursor.vector(),
            )
        )
    return entries


def decode_quotas_reply(reply: Sequence[object]) -> QuotaReport:
    """The reply of quotas.lua."""
    cursor = _Cursor(reply)
    quotas = []
    for _ in range(cursor.number()):
        namespace = cursor.text()
        quota = ElasticQuota(namespace=namespace, min=cursor.vector(), max=cursor.vector())
        quotas.append(QuotaUse(quota=quota, used=cursor.vector()))
    return QuotaReport(quotas=quotas, sum_min=cursor.vector(), sum_used=cursor.vector())


def decode_batch_result(item: Sequence[object], *, change: str = "") -> BatchResult:
    """One 5-item result of reserve_batch.lua; `change`: the id of the change-stream entry the call wrote."""
    kind, node = _text(item[0]), _text(item[1])
    if kind == "reserved":
        return Reserved(node, consumed=_text(item[2]) == "consumed", change=change)
    if kind == "bound":
        return HeldElsewhere(node=node, state="bound")
    if kind == "stale":
        return Stale(node)
    if kind == "conflict":
        return _conflict(node, _text(item[2]), int(_text(item[3])), int(_text(item[4])))
    if kind == "unknown":
        return UnknownNode(node)
    raise LedgerUnavailable(f"unexpected reserve_batch result {list(item)!r}")


def decode_change(entry_id: str, fields: object) -> Change:
    """A change-stream entry; redis-py hands the fields as a dict (insertion order kept) or a flat list."""
    if isinstance(fields, dict):
        pairs = [(_text(k), _text(v)) for k, v in fields.items()]
    else:
        flat = [_text(v) for v in fields]  # type: ignore[attr-defined]
        pairs = list(zip(flat[0::2], flat[1::2], strict=True))
    if not pairs or pairs[0][0] != "t":
        raise LedgerUnavailable(f"change {entry_id} has no kind: {pairs[:2]!r}")
    items = [(key[2:] if key.startswith("n:") else key, value) for key, value in pairs[1:]]
    return Change(id=entry_id, kind=pairs[0][1], items=items)


def decode_nominations(flat: Sequence[object]) -> dict[str, Nomination]:
    """uid/JSON pairs (nominations.lua) as Nominations; an unreadable one is left out."""
    result: dict[str, Nomination] = {}
    for i in range(0, len(flat) - 1, 2):
        uid = _text(flat[i])
        try:
            value = orjson.loads(_text(flat[i + 1]))
            request = {str(k): int(v) for k, v in dict(value.get("request") or {}).items()}
            result[uid] = Nomination(uid=uid, node=str(value["node"]), priority=int(value.get("priority") or 0),
                                     request=request, owner=str(value.get("owner") or ""),
                                     pin=bool(value.get("pin")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            logger.warning("nomination of %s is unreadable: %r", uid, flat[i + 1])
    return result
