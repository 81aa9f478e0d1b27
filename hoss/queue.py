"""The dispatcher -> worker protocol in Redis: heartbeats, one work stream per worker, acknowledgement.

Keys (all under the ``{hoss}`` hash tag, so they share a slot with the ledger):
- ``{hoss}:worker:<id>``  hash, the worker's heartbeat (policies, queue depth, in flight, counters); it expires
  when the worker stops beating, which is how the dispatcher learns that a worker died.
- ``{hoss}:workers``      set of worker ids the dispatcher has sent work to or seen beating.
- ``{hoss}:binding``      sorted set of the workers with bindings to post (score: their last such heartbeat);
  they share the binding budget (workers/bindlimit.py).
- ``{hoss}:queue:<id>``   stream of work items for one worker, read through the consumer group ``hoss``.
- ``{hoss}:dispatched``   hash pod uid -> worker id, so a new dispatcher leader knows what is already assigned.
- ``{hoss}:podver``       hash pod uid -> digest | "gone", written only when a queued pod changed (the new
  version follows in the same stream) or left the pending set; the ledger's batch reservation answers "stale"
  for any other version, and the worker's acknowledgement removes the entry. A worker holds one item per pod: a
  newer version it reads takes the place of the older one it holds (its backoff, its attempts), and the older is
  acknowledged without its uid, which stays dispatched (`workers.backlog`). A digest leaves the pod's
  resourceVersion out (`hoss.model.compact`), so a write to a queued pod's status sends no new version.
- ``{hoss}:term:<lease>`` the highest term a dispatcher leader of the Lease ``<namespace>/<name>`` wrote with (its
  leaseTransitions when it took the Lease over).

A work item carries the pod itself in compact form (`hoss.model.compact`), so workers neither watch nor read pods.

Fencing: every write only the leader may make (sends, resends, marks, forgetting, reclaiming) is a script that
carries the leader's term (`Fence`) and checks it against ``{hoss}:term:<lease>`` in the same atomic call: a lower
term is refused (`Fenced`), a higher one becomes the stored one. A new leader writes its term when it takes over
(`WorkQueue.claim_term`), so from then on nothing a former leader still sends (paused, or its write held up on
the way) changes the queues. The terms come from the Lease, whose writes are conditional: of two leaders the later
always has the higher term.

Invariant: an item leaves its stream (XACK + XDEL) only when the worker is done with the pod (bound, gone, or
handed back). So a stream always holds exactly its worker's unfinished work, and when a worker dies, everything
in its stream is re-sent to other workers. A duplicate is harmless: the ledger holds a pod uid on one node only,
and the apiserver refuses a second binding.

Why this module stays whole (over 500 lines): it is one protocol, and its parts are written against each other. The
Lua scripts unpack the items' stream fields and the ``bound:`` / ``+uid`` marks the two ends write; `WorkItem` and
`WorkerInfo` are the exact field layout the streams and heartbeats carry, which both ends read; the dispatcher's
side (sends, reclaim) and the worker's side (read, acknowledge) keep the invariant above only together. A change to
any of them is a change to the others, so a reader checks them in one place; split, each file would hold half of
a contract.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.exceptions import (
    ClusterDownError,
    ExecAbortError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from hoss.errors import HossError, LedgerUnavailable
from hoss.ledger.connection import LedgerScript, ScriptClient
from hoss.ledger.keys import NOMINATED_KEY
from hoss.ledger.redisclient import PipelinedRedis

PREFIX = "{hoss}"
GROUP = "hoss"
WORKERS = f"{PREFIX}:workers"
BINDING = f"{PREFIX}:binding"
"""Workers with bindings waiting or in flight (score: their last such beat); they share the binding budget."""
DISPATCHED = f"{PREFIX}:dispatched"
PODVER = f"{PREFIX}:podver"
BOUND_PREFIX = "bound:"
"""A dispatched entry ``bound:<worker>``: that worker bound the pod; the dispatcher waits for its watch to agree."""
GONE = "gone"

TERM_PREFIX = f"{PREFIX}:term:"

# The leader's fence, first in every script only the leader runs: KEYS[1] holds the highest term a leader of the
# Lease wrote with, ARGV[1] is the writer's ('' for a writer without a Lease, which is not fenced). A lower term is
# refused before anything is written: {'stale', the stored term}; a higher one becomes the stored term.
_FENCE = """
if ARGV[1] ~= '' then
  local stored = tonumber(redis.call('GET', KEYS[1]))
  local mine = tonumber(ARGV[1])
  if stored and mine < stored then
    return {'stale', tostring(stored)}
  end
  if not stored or mine > stored then
    redis.call('SET', KEYS[1], ARGV[1])
  end
end
"""

# A new leader's first write: its term alone. Reply: {'claimed'} (or the fence's refusal).
_CLAIM = _FENCE + """
return {'claimed'}
"""

# Marks dispatched pods that left the pending set; a pod its worker already acknowledged needs no mark. Room held
# for such a pod as a preemptor is given up at once (the ledger drops its node's set entry when it next reads it).
# KEYS: term, dispatched, podver, nominated. ARGV: term, uids. Reply: {'marked', how many}.
_MARK_GONE = _FENCE + """
local marked = 0
for i = 2, #ARGV do
  local uid = ARGV[i]
  local owner = redis.call('HGET', KEYS[2], uid)
  if owner then
    if string.sub(owner, 1, 6) ~= 'bound:' then
      redis.call('HSET', KEYS[3], uid, 'gone')
    end
    redis.call('HDEL', KEYS[4], uid)
    redis.call('HDEL', KEYS[2], uid)
    marked = marked + 1
  end
end
return {'marked', marked}
"""

# The leader sends items: each appended to its worker's stream, its uids recorded as dispatched to that worker, the
# worker noted as known. KEYS: term, dispatched, workers, then the stream of each item in turn. ARGV: term, then per
# item its field 'i' (the item as JSON), its worker and the count of its uids, then the uids.
# Reply: {'sent', the message id of each item}.
_ENQUEUE = _FENCE + """
local ids = {'sent'}
local a = 2
for k = 4, #KEYS do
  local worker, n = ARGV[a + 1], tonumber(ARGV[a + 2])
  table.insert(ids, redis.call('XADD', KEYS[k], '*', 'i', ARGV[a]))
  for j = a + 3, a + 2 + n do
    redis.call('HSET', KEYS[2], ARGV[j], worker)
  end
  redis.call('SADD', KEYS[3], worker)
  a = a + 3 + n
end
return ids
"""

# Forget dispatched uids, and any version mark. KEYS: term, dispatched, podver. ARGV: term, uids.
_FORGET = _FENCE + """
for i = 2, #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
end
return {'forgot'}
"""

# Take a dead worker's unfinished items and forget the worker. KEYS: term, queue, worker, workers, binding.
# ARGV: term, worker id. Reply: {'reclaimed', the stream's entries ([id, [field, value, ...]] each)}.
_RECLAIM = _FENCE + """
local entries = redis.call('XRANGE', KEYS[2], '-', '+')
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
return {'reclaimed', entries}
"""

# The worker is done with some items: drop them from its stream, and drop their uids from the dispatched map only
# where the map still names this worker (a worker declared dead that comes back must not take a pod off the map
# while another worker holds it). KEYS: queue, dispatched, podver. ARGV: group, worker, count of message ids,
# the message ids, then the uids. A uid written '+uid' was bound by the worker: its entry becomes 'bound:<worker>'
# and stays until the dispatcher's watch sees the pod leave the pending set (so a lagging watch never makes the
# dispatcher send a bound pod again). Reply: how many uids were dropped or marked.
_ACK = """
local n = tonumber(ARGV[3])
if n > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 4, 3 + n))
  redis.call('XDEL', KEYS[1], unpack(ARGV, 4, 3 + n))
end
local dropped = 0
for i = 4 + n, #ARGV do
  local uid = ARGV[i]
  local placed = string.sub(uid, 1, 1) == '+'
  if placed then
    uid = string.sub(uid, 2)
  end
  if redis.call('HGET', KEYS[2], uid) == ARGV[2] then
    if placed then
      redis.call('HSET', KEYS[2], uid, 'bound:' .. ARGV[2])
    else
      redis.call('HDEL', KEYS[2], uid)
    end
    redis.call('HDEL', KEYS[3], uid)
    dropped = dropped + 1
  end
end
return dropped
"""
ACK_CHUNK = 1000
"""Most message ids (and most uids) per acknowledgement call, well inside Lua's argument limits."""

TRANSIENT_REPLIES = ("BUSY", "LOADING", "OOM", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
"""Error replies that mean "Redis cannot serve this now" (a long script, loading its data, out of memory, a
replica after a failover): the caller pauses and retries, as for a lost connection."""


_TRANSIENT_CLASSES = (OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError, ExecAbortError)


SEND_TIMEOUT_SECONDS = 5.0
"""How long the dispatcher waits for Redis to answer a send on its pipelined connection (as redis-py's socket
timeout does for its other calls)."""

class QueueLost(HossError):
    """The worker's stream or consumer group does not exist (NOGROUP): the dispatcher declared the worker dead
    and took its work, or Redis restarted or was flushed. The worker recreates its group and re-registers."""


class Fenced(HossError):
    """A leader's write was refused: a leader of a later term (``newer``) wrote since, or this replica does not lead
    (``term`` None). Nothing of the write happened."""

    def __init__(self, *, term: int | None, newer: int | None) -> None:
        self.term = term
        self.newer = newer
        super().__init__(f"a dispatcher leader of term {newer} took over (this replica's term: {term}): its writes"
                         " are refused" if newer is not None else "this replica does not lead: it may not write")


@dataclass(frozen=True)
class Fence:
    """What makes the leader's writes refusable once another leader took over: ``key`` keeps the highest term a
    leader of the Lease wrote with (`term_key`), ``term()`` is this replica's (the Lease's leaseTransitions since it
    took the Lease), None while it does not lead."""

    key: str
    term: Callable[[], int | None]


def term_key(lease: str) -> str:
    """Where the highest term of the dispatcher leaders of Lease ``lease`` ('<namespace>/<name>') is kept."""
    return f"{TERM_PREFIX}{lease}"


UNFENCED = Fence(key=term_key(""), term=lambda: None)
"""A writer without a Lease (tests, tools): its writes are not checked."""


# A queued pod changed: if it is still assigned to the worker, mark the new digest and queue the new version
# behind the old one. KEYS: term, dispatched, podver, queue. ARGV: term, uid, worker, digest, then item field/value
# pairs. Reply: {'resent', 1} when queued, {'resent', 0} when the worker no longer holds the pod (it finished it;
# the dispatcher re-sends).
_RESEND_CHANGED = _FENCE + """
if redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[3] then
  return {'resent', 0}
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
redis.call('XADD', KEYS[4], '*', unpack(ARGV, 5))
return {'resent', 1}
"""


def worker_key(worker_id: str) -> str:
    return f"{PREFIX}:worker:{worker_id}"


def queue_key(worker_id: str) -> str:
    return f"{PREFIX}:queue:{worker_id}"


@dataclass(frozen=True)
class GangMember:
    uid: str
    namespace: str
    name: str
    pod: str = ""
    """The member's compact form (JSON, `hoss.model.compact`)."""
    digest: str = ""


@dataclass(frozen=True)
class WorkItem:
    """One pod to schedule, or one whole gang (``gang`` lists every member, ``min_available`` of them at once)."""

    uid: str
    namespace: str
    name: str
    policy: str
    gang: str = ""
    members: tuple[GangMember, ...] = ()
    min_available: int = 0
    attempt: int = 0
    pod: str = ""
    """The pod's compact form (JSON, `hoss.model.compact`); empty for a gang (its members carry theirs)."""
    digest: str = ""
    """The version of `pod` (`hoss.model.compact.digest`)."""
    queued_unix: float = 0.0
    """When the dispatcher first saw the pod pending without scheduling gates (a gang: its earliest member), on
    the dispatcher's clock: where the worker's end-to-end scheduling duration starts. 0: not known."""
    domain_key: str = ""
    """A gang that must be placed within one domain of this node label (a Kubernetes PodGroup's
    schedulingConstraints.topology): a hard tier, as kube-scheduler's TopologyPlacement has it."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def encode(self) -> dict[str, str]:
        """One stream field ``i`` holding the item as JSON: one argument to pack instead of ten."""
        return {"i": orjson.dumps({
            "uid": self.uid, "namespace": self.namespace, "name": self.name, "policy": self.policy,
            "gang": self.gang, "members": [asdict(m) for m in self.members], "min_available": self.min_available,
            "attempt": self.attempt, "pod": self.pod, "digest": self.digest, "queued_unix": self.queued_unix,
            **({"domain_key": self.domain_key} if self.domain_key else {}),
        }).decode()}

    @classmethod
    def decode(cls, fields: dict[str, str]) -> WorkItem:
        """An item from its stream fields (``i``, or the field-per-attribute form of earlier versions)."""
        if "i" in fields:
            data = orjson.loads(fields["i"])
            return cls(
                uid=data["uid"], namespace=data["namespace"], name=data["name"], policy=data["policy"],
                gang=data.get("gang", ""), members=tuple(GangMember(**m) for m in data.get("members") or ()),
                min_available=int(data.get("min_available") or 0), attempt=int(data.get("attempt") or 0),
                pod=data.get("pod", ""), digest=data.get("digest", ""),
                queued_unix=float(data.get("queued_unix") or 0.0), domain_key=str(data.get("domain_key") or ""),
            )
        members = tuple(GangMember(**m) for m in orjson.loads(fields.get("members") or "[]"))
        return cls(
            uid=fields["uid"],
            namespace=fields["namespace"],
            name=fields["name"],
            policy=fields["policy"],
            gang=fields.get("gang", ""),
            members=members,
            min_available=int(fields.get("min_available") or 0),
            attempt=int(fields.get("attempt") or 0),
            pod=fields.get("pod", ""),
            digest=fields.get("digest", ""),
        )


@dataclass
class WorkerInfo:
    """What a worker says about itself in its heartbeat."""

    id: str
    policies: list[str]
    queue_depth: int = 0
    in_flight: int = 0
    capacity: int = 0
    heartbeat_unix: float = 0.0
    started_unix: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)
    progress: int = 0
    """Grows whenever the worker reads or decides work: a worker whose heartbeat lives but whose progress stands
    still while work waits for it is stuck, and the dispatcher stops routing to it."""
    unhealthy: list[str] = field(default_factory=list)
    """The worker's loops that are failing or dead (empty when all run); such a worker gets no new work."""
    ready: int = 0
    """Items read and waiting for a decision (``queue_depth`` also counts pods waiting out a backoff)."""
    decide_rate: float = 0.0
    """Pods the worker decides per second while deciding (0: not measured yet): with ``ready``, how much more it
    can take before the dispatcher engages another worker (dispatcher/routing.py)."""

    def serves(self, policy: str) -> bool:
        return policy in self.policies

    @property
    def load(self) -> int:
        return self.queue_depth + self.in_flight

    def encode(self) -> dict[str, str]:
        return {
            "id": self.id,
            "policies": ",".join(self.policies),
            "queue_depth": str(self.queue_depth),
            "in_flight": str(self.in_flight),
            "capacity": str(self.capacity),
            "heartbeat_unix": f"{self.heartbeat_unix:.3f}",
            "started_unix": f"{self.started_unix:.3f}",
            "counters": orjson.dumps(self.counters).decode(),
            "progress": str(self.progress),
            "unhealthy": ",".join(self.unhealthy),
            "ready": str(self.ready),
            "decide_rate": f"{self.decide_rate:.1f}",
        }

    @classmethod
    def decode(cls, fields: dict[str, str]) -> WorkerInfo:
        return cls(
            id=fields["id"],
            policies=[p for p in fields.get("policies", "").split(",") if p],
            queue_depth=int(fields.get("queue_depth") or 0),
            in_flight=int(fields.get("in_flight") or 0),
            capacity=int(fields.get("capacity") or 0),
            heartbeat_unix=float(fields.get("heartbeat_unix") or 0),
            started_unix=float(fields.get("started_unix") or 0),
            counters={k: int(v) for k, v in orjson.loads(fields.get("counters") or "{}").items()},
            progress=int(fields.get("progress") or 0),
            unhealthy=[n for n in fields.get("unhealthy", "").split(",") if n],
            ready=int(fields.get("ready") or 0),
            decide_rate=float(fields.get("decide_rate") or 0),
        )


class WorkQueue:
    """Both ends of the protocol over one Redis client (decode_responses=True)."""

    def __init__(self, redis: Redis, *, scripts: ScriptClient | None = None, reads: PipelinedRedis | None = None,
                 pipelined: PipelinedRedis | None = None, clock: Callable[[], float] = time.time,
                 fence: Fence = UNFENCED) -> None:
        """``scripts``, when given, runs the queue's scripts (acknowledgements above all); ``reads`` is a pipelined
        connection of its own for `read` (see `Ledger`); ``pipelined`` carries the dispatcher's sends
        (`enqueue_many`). Each stays its owner's to close. ``clock`` is the wall clock a heartbeat is stamped with
        (``heartbeat_unix``, and the binding workers' set, see `heartbeat`). ``fence``: the leader's term, which
        every write of the dispatcher's side carries (see the module's docstring)."""
        self.redis = redis
        self._clock = clock
        self._reads = reads
        self._pipelined = pipelined
        self.fence = fence
        script_client = redis if scripts is None else scripts
        self._claim = script_client.register_script(_CLAIM)
        self._mark_gone = script_client.register_script(_MARK_GONE)
        self._resend_changed = script_client.register_script(_RESEND_CHANGED)
        self._forget = script_client.register_script(_FORGET)
        self._reclaim = script_client.register_script(_RECLAIM)
        self._enqueue = (script_client if pipelined is None else pipelined).register_script(_ENQUEUE)
        self._ack = script_client.register_script(_ACK)
        self.binding_workers = 1
        """Workers with bindings to post at the last heartbeat this process sent, counting this one (at least 1):
        they share the binding budget (workers/bindlimit.py)."""

    # --- worker side -------------------------------------------------------------------------------------

    async def heartbeat(self, info: WorkerInfo, *, ttl_seconds: float, binding: bool = False) -> bool:
        """Beat; True when the previous beat was still there (False: it expired, or the dispatcher reclaimed this
        worker, or Redis lost it: the worker may have been declared dead). ``binding``: this worker has bindings
        waiting or in flight; notes ``binding_workers``."""
        info.heartbeat_unix = self._clock()
        async with self._guard():
            pipe = self.redis.pipeline(transaction=True)
            fields: dict[Any, Any] = info.encode()
            pipe.exists(worker_key(info.id))
            pipe.hset(worker_key(info.id), mapping=fields)
            pipe.pexpire(worker_key(info.id), int(ttl_seconds * 1000))
            pipe.sadd(WORKERS, info.id)
            if binding:
                pipe.zadd(BINDING, {info.id: info.heartbeat_unix})
            else:
                pipe.zrem(BINDING, info.id)
            # A worker that died while binding stops counting once its heartbeat would have expired.
            pipe.zremrangebyscore(BINDING, "-inf", f"({info.heartbeat_unix - ttl_seconds}")
            pipe.zcard(BINDING)
            replies = await pipe.execute()
        self.binding_workers = max(1, int(replies[6]) + (0 if binding else 1))
        return bool(replies[0])

    async def has_group(self, worker_id: str) -> bool:
        """Whether this worker's stream and consumer group exist (they vanish when it is declared dead)."""
        async with self._guard():
            try:
                groups: Any = await self.redis.xinfo_groups(queue_key(worker_id))
            except ResponseError as error:
                if "no such key" in str(error).lower():
                    return False
                raise
        return any(str(group.get("name")) == GROUP for group in groups)

    async def ensure_group(self, worker_id: str) -> None:
        try:
            async with self._guard():
                await self.redis.xgroup_create(queue_key(worker_id), GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def read(
        self, worker_id: str, *, count: int, block_ms: int, pending: bool = False
    ) -> list[tuple[str, WorkItem]]:
        """New items (or, with ``pending``, items delivered before and not yet acknowledged, after a restart)."""
        reply: Any
        async with self._guard():
            if self._reads is not None:  # the raw reply: fields as flat lists
                block = () if pending else ("BLOCK", block_ms)
                reply = await self._reads.execute("XREADGROUP", "GROUP", GROUP, worker_id, "COUNT", count, *block,
                                                  "STREAMS", queue_key(worker_id), "0" if pending else ">")
            else:
                reply = await self.redis.xreadgroup(
                    GROUP, worker_id, {queue_key(worker_id): "0" if pending else ">"}, count=count,
                    block=None if pending else block_ms,
                )
        items: list[tuple[str, WorkItem]] = []
        for _stream, entries in reply or []:
            for message_id, raw in entries:
                if raw:
                    fields = raw if isinstance(raw, dict) else dict(zip(raw[0::2], raw[1::2], strict=True))
                    items.append((message_id, WorkItem.decode(fields)))
        return items

    async def ack(self, worker_id: str, message_id: str, uids: Sequence[str]) -> None:
        """The worker is done with this item: drop it from the stream and from the dispatched map."""
        await self.ack_many(worker_id, [(message_id, uids)])

    async def ack_many(self, worker_id: str, done: Sequence[tuple[str, Sequence[str]]]) -> None:
        """Acknowledge several items in one round trip. An item acknowledged with no uids only leaves the stream
        (a stale version whose newer version is queued behind it); its uids stay dispatched."""
        if not done:
            return
        keys = [queue_key(worker_id), DISPATCHED, PODVER]
        for start in range(0, len(done), ACK_CHUNK):
            chunk = done[start:start + ACK_CHUNK]
            message_ids = [message_id for message_id, _uids in chunk]
            uids = [uid for _message_id, item_uids in chunk for uid in item_uids]
            async with self._guard():
                await self._ack(keys=keys, args=[GROUP, worker_id, len(message_ids), *message_ids, *uids])

    async def deregister(self, worker_id: str) -> None:
        """A worker shutting down: drop its heartbeat so the dispatcher hands its remaining items to others."""
        async with self._guard():
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(worker_key(worker_id))
            pipe.zrem(BINDING, worker_id)
            await pipe.execute()

    # --- dispatcher side ---------------------------------------------------------------------------------

    async def workers(self) -> tuple[list[WorkerInfo], set[str]]:
        """Live workers (heartbeat present) and the ids of workers known but no longer beating."""
        async with self._guard():
            known = {str(w) for w in await cast(Awaitable[set[str]], self.redis.smembers(WORKERS))}
            pipe = self.redis.pipeline(transaction=False)
            ordered = sorted(known)
            for worker_id in ordered:
                pipe.hgetall(worker_key(worker_id))
            replies = await pipe.execute()
        live = [WorkerInfo.decode(r) for r in replies if r]
        dead = {w for w, r in zip(ordered, replies, strict=True) if not r}
        return live, dead

    async def enqueue(self, worker_id: str, item: WorkItem) -> str:
        return (await self.enqueue_many([(worker_id, item)]))[0]

    async def enqueue_many(self, assignments: Sequence[tuple[str, WorkItem]]) -> list[str]:
        """Append each item to its worker's stream and record its uids as dispatched, in one atomic call (on the
        pipelined connection when there is one); the message ids."""
        if not assignments:
            return []
        keys = [DISPATCHED, WORKERS, *(queue_key(worker_id) for worker_id, _item in assignments)]
        args: list[str | int] = []
        for worker_id, item in assignments:
            uids = [m.uid for m in item.members] or [item.uid]
            args += [item.encode()["i"], worker_id, len(uids), *uids]
        if self._pipelined is None:
            return [str(message_id) for message_id in await self._fenced(self._enqueue, keys, args)]
        try:
            async with asyncio.timeout(SEND_TIMEOUT_SECONDS):
                sent = await self._fenced(self._enqueue, keys, args)
        except TimeoutError as error:
            await self._pipelined.aclose()  # a Redis that does not answer: the next send connects again
            raise LedgerUnavailable(f"redis: no answer to a dispatch in {SEND_TIMEOUT_SECONDS:g} s") from error
        return [str(message_id) for message_id in sent]

    async def claim_term(self) -> None:
        """Write this leader's term (it has just taken over): from now on every write of an earlier leader is
        refused. Raises `Fenced` when a later leader wrote already."""
        await self._fenced(self._claim, [], [])

    async def mark_gone(self, uids: Sequence[str]) -> int:
        """Forget dispatched pods that left the pending set, telling their workers to skip them (a pod its
        worker already acknowledged is only forgotten)."""
        if not uids:
            return 0
        (marked,) = await self._fenced(self._mark_gone, [DISPATCHED, PODVER, NOMINATED_KEY], list(uids))
        return int(marked)

    async def resend_changed(self, worker_id: str, item: WorkItem) -> bool:
        """Queue the new version of a changed pod behind the old one on the worker that holds it; False when
        that worker no longer holds it."""
        fields = [value for pair in item.encode().items() for value in pair]
        (resent,) = await self._fenced(self._resend_changed, [DISPATCHED, PODVER, queue_key(worker_id)],
                                       [item.uid, worker_id, item.digest, *fields])
        return bool(int(resent))

    async def _fenced(self, script: LedgerScript, keys: Sequence[str], args: Sequence[str | int]) -> list[Any]:
        """Run a script of the leader's under the fence (its term key and term first); the rest of its reply after
        the status word. Raises `Fenced` when it was refused, or when this replica does not lead."""
        term = self.fence.term()
        if term is None and self.fence is not UNFENCED:
            raise Fenced(term=None, newer=None)
        async with self._guard():
            reply = await script(keys=[self.fence.key, *keys], args=["" if term is None else term, *args])
        if not isinstance(reply, list) or not reply:
            raise LedgerUnavailable(f"redis: a queue script replied {reply!r}")
        if (reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])) == "stale":
            raise Fenced(term=term, newer=int(reply[1]))
        return list(reply[1:])

    async def dispatched(self) -> dict[str, str]:
        async with self._guard():
            return dict(await cast(Awaitable[dict[str, str]], self.redis.hgetall(DISPATCHED)))

    async def forget(self, uids: Sequence[str]) -> None:
        """Drop uids from the dispatched map (and any version mark: they are sent again with their current one)."""
        if uids:
            await self._fenced(self._forget, [DISPATCHED, PODVER], list(uids))

    async def reclaim(self, worker_id: str) -> list[WorkItem]:
        """Take every unfinished item of a dead worker (pending or never delivered) and forget the worker."""
        (entries,) = await self._fenced(self._reclaim, [queue_key(worker_id), worker_key(worker_id), WORKERS, BINDING],
                                        [worker_id])
        items = []
        for _id, flat in entries:
            if flat:
                fields = {str(k): str(v) for k, v in zip(flat[0::2], flat[1::2], strict=True)}
                items.append(WorkItem.decode(fields))
        return items

    async def depth(self, worker_id: str) -> int:
        async with self._guard():
            return int(await self.redis.xlen(queue_key(worker_id)))

    def _guard(self) -> _RedisGuard:
        return _RedisGuard()


def classify(error: RedisError) -> HossError | None:
    """What a Redis failure means to the queue's callers: `QueueLost` for a missing stream or group (NOGROUP),
    `LedgerUnavailable` for anything that passes (connection, timeout, BUSY, LOADING, OOM, READONLY, ...), None
    for an error reply that is a bug (a wrong command or type) and must not be retried as if it were an outage."""
    if not isinstance(error, ResponseError) or isinstance(error, _TRANSIENT_CLASSES):
        return LedgerUnavailable(f"redis: {error}")  # connection, timeout, LOADING (BusyLoadingError), OOM, ...
    # redis-py strips the code of the replies it maps to a class, and a pipeline prefixes the command's position,
    # so look for the code among the words of the message.
    words = set(str(error).replace(":", " ").split())
    if words & {"NOGROUP", "UNBLOCKED"}:  # UNBLOCKED: the stream was deleted while we waited on it
        return QueueLost(f"redis: {error}")
    if words & set(TRANSIENT_REPLIES):
        return LedgerUnavailable(f"redis: {error}")
    return None


class _RedisGuard:
    """Turns a Redis failure into `QueueLost` or `LedgerUnavailable` (keeping the cause), see `classify`."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if error is not None and isinstance(error, RedisError):
            converted = classify(error)
            if converted is not None:
                raise converted from error
