"""The dispatcher -> worker protocol in Redis: heartbeats, one work stream per worker, acknowledgement.

Keys (all under the ``{hoss}`` hash tag, so they share a slot with the ledger):
- ``{hoss}:worker:<id>``  hash, the worker's heartbeat (policies, queue depth, in flight, counters); it expires
  when the worker stops beating, which is how the dispatcher learns that a worker died.
- ``{hoss}:workers``      set of worker ids the dispatcher has sent work to or seen beating.
- ``{hoss}:queue:<id>``   stream of work items for one worker, read through the consumer group ``hoss``.
- ``{hoss}:dispatched``   hash pod uid -> worker id, so a new dispatcher leader knows what is already assigned.
- ``{hoss}:podver``       hash pod uid -> digest | "gone", written only when a queued pod changed (the new
  version follows in the same stream) or left the pending set; the ledger's batch reservation answers "stale"
  for any other version, and the worker's acknowledgement removes the entry.

A work item carries the pod itself in compact form (`resolver.compact`), so workers neither watch nor read pods.

Invariant: an item leaves its stream (XACK + XDEL) only when the worker is done with the pod (bound, gone, or
handed back). So a stream always holds exactly its worker's unfinished work, and when a worker dies, everything
in its stream is re-sent to other workers. A duplicate is harmless: the ledger holds a pod uid on one node only,
and the apiserver refuses a second binding.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from resolver.errors import LedgerUnavailable

PREFIX = "{hoss}"
GROUP = "hoss"
WORKERS = f"{PREFIX}:workers"
DISPATCHED = f"{PREFIX}:dispatched"
PODVER = f"{PREFIX}:podver"
GONE = "gone"

# Marks dispatched pods that left the pending set; a pod its worker already acknowledged needs no mark.
# KEYS: dispatched, podver. ARGV: uids. Reply: how many were marked.
_MARK_GONE = """
local marked = 0
for _, uid in ipairs(ARGV) do
  if redis.call('HEXISTS', KEYS[1], uid) == 1 then
    redis.call('HSET', KEYS[2], uid, 'gone')
    redis.call('HDEL', KEYS[1], uid)
    marked = marked + 1
  end
end
return marked
"""

# A queued pod changed: if it is still assigned to the worker, mark the new digest and queue the new version
# behind the old one. KEYS: dispatched, podver, queue. ARGV: uid, worker, digest, then item field/value pairs.
# Reply: 1 when queued, 0 when the worker no longer holds the pod (it finished it; the dispatcher re-sends).
_RESEND_CHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('XADD', KEYS[3], '*', unpack(ARGV, 4))
return 1
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
    """The member's compact form (JSON, `resolver.compact`)."""
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
    """The pod's compact form (JSON, `resolver.compact`); empty for a gang (its members carry theirs)."""
    digest: str = ""
    """The version of `pod` (`resolver.compact.digest`)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def encode(self) -> dict[str, str]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "policy": self.policy,
            "gang": self.gang,
            "members": orjson.dumps([asdict(m) for m in self.members]).decode() if self.members else "",
            "min_available": str(self.min_available),
            "attempt": str(self.attempt),
            "pod": self.pod,
            "digest": self.digest,
        }

    @classmethod
    def decode(cls, fields: dict[str, str]) -> WorkItem:
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
        )


class WorkQueue:
    """Both ends of the protocol over one Redis client (decode_responses=True)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._mark_gone = redis.register_script(_MARK_GONE)
        self._resend_changed = redis.register_script(_RESEND_CHANGED)

    # --- worker side -------------------------------------------------------------------------------------

    async def heartbeat(self, info: WorkerInfo, *, ttl_seconds: float) -> None:
        info.heartbeat_unix = time.time()
        async with self._guard():
            pipe = self.redis.pipeline(transaction=True)
            fields: dict[Any, Any] = info.encode()
            pipe.hset(worker_key(info.id), mapping=fields)
            pipe.pexpire(worker_key(info.id), int(ttl_seconds * 1000))
            pipe.sadd(WORKERS, info.id)
            await pipe.execute()

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
        async with self._guard():
            reply: Any = await self.redis.xreadgroup(
                GROUP, worker_id, {queue_key(worker_id): "0" if pending else ">"}, count=count,
                block=None if pending else block_ms,
            )
        items: list[tuple[str, WorkItem]] = []
        for _stream, entries in reply or []:
            for message_id, fields in entries:
                if fields:
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
        message_ids = [message_id for message_id, _uids in done]
        uids = [uid for _message_id, item_uids in done for uid in item_uids]
        async with self._guard():
            pipe = self.redis.pipeline(transaction=True)
            pipe.xack(queue_key(worker_id), GROUP, *message_ids)
            pipe.xdel(queue_key(worker_id), *message_ids)
            if uids:
                pipe.hdel(DISPATCHED, *uids)
                pipe.hdel(PODVER, *uids)
            await pipe.execute()

    async def deregister(self, worker_id: str) -> None:
        """A worker shutting down: drop its heartbeat so the dispatcher hands its remaining items to others."""
        async with self._guard():
            await self.redis.delete(worker_key(worker_id))

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
        """Append each item to its worker's stream and record its uids as dispatched, in one transaction."""
        if not assignments:
            return []
        async with self._guard():
            pipe = self.redis.pipeline(transaction=True)
            owners: dict[str, str] = {}
            for worker_id, item in assignments:
                pipe.xadd(queue_key(worker_id), item.encode())  # type: ignore[arg-type]
                for uid in [m.uid for m in item.members] or [item.uid]:
                    owners[uid] = worker_id
            pipe.hset(DISPATCHED, mapping=owners)  # type: ignore[arg-type]
            pipe.sadd(WORKERS, *{worker_id for worker_id, _item in assignments})
            replies = await pipe.execute()
        return [str(message_id) for message_id in replies[: len(assignments)]]

    async def mark_gone(self, uids: Sequence[str]) -> int:
        """Forget dispatched pods that left the pending set, telling their workers to skip them (a pod its
        worker already acknowledged is only forgotten)."""
        if not uids:
            return 0
        async with self._guard():
            return int(await self._mark_gone(keys=[DISPATCHED, PODVER], args=list(uids)))

    async def resend_changed(self, worker_id: str, item: WorkItem) -> bool:
        """Queue the new version of a changed pod behind the old one on the worker that holds it; False when
        that worker no longer holds it."""
        fields = [value for pair in item.encode().items() for value in pair]
        async with self._guard():
            return bool(await self._resend_changed(
                keys=[DISPATCHED, PODVER, queue_key(worker_id)], args=[item.uid, worker_id, item.digest, *fields]))

    async def dispatched(self) -> dict[str, str]:
        async with self._guard():
            return dict(await cast(Awaitable[dict[str, str]], self.redis.hgetall(DISPATCHED)))

    async def forget(self, uids: Sequence[str]) -> None:
        """Drop uids from the dispatched map (and any version mark: they are sent again with their current one)."""
        if uids:
            async with self._guard():
                pipe = self.redis.pipeline(transaction=True)
                pipe.hdel(DISPATCHED, *uids)
                pipe.hdel(PODVER, *uids)
                await pipe.execute()

    async def reclaim(self, worker_id: str) -> list[WorkItem]:
        """Take every unfinished item of a dead worker (pending or never delivered) and forget the worker."""
        async with self._guard():
            entries = cast(list[tuple[str, dict[str, str]]], await self.redis.xrange(queue_key(worker_id)))
            pipe = self.redis.pipeline(transaction=True)
            pipe.delete(queue_key(worker_id))
            pipe.delete(worker_key(worker_id))
            pipe.srem(WORKERS, worker_id)
            await pipe.execute()
        return [WorkItem.decode(fields) for _id, fields in entries if fields]

    async def depth(self, worker_id: str) -> int:
        async with self._guard():
            return int(await self.redis.xlen(queue_key(worker_id)))

    def _guard(self) -> _RedisGuard:
        return _RedisGuard()


class _RedisGuard:
    """Turns a Redis connection failure into LedgerUnavailable (keeping the cause)."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if error is not None and isinstance(error, RedisError) and not isinstance(error, ResponseError):
            raise LedgerUnavailable(f"redis: {error}") from error
