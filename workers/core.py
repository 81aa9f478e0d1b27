"""The worker core: read work from the dispatcher, decide, reserve in the ledger, bind.

A worker watches nothing on the apiserver. Its node table comes from the ledger (`hoss.framework.feed`: one load, then
the ledger's change stream), and each work item carries its pod in compact form (`hoss.model.compact`). The
apiserver sees a worker only when it binds a pod and records events. Per batch of work items:

1. parse each item's pod (a malformed pod gets an event, PodScheduled=False and is acknowledged);
2. ``decide`` each pod in turn: filter and score every node with the policy's profile; the best few nodes are
   candidates. Pods with the same scheduling signature (same namespace, labels and spec, such as the pods of one
   Job) share one filter and score pass while its best node is untouched by earlier pods of the batch;
   every placement is counted in the node table at once, so later pods of the batch see it;
3. reserve the whole batch in the ledger in one call, each pod on the first of its candidates that still fits;
   the ledger also answers "stale" for a pod the dispatcher has since seen changed or gone;
4. post the bindings (metadata.uid set), many in flight, while the next batch is decided; the resolver webhook
   checks each against its reservation; a success records kube-scheduler's Normal ``Scheduled`` event off the
   binding path;
5. acknowledge the work item. A pod that fits nowhere gets PodScheduled=False and a FailedScheduling event and
   is retried with backoff, sooner when the ledger shows a node gaining room.

Invariants: a work item is acknowledged only when its pod is bound, gone, stale or cannot be parsed (it then
carries an event saying why); a failed binding releases only a reservation that is still assumed, never a bound
entry. On SIGTERM the worker stops reading, lets bindings in flight finish, releases its reservations and drops
its heartbeat, so the dispatcher hands its unfinished items to other workers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import heapq
import logging
import random
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import numpy as np
import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio import BlockingConnectionPool, Redis
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.cycle import Evaluation, Placement, Profile, Unschedulable, choose, evaluate
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, placed_view
from hoss.framework.profiles import load_profiles
from hoss.kube.client import KubeError
from hoss.kube.events import EventSink, pod_event, reservation_event, scheduled_event, set_unschedulable
from hoss.kube.rest import KubeREST
from hoss.ledger.arguments import BatchPod
from hoss.ledger.arguments import GangMember as GangPlacementMember
from hoss.ledger.client import Ledger
from hoss.ledger.keys import reservation_key
from hoss.ledger.redisclient import PipelinedRedis
from hoss.ledger.results import (
    Conflict,
    GangReserved,
    HeldElsewhere,
    LedgerNotReady,
    QuotaExceeded,
    Reserved,
    Stale,
    UnknownNode,
)
from hoss.model import compact, reservations
from hoss.model.admission import lane_of
from hoss.model.objects import Json
from hoss.queue import GONE, GangMember, QueueLost, WorkerInfo, WorkItem, WorkQueue
from hoss.settings import SettingsError
from hoss.supervise import Supervisor, first_of
from workers import bindlimit
from workers.bindlimit import BindLimit
from workers.extender import decide_with_extenders
from workers.gang import place_gang
from workers.intake import Work, inter_pod_keys, ledger_meta, parse_work, signature
from workers.preempt import Preemptor
from workers.reservations import (
    Hint,
    hints_of,
    preferred_first,
    reservation_name,
    shared_reservation,
    write_status,
)
from workers.settings import WorkerSettings
from workers.victims import eligible

log = logging.getLogger(__name__)

REDIS_CONNECTIONS = 256
"""Most Redis connections a worker opens. Its bindings (up to ``max_binds_in_flight``) may each release a
reservation at once when the apiserver refuses them, beside the blocking reads of its stream and of the change
stream; redis-py's default pool (100) raised on the 101st instead of waiting."""
REDIS_WAIT_SECONDS = 20.0


def connect_redis(url: str) -> Redis:
    """The worker's Redis client: a pool that waits up to ``REDIS_WAIT_SECONDS`` for a free connection when all
    ``REDIS_CONNECTIONS`` are busy, instead of failing the call."""
    pool = BlockingConnectionPool.from_url(url, decode_responses=True, max_connections=REDIS_CONNECTIONS,
                                           timeout=REDIS_WAIT_SECONDS)
    return Redis.from_pool(pool)  # closing the client closes its pool


@dataclass
class Pipelined:
    """A worker's pipelined Redis connections (`hoss.ledger.redisclient`, a fraction of redis-py's CPU per call): one
    for the ledger's and the queue's scripts, and one of its own for each blocking read (the change stream, the
    work stream), which would hold up every other call on a shared connection. `connect_redis`'s pool keeps the
    rest (pipelined reads, heartbeats)."""

    scripts: PipelinedRedis
    changes: PipelinedRedis
    work: PipelinedRedis

    @classmethod
    def connect(cls, url: str) -> Pipelined:
        """Connections to ``url``, each opened at its first call."""
        return cls(PipelinedRedis(url), PipelinedRedis(url), PipelinedRedis(url))

    async def aclose(self) -> None:
        for client in (self.scripts, self.changes, self.work):
            await client.aclose()


EVENT_POSTS_IN_FLIGHT = 32
"""Events (Scheduled above all, one per bound pod) posted at once: enough that they keep pace with the bindings
they follow (with 8 they fell minutes behind under load: the bench counted 0.27 per bound pod by its last binding,
kube-scheduler 1.0), so `kubectl describe pod` shows them promptly and their cost falls where it is caused."""
OTHER_REQUESTS_IN_FLIGHT = 8
"""Room in a worker's apiserver connection pool beyond its bindings and events: status patches, preemption,
reservations and access reviews."""


def apiserver_requests_in_flight(settings: WorkerSettings) -> int:
    """How many requests a worker's apiserver client carries at once: every binding ``max_binds_in_flight`` lets it
    post, its events, and the rest. Each is one HTTP/1.1 connection; a pool smaller than this would silently cap the
    bindings below the setting (it did: a fixed 100 until 2026-11-24)."""
    return settings.max_binds_in_flight + EVENT_POSTS_IN_FLIGHT + OTHER_REQUESTS_IN_FLIGHT


IDLE_WAKE_SECONDS = 5.0
"""Longest a loop of the worker sleeps waiting for its event (work, a retry, acknowledgements): every wait ends
when its event is set, and stopping sets them all; the timeout is only a safety net, so an idle worker wakes up
rarely (a timer a second per loop costs it more than anything else while idle)."""
COUNTERS = ("bound", "conflicts", "denied", "unschedulable", "malformed", "retries", "gone", "stale", "errors")


CONFLICT_ROUNDS = 3
"""Batches in a row a pod may lose to conflicts before it backs off like an unschedulable pod."""



def quota_message(refusal: QuotaExceeded) -> str:
    """The FailedScheduling message of a pod its namespace's elastic quota refuses."""
    return f"{refusal}."


class Binder(Protocol):
    """Posts one binding; raises `KubeError` (with the HTTP status) when the apiserver refuses it."""

    async def bind(self, pod: PodView, node: str) -> None: ...


class RestBinder:
    """Bindings through the lean client: one keep-alive session, orjson bodies, metadata.uid set, and the webhook
    lanes taken in turn (`hoss.model.admission.lane_of`)."""

    def __init__(self, rest: KubeREST) -> None:
        self.rest = rest
        self.posted = 0

    async def bind(self, pod: PodView, node: str) -> None:
        self.posted += 1
        await self.rest.create_binding(pod.namespace, pod.name, pod.uid, node, lane=lane_of(self.posted))


@dataclass(order=True)
class _Retry:
    due: float
    work: Work = field(compare=False)


class Worker:
    """One scheduler worker process.

    ``rest`` reaches the apiserver (bindings, events, pod conditions); ``binder`` replaces the binding call
    (the benchmark's in-process sink). Without ``rest`` no event or condition is written. ``pipelined`` carries
    the scripts and the blocking reads when given (its owner closes it); otherwise ``redis`` carries everything.
    """

    def __init__(self, settings: WorkerSettings, *, redis: Redis, rest: KubeREST | None,
                 binder: Binder | None = None, pipelined: Pipelined | None = None) -> None:
        self.settings = settings
        self.rest = rest
        if binder is None:
            if rest is None:
                raise ValueError("a worker needs a KubeREST or a binder")
            binder = RestBinder(rest)
        self.binder = binder
        self.events = EventSink(rest, per_second=settings.events_per_second, concurrency=EVENT_POSTS_IN_FLIGHT) \
            if rest is not None else None
        scripts = None if pipelined is None else pipelined.scripts
        self.queue = WorkQueue(redis, scripts=scripts, reads=None if pipelined is None else pipelined.work)
        self.ledger = Ledger(redis, scripts=scripts, reads=None if pipelined is None else pipelined.changes)
        self.preemptor = None if rest is None else Preemptor(
            rest, self.ledger, record=self._record, component=f"hoss-worker/{settings.id}",
            hold_seconds=settings.preemption_hold_seconds)
        """Preemption for unschedulable pods above the lowest placed priority (`workers.preempt`); None without an
        apiserver."""
        self._consumed: dict[str, str] = {}
        """pod uid -> the Reservation whose room its reservation took, until its binding is answered"""
        profiles, default = load_profiles(settings.policies_file)
        missing = [p for p in settings.policies if p not in profiles]
        if missing:
            raise SettingsError(
                f"hoss-worker: policies {missing} are not in {settings.policies_file} "
                f"(profiles there: {sorted(profiles)})"
            )
        self.profiles: dict[str, Profile] = profiles
        self.default_profile = default
        self.nodes = NodeTable()
        self.feed = NodeFeed(self.ledger, self.nodes, on_room=self._wake_retries,
                             linger_ms=settings.feed_linger_ms, idle=self._idle,
                             pause_after_seconds=settings.feed_pause_after_idle_seconds)
        self.rng = np.random.default_rng(settings.seed)
        self.jitter = random.Random(settings.seed)
        self.ready: collections.deque[Work] = collections.deque()
        self._ready_event = asyncio.Event()
        self._retry_added = asyncio.Event()
        self.retries: list[_Retry] = []
        self.backoff: dict[str, float] = {}
        self.conflict_rounds: dict[str, int] = {}
        self.last_message: dict[str, str] = {}
        self.binds = BindLimit(bindlimit.share(settings.binds_in_flight_budget, 1, settings.max_binds_in_flight))
        self.in_flight = 0
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.registry = CollectorRegistry()
        self.metric_pods = Counter(
            "hoss_worker_pods", "Pods handled by outcome", ["outcome"], registry=self.registry
        )
        self.metric_queue = Gauge("hoss_worker_queue_depth", "Work items waiting", registry=self.registry)
        self.metric_batch = Counter("hoss_worker_decisions", "Pod decisions by kind (full pass or shared with "
                                    "an earlier pod of the same signature)", ["kind"], registry=self.registry)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._bind_tasks: set[asyncio.Task[None]] = set()
        self._acks: list[tuple[str, list[str]]] = []
        self.http: aiohttp.ClientSession | None = None
        self._ack_ready = asyncio.Event()
        self.supervisor = Supervisor()
        self.progress = 0
        """Batches decided: the heartbeat carries it so the dispatcher sees a worker whose scheduling is stuck
        (reading alone is no progress: a reader whose decisions hang would otherwise look well)."""
        self.decided = 0
        """Pods taken from the ready queue and decided (placed, found unschedulable or malformed)."""
        self.deciding_seconds = 0.0
        """Wall time spent deciding them (in ``schedule``, reserve round trips included)."""
        self.decide_rate = 0.0
        """Pods decided per second of deciding over the last beats that decided any: how fast this worker works
        off its ready queue (heartbeat; the dispatcher's routing uses it, dispatcher/routing.py)."""
        self._rate_mark = (0.0, 0)
        self._beat_now = asyncio.Event()
        """Set when the first batch is decided: the heartbeat goes at once, so the dispatcher learns this worker's
        rate within a batch instead of a beat (until then it counts every pod sent as waiting, and a burst at
        start-up would spill onto other workers for nothing)."""
        self.requeues = 0
        """Times this worker found its queue gone (declared dead, or Redis lost its data) and registered again."""
        self._last_beat = time.monotonic()
        self._suspect = False
        """A beat found our heartbeat gone: we may have been declared dead."""

    # --- bookkeeping -------------------------------------------------------------------------------------

    def count(self, outcome: str, n: int = 1) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + n
        self.metric_pods.labels(outcome).inc(n)

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.settings.id,
            policies=list(self.settings.policies),
            queue_depth=len(self.ready) + len(self.retries),
            in_flight=self.in_flight,
            capacity=self.binds.limit,
            started_unix=self.started,
            counters=dict(self.counters),
            progress=self.progress,
            unhealthy=sorted(self.supervisor.health()),
            ready=len(self.ready),
            decide_rate=self.decide_rate,
        )

    def _idle(self) -> bool:
        """Nothing to decide, retry, bind or acknowledge: the node table may go stale until there is (every binding
        runs in a bind task)."""
        return not (self.ready or self.retries or self._bind_tasks or self._acks)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a best-effort apiserver write (a condition) without holding up scheduling."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _record(self, event: Json) -> None:
        if self.events is not None:
            self.events.record(event)

    def _condition(self, namespace: str, name: str, message: str, reason: str = "Unschedulable") -> None:
        if self.rest is not None:
            self._background(set_unschedulable(self.rest, namespace=namespace, name=name, message=message,
                                               reason=reason))

    # --- intake and retries ------------------------------------------------------------------------------

    def _push(self, work: Work) -> None:
        self.ready.append(work)
        self._ready_event.set()

    async def _intake_loop(self) -> None:
        await self._register()
        outage: str | None = None
        while not self.stopping.is_set():
            try:
                batch = await self.queue.read(self.settings.id, count=self.settings.read_batch, block_ms=500)
            except LedgerUnavailable as error:
                if outage is None:
                    log.warning("cannot read work (retrying every second until Redis answers): %s", error)
                outage = str(error)
                await asyncio.sleep(1)
                continue
            except QueueLost as error:
                self._queue_lost(str(error))
                await self._register()
                continue
            if outage is not None:
                log.info("reading work again after: %s", outage)
                outage = None
            for message_id, item in batch:
                self._push(parse_work(message_id, item))
            self.metric_queue.set(len(self.ready) + len(self.retries))

    async def _lost_while_away(self) -> bool:
        """After a gap longer than the heartbeat TTL (the process was paused or starved) or a beat that found its
        key gone, check that our queue still exists before deciding what we hold: if the dispatcher declared us
        dead, other workers have that work now (cheap: one XINFO after a gap, nothing otherwise)."""
        if not self._suspect and time.monotonic() - self._last_beat <= self.settings.heartbeat_ttl_seconds:
            return False
        try:
            present = await self.queue.has_group(self.settings.id)
        except LedgerUnavailable:
            return False  # Redis is away: the intake loop sees what happened when it answers
        self._suspect = False
        self._last_beat = time.monotonic()
        if present:
            return False
        self._queue_lost("found missing after a pause")
        return True

    async def _register(self) -> None:
        """Create this worker's consumer group (if missing), take back what was delivered to it and never
        acknowledged, and beat at once so the dispatcher routes work here again. Retried (bounded) while Redis is
        unavailable; the supervisor restarts the loop if that fails too."""
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(30), wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception_type((LedgerUnavailable, QueueLost)), reraise=True,
            before_sleep=lambda state: log.warning(
                "cannot register this worker's queue (attempt %d): %s", state.attempt_number,
                state.outcome.exception() if state.outcome is not None else "?") if state.attempt_number == 1
                else None,
        ):
            with attempt:
                await self.queue.ensure_group(self.settings.id)
                # Items delivered to this id before a restart and never acknowledged come first.
                pending = await self.queue.read(self.settings.id, count=100_000, block_ms=0, pending=True)
                for message_id, item in pending:
                    self._push(parse_work(message_id, item))
                await self.queue.heartbeat(self.info(), ttl_seconds=self.settings.heartbeat_ttl_seconds)

    def _queue_lost(self, reason: str) -> None:
        """Our stream or group vanished: the dispatcher declared us dead and moved our work to other workers, or
        Redis restarted or was flushed (the dispatcher then sends its pending pods again). Drop the work we hold
        so that no pod is decided by two workers; bindings in flight finish (the ledger and the binding's uid keep
        them single)."""
        dropped = len(self.ready) + len(self.retries)
        self.ready.clear()
        self.retries.clear()
        self.requeues += 1
        log.warning("this worker's queue is gone (%s): dropped %d items the dispatcher sends again elsewhere; "
                    "registering again", reason, dropped)

    def _retry_later(self, work: Work, *, soon: bool = False) -> None:
        uid = work.item.uid
        previous = self.backoff.get(uid, 0.0)
        delay = 0.2 if soon else min(
            max(previous * 2, self.settings.backoff_initial_seconds), self.settings.backoff_max_seconds
        )
        if not soon:
            self.backoff[uid] = delay
        delay *= 0.8 + 0.4 * self.jitter.random()
        heapq.heappush(self.retries, _Retry(time.monotonic() + delay, work))
        self._retry_added.set()
        self.count("retries")

    def _wake_retries(self) -> None:
        """The cluster gained room: retry waiting pods now rather than at the end of their backoff."""
        now = time.monotonic()
        self.retries = [_Retry(min(r.due, now + 0.05), r.work) for r in self.retries]
        heapq.heapify(self.retries)
        self._retry_added.set()

    async def _retry_loop(self) -> None:
        """Move retries that are due to the ready queue; sleep until the next is due (or a retry is added)."""
        while not self.stopping.is_set():
            now = time.monotonic()
            while self.retries and self.retries[0].due <= now:
                self._push(heapq.heappop(self.retries).work)
            wait = min(self.retries[0].due - now, IDLE_WAKE_SECONDS) if self.retries else IDLE_WAKE_SECONDS
            self._retry_added.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.005)):
                    await self._retry_added.wait()

    # --- scheduling --------------------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        while not self.stopping.is_set():
            if not self.ready:
                self._ready_event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_WAKE_SECONDS):
                        await self._ready_event.wait()
                continue
            if await self._lost_while_away():
                continue
            batch = [self.ready.popleft() for _ in range(min(len(self.ready), self.settings.decide_batch))]
            self.progress += 1
            self.decided += sum(len(work.item.members) or 1 for work in batch)
            await self.feed.ready()  # a feed paused while this worker was idle catches up first
            started = time.monotonic()
            try:
                await self.schedule(batch)
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                log.warning("ledger unavailable while scheduling %d pods: %s", len(batch), error)
                for work in batch:
                    self._retry_later(work, soon=True)
                await asyncio.sleep(0.5)
            except Exception as error:
                log.exception("scheduling a batch of %d pods failed; retrying them one by one", len(batch))
                await self._isolate(batch, error)
            finally:
                self.deciding_seconds += time.monotonic() - started
                if not self.decide_rate:
                    self._beat_now.set()

    async def _isolate(self, batch: Sequence[Work], error: Exception) -> None:
        """A batch raised something unexpected: schedule its items one at a time, so only the pod that raises
        again is held back (with a FailedScheduling event and backoff) and the others go on."""
        if len(batch) == 1:
            self._failed(batch[0], error)
            return
        for work in batch:
            try:
                await self.schedule([work])
            except (LedgerUnavailable, LedgerNotReadyError):
                self._retry_later(work, soon=True)
            except Exception as single:
                self._failed(work, single)

    def _failed(self, work: Work, error: Exception) -> None:
        """Processing this pod raised (e.g. a plugin bug): say so on the pod once, and retry it with backoff."""
        item = work.item
        message = f"hoss failed while scheduling this pod: {type(error).__name__}: {error}"
        if self.last_message.get(item.uid) != message:  # logged once per pod and reason, like the event
            log.error("pod %s: %s (retried with backoff)", item.key, message,
                      exc_info=(type(error), error, error.__traceback__))
        self.count("errors")
        for member in self._members(item):
            if self.last_message.get(member.uid) != message:
                self.last_message[member.uid] = message
                self._condition(member.namespace, member.name, message, reason="SchedulerError")
                self._record(pod_event(namespace=member.namespace, name=member.name, uid=member.uid,
                                       reason="FailedScheduling", message=message, component=self._component()))
        self._retry_later(work)

    async def schedule(self, batch: Sequence[Work]) -> None:
        """Decide, reserve and start binding one batch of work items."""
        singles: list[Work] = []
        for work in batch:
            if work.fetch and not await self._fetch(work):
                continue
            if work.unsupported:
                self._unschedulable(work, work.problem)
            elif work.problem:
                self._malformed(work)
                self._done(work)
            elif self._gated(work):
                self.count("gone")  # the dispatcher sends it again once its gates are removed
                self._done(work)
            elif work.item.members:
                await self.schedule_gang(work)
            else:
                singles.append(work)
        if singles:
            await self._schedule_singles(singles)

    @staticmethod
    def _gated(work: Work) -> bool:
        """A pod that still has scheduling gates (sent by a dispatcher that did not hold it back): never placed."""
        pods = [pod for pod, _raw in work.members] or ([work.pod] if work.pod is not None else [])
        return any(pod.scheduling_gates for pod in pods)

    async def _fetch(self, work: Work) -> bool:
        """Fill in the pods of an item that carries none by reading them; False when it was handled here (all
        gone, or the read failed and the item waits for a retry)."""
        if self.rest is None:
            work.problem = "hoss cannot schedule this pod: its work item carries no pod"
            work.fetch = False
            return True
        item = work.item
        members = list(item.members) or [GangMember(uid=item.uid, namespace=item.namespace, name=item.name)]
        fetched: list[GangMember] = []
        for member in members:
            try:
                raw = await self.rest.get_pod(member.namespace, member.name)
            except KubeError as error:
                if error.status == 404:
                    continue
                log.warning("cannot read pod %s/%s: %s", member.namespace, member.name, error)
                self._retry_later(work, soon=True)
                return False
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("cannot read pod %s/%s: %s", member.namespace, member.name, error)
                self._retry_later(work, soon=True)
                return False
            if (raw.get("metadata") or {}).get("uid") != member.uid or (raw.get("spec") or {}).get("nodeName"):
                continue  # replaced or bound meanwhile
            encoded = compact.encode(compact.compact_pod(raw))
            fetched.append(GangMember(uid=member.uid, namespace=member.namespace, name=member.name,
                                      pod=encoded.decode(), digest=compact.digest(encoded)))
        if not fetched:
            self.count("gone")
            self._done(work)
            return False
        if item.members:
            filled = dataclasses.replace(item, members=tuple(fetched))
        else:
            filled = dataclasses.replace(item, pod=fetched[0].pod, digest="")
        parsed = parse_work(work.message_id, filled)
        work.item, work.pod, work.raw, work.members, work.problem = (
            item, parsed.pod, parsed.raw, parsed.members, parsed.problem)
        work.fetch = False
        return True

    async def _schedule_singles(self, batch: Sequence[Work]) -> None:
        decided: list[tuple[Work, PodView, Placement]] = []
        preempting: list[tuple[Work, PodView, Profile, str]] = []
        shared: dict[bytes, tuple[Evaluation, set[str]]] = {}
        # The change-stream position these decisions see: the ledger refuses a pod where an inter-pod domain that
        # matters to it changed after it (see 'Inter-pod domains' in hoss/ledger/lua/common.lua).
        position = self.feed.position
        # Higher priority first, as kube-scheduler's queue pops them (stable: arrival order otherwise), so that a
        # retried preemptor is not beaten to its room by lower-priority pods of the same batch.
        for work in sorted(batch, key=lambda w: -(w.pod.priority if w.pod is not None else 0)):
            pod = work.pod
            assert pod is not None
            profile = self.profiles.get(work.item.policy) or self.profiles[self.default_profile]
            try:
                decision = await self._decide(profile, work, shared)
            except (LedgerUnavailable, LedgerNotReadyError):
                raise
            except Exception as error:
                self._failed(work, error)
                continue
            if isinstance(decision, Unschedulable):
                if self.preemptor is not None and not reservation_name(work.raw) and (
                        eligible(pod, self.nodes) or await self._has_quota(pod.namespace)):
                    preempting.append((work, pod, profile, decision.message))
                else:
                    self._unschedulable(work, decision.message)
                continue
            first = decision.candidates[0]
            self.nodes.hold_locally(first, pod.request)  # later pods of the batch see this placement
            inter_pod = pod.reads_pod_index
            if pod.host_ports or inter_pod:
                # ... and its host ports and inter-pod terms (the ledger's stream confirms or the results undo it)
                self.nodes.place_pod(placed_view(pod, first))
            if inter_pod:
                shared.clear()  # shared evaluations predate this pod: it may change other nodes' feasibility
            for _evaluation, touched in shared.values():
                touched.add(first)
            decided.append((work, pod, decision))
        if decided:
            await self._reserve_decided(decided, position)
        for work, pod, profile, message in preempting:
            # After the batch's reservations, so that the table counts them (`workers.preempt`).
            assert self.preemptor is not None
            self._unschedulable(work, await self.preemptor.attempt(profile, pod, work.raw, self.nodes, message))

    async def _has_quota(self, namespace: str) -> bool:
        """Whether the namespace has an elastic quota (its pods reclaim); a ledger error reads as no."""
        assert self.preemptor is not None
        try:
            return await self.preemptor.has_quota(namespace)
        except (LedgerUnavailable, LedgerNotReadyError):
            return False

    async def _reserve_decided(self, decided: Sequence[tuple[Work, PodView, Placement]], position: str) -> None:
        results = await self.ledger.reserve_batch(
            [self._batch_pod(work, pod, decision, position) for work, pod, decision in decided],
            owner=self.settings.id, ttl_seconds=self.settings.reservation_ttl_seconds,
        )
        for index, (_work, pod, decision) in enumerate(decided):
            if decision.candidates[0] in self.nodes:
                self.nodes.drop_locally(decision.candidates[0], pod.request)
            tentative = pod.host_ports or pod.reads_pod_index
            placed = self.nodes.pods.get(pod.uid) if tentative else None
            result = results[index] if isinstance(results, list) else None
            if placed is not None and placed.node == decision.candidates[0] and not (
                    isinstance(result, Reserved) and result.node == placed.node):
                self.nodes.remove_pod(pod.uid)  # the tentative placement did not happen
        if isinstance(results, LedgerNotReady):
            for work, _pod, _decision in decided:
                self._retry_later(work, soon=True)
            return
        conflicted: set[str] = set()
        reclaiming: list[tuple[Work, PodView, str]] = []
        for (work, pod, _decision), result in zip(decided, results, strict=True):
            match result:
                case Reserved(node=node, consumed=consumed, change=change):
                    if node in self.nodes:
                        self.nodes.expect(node, pod.request, change, self.feed.position)
                    self.conflict_rounds.pop(pod.uid, None)
                    if name := reservation_name(work.raw):
                        self._start_keep(work, pod, node, name)
                        continue
                    hint = next((h for h in hints_of(work.raw) if h.node == node), None) if consumed else None
                    if hint is not None and hint.once:
                        self._consumed[pod.uid] = hint.name
                    self._start_bind(work, [(pod, node)])
                case HeldElsewhere():
                    self.count("gone")  # bound already (by us earlier, or by another scheduler)
                    self._done(work)
                case Stale(marker=marker):
                    self.count("stale")
                    # A newer version follows in our stream (keep the uid dispatched), or the pod is gone.
                    self._done(work, forget=marker == GONE)
                case QuotaExceeded():
                    # The namespace's elastic quota refuses the pod on every node: unschedulable, with the quota
                    # named (scheduler-plugins' CapacityScheduling refuses it in PreFilter likewise); a tenant
                    # within its min reclaims from tenants that borrow (`workers.victims.reclaim_candidates`).
                    if self.preemptor is not None and not work.item.members:
                        reclaiming.append((work, pod, quota_message(result)))
                    else:
                        self._unschedulable(work, quota_message(result))
                case Conflict(node=node):
                    self.count("conflicts")
                    conflicted.add(node)
                    rounds = self.conflict_rounds.get(pod.uid, 0) + 1
                    self.conflict_rounds[pod.uid] = rounds
                    if rounds < CONFLICT_ROUNDS:
                        self._push(work)
                    else:
                        self.conflict_rounds.pop(pod.uid, None)
                        self._retry_later(work)
                case UnknownNode():
                    self._retry_later(work, soon=True)
        if conflicted:
            # The change stream brings the truth within moments; read those nodes now so the retry sees it.
            await self._refresh_usage(sorted(conflicted))
        for work, pod, message in reclaiming:
            assert self.preemptor is not None
            profile = self.profiles.get(work.item.policy) or self.profiles[self.default_profile]
            self._unschedulable(work, await self.preemptor.reclaim(profile, pod, work.raw, self.nodes, message))

    @staticmethod
    def _batch_pod(work: Work, pod: PodView, decision: Placement, position: str) -> BatchPod:
        """The ledger's view of one decided pod: a Reservation to place holds room under 'Reservation/<name>'; a
        pod owned by Reservations names the one on its best candidate that has one."""
        meta = ledger_meta(work.raw, pod.request)
        name = reservation_name(work.raw)
        if name:
            fields: dict[str, object] = {"namespace": pod.namespace, "priority": reservations.PRIORITY,
                                         "reservation": name}
            if shared_reservation(work.raw):
                fields["allocateOnce"] = False
            meta["meta"] = orjson.dumps(fields).decode()
        by_node = {h.node: h.uid for h in hints_of(work.raw)}
        consume = next((by_node[c] for c in decision.candidates if c in by_node), "")
        return BatchPod(uid=pod.uid, pod=reservation_key(name) if name else pod.key, digest=work.item.digest,
                        candidates=decision.candidates, request=pod.request, **meta,
                        inter_pod_keys=inter_pod_keys(pod), position=position,
                        tentative=bool(pod.host_ports or pod.reads_pod_index), reservation=consume)

    async def _decide(self, profile: Profile, work: Work,
                      shared: dict[bytes, tuple[Evaluation, set[str]]]) -> Placement | Unschedulable:
        pod = work.pod
        assert pod is not None
        top = self.settings.candidates
        if profile.extenders:
            if self.http is None:
                self.http = aiohttp.ClientSession()
            return await decide_with_extenders(profile, pod, work.raw, self.nodes, rng=self.rng, top=top,
                                               session=self.http)
        if self.feed.holds:
            held = self.feed.held_nodes(pod.uid, compact.controller_uid(work.raw), pod.request)
            if held:
                return self._decide_held(profile, pod, held)
        hints = hints_of(work.raw)
        if hints:
            return self._decide_with_reservations(profile, pod, hints, top)
        key = signature(work)
        cached = shared.get(key)
        if cached is not None and len(cached[0].feasible) == len(self.nodes):
            evaluation, touched = cached
            decision = choose(evaluation, self.nodes, rng=self.rng, top=top)
            if isinstance(decision, Placement) and decision.candidates[0] not in touched:
                self.metric_batch.labels("shared").inc()
                return decision
        evaluation = evaluate(profile, pod, self.nodes)
        shared[key] = (evaluation, set())
        self.metric_batch.labels("full").inc()
        return choose(evaluation, self.nodes, rng=self.rng, top=top)

    def _decide_held(self, profile: Profile, pod: PodView, held: Sequence[str]) -> Placement | Unschedulable:
        """A pod the rescheduler holds room for (it made room for it, or it replaces a pod it moved) goes onto a
        node of its hold, as kube-scheduler tries a nominated node first; until the room is free there (the moved
        pods are still leaving), it waits, so that it does not take room elsewhere and undo the plan."""
        evaluation = evaluate(profile, pod, self.nodes)
        allowed = np.array([name in held for name in self.nodes.names], dtype=bool)
        others = int(np.count_nonzero(evaluation.feasible & ~allowed))
        restricted = evaluation.restricted(
            allowed, {f"node(s) were not where hoss-rescheduler holds room for the pod ({', '.join(held)})": others}
            if others else None)
        return choose(restricted, self.nodes, rng=self.rng, top=self.settings.candidates)
    def _decide_with_reservations(self, profile: Profile, pod: PodView, hints: Sequence[Hint],
                                  top: int) -> Placement | Unschedulable:
        """Decide with the room of the Reservations that own the pod given back on their nodes, and a feasible
        Reservation node first (workers/reservations.py)."""
        freed = [h for h in hints if h.node in self.nodes and h.serves(pod.request)]
        for hint in freed:
            self.nodes.sub_used(hint.node, hint.request)
        try:
            evaluation = evaluate(profile, pod, self.nodes)
            decision = choose(evaluation, self.nodes, rng=self.rng, top=top)
        finally:
            for hint in freed:
                self.nodes.add_used(hint.node, hint.request)
        if not isinstance(decision, Placement):
            return decision
        feasible = [h.node for h in freed if evaluation.feasible[self.nodes.index[h.node]]]
        candidates = preferred_first(decision.candidates, feasible)
        if candidates == decision.candidates:
            return decision
        scores = dict(zip(decision.candidates, decision.scores, strict=True))
        best = max(decision.scores, default=0.0)
        return dataclasses.replace(decision, candidates=candidates,
                                   scores=[scores.get(c, best) for c in candidates])

    async def _refresh_usage(self, names: Sequence[str]) -> None:
        usage = await self.ledger.node_usage(names)
        for name, (_alloc, used) in usage.items():
            if name in self.nodes:
                self.nodes.set_totals(name, used)

    def _malformed(self, work: Work) -> None:
        self.count("malformed")
        item = work.item
        log.warning("pod %s is malformed: %s", item.key, work.problem)
        self._record(pod_event(namespace=item.namespace, name=item.name, uid=item.uid, reason="FailedScheduling",
                               message=work.problem, component=self._component()))
        self._condition(item.namespace, item.name, work.problem, reason="InvalidPod")

    def _unschedulable(self, work: Work, message: str) -> None:
        self.count("unschedulable")
        if name := reservation_name(work.raw):
            if self.last_message.get(work.item.uid) != message:
                self.last_message[work.item.uid] = message
                self._background(self._reservation_status(name, reservations.unschedulable_status(message)))
                self._record(reservation_event(name, work.item.uid, reason="FailedScheduling", message=message,
                                               component=self._component(), warning=True))
            self._retry_later(work)
            return
        for member in self._members(work.item):
            if self.last_message.get(member.uid) != message:
                self.last_message[member.uid] = message
                self._condition(member.namespace, member.name, message)
                self._record(pod_event(namespace=member.namespace, name=member.name, uid=member.uid,
                                       reason="FailedScheduling", message=message, component=self._component()))
        self._retry_later(work)

    @staticmethod
    def _members(item: WorkItem) -> list[GangMember]:
        return list(item.members) or [GangMember(uid=item.uid, namespace=item.namespace, name=item.name)]

    def _component(self) -> str:
        return f"hoss-worker/{self.settings.id}"

    # --- gangs -------------------------------------------------------------------------------------------

    async def schedule_gang(self, work: Work) -> None:
        """All or nothing: place the members, reserve them in one ledger call, then bind them."""
        item = work.item
        # Members bound already (the gang started before and was re-sent) need no room and count towards
        # min-available; the rest must reach it together.
        bound = await self.ledger.bound_nodes([view.uid for view, _raw in work.members])
        views = [view for view, _raw in work.members if view.uid not in bound]
        if not views:
            self.count("gone")
            self._done(work)
            return
        need = max(1, min(len(views), item.min_available - len(bound)))
        profile = self.profiles.get(item.policy) or self.profiles[self.default_profile]
        position = self.feed.position  # the pod index the plan reads: the ledger refuses it if a domain moved on
        placement = place_gang(profile, views, self.nodes, rng=self.rng, min_available=need,
                               topology_key=profile.topology_key, gang=item.gang)
        if isinstance(placement, Unschedulable):
            message = placement.message
            if self.preemptor is not None and len(views) + len(bound) >= item.min_available \
                    and any(eligible(view, self.nodes) for view in views):
                raws = {view.uid: raw for view, raw in work.members}
                message = await self.preemptor.attempt_gang(
                    profile, item.uid, [(view, raws[view.uid]) for view in views[:need]], self.nodes, message)
            self._unschedulable(work, message)
            return
        chosen = [v for v in views if v.uid in placement.assignments]
        raws = {view.uid: raw for view, raw in work.members}
        members = [GangPlacementMember(uid=v.uid, pod=v.key, node=placement.assignments[v.uid], request=v.request,
                                       **ledger_meta(raws[v.uid], v.request)) for v in chosen]
        result = await self.ledger.reserve_gang(members=members, owner=self.settings.id,
                                                ttl_seconds=self.settings.reservation_ttl_seconds,
                                                position=position, inter_pod_keys=[inter_pod_keys(v) for v in chosen])
        match result:
            case GangReserved(change=change):
                for placed in members:
                    if placed.node in self.nodes:
                        self.nodes.expect(placed.node, placed.request, change, self.feed.position)
                log.info("gang %s: %d members reserved on %d nodes (leaves: %s)", item.gang, len(members),
                         len({m.node for m in members}), ", ".join(placement.leaves) or "-")
                self._start_bind(work, [(v, placement.assignments[v.uid]) for v in chosen])
            case HeldElsewhere(state="bound"):
                # A member is bound already: the gang started before (members were recreated or re-sent).
                self.count("gone")
                self._done(work)
            case QuotaExceeded():
                self._unschedulable(work, quota_message(result))
            case Conflict(node=node):
                self.count("conflicts")
                await self._refresh_usage(sorted({m.node for m in members} | {node}))
                self._retry_later(work, soon=True)
            case LedgerNotReady() | UnknownNode() | HeldElsewhere():
                await self._refresh_usage(sorted({m.node for m in members}))
                self._retry_later(work, soon=True)

    # --- Reservations (workers/reservations.py) -----------------------------------------------------------

    async def _reservation_status(self, name: str, patch: Json) -> None:
        await write_status(self.rest, name, patch)

    def _start_keep(self, work: Work, pod: PodView, node: str, name: str) -> None:
        task = asyncio.create_task(self._keep(work, pod, node, name))
        self._bind_tasks.add(task)
        task.add_done_callback(self._bind_tasks.discard)

    async def _keep(self, work: Work, pod: PodView, node: str, name: str) -> None:
        """A Reservation's room is reserved on `node`: write its status Available there, then keep the room (the
        sync does the same when it sees the status, so a worker that dies in between loses nothing)."""
        if not await write_status(self.rest, name, reservations.available_status(node, pod.request)):
            await self._unreserve(pod, node)
            self._retry_later(work)
            return
        try:
            await self.ledger.keep_reservation(uid=pod.uid, name=name, node=node, request=pod.request,
                                               meta=self._batch_pod(work, pod, Placement([node], [0.0], 1), "").meta)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("Reservation %s: its room on %s is kept by the sync once it sees it (%s)", name, node, error)
        self.count("reserved")
        self.last_message.pop(pod.uid, None)
        self._record(reservation_event(name, pod.uid, reason="Scheduled", message=f"Reservation {name} placed on "
                                       f"{node}", component=self._component(), warning=False))
        self._done(work, bound=True)

    def _used_reservation(self, pod: PodView, node: str) -> None:
        """The pod is bound where it took a Reservation's room: the Reservation succeeded, the pod its owner."""
        name = self._consumed.pop(pod.uid, None)
        if name is not None:
            owner = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
            self._background(self._reservation_status(name, reservations.succeeded_status(node, owner)))

    # --- binding -----------------------------------------------------------------------------------------

    def _start_bind(self, work: Work, placements: list[tuple[PodView, str]]) -> None:
        task = asyncio.create_task(self._bind_item(work, placements))
        self._bind_tasks.add(task)
        task.add_done_callback(self._bind_tasks.discard)

    async def _bind_item(self, work: Work, placements: list[tuple[PodView, str]]) -> None:
        """Bind every placement of the item; acknowledge when all are bound, else try the item again."""
        item = work.item
        outcomes = await asyncio.gather(*(self._bind(pod, node) for pod, node in placements))
        for (pod, node), (ok, _status) in zip(placements, outcomes, strict=True):
            if ok:
                self._used_reservation(pod, node)
            else:
                self._consumed.pop(pod.uid, None)  # released with its entry, the share is back with the Reservation
        if all(ok for ok, _status in outcomes):
            self.backoff.pop(item.uid, None)
            for member in self._members(item):
                self.last_message.pop(member.uid, None)
            self._done(work, bound=True)
        elif not item.members and outcomes[0][1] == 404:
            self.count("gone")
            self._done(work)  # the pod is gone
        else:
            conflict = any(status == 409 for _ok, status in outcomes)
            self._retry_later(work, soon=conflict)

    async def _bind(self, pod: PodView, node: str) -> tuple[bool, int | None]:
        """Post one binding; on refusal release the reservation (only while it is still assumed)."""
        async with self.binds:
            self.in_flight += 1
            try:
                return await self._post_binding(pod, node)
            except Exception:  # whatever a binder raises, the pod is tried again, not lost
                self.count("errors")
                log.exception("binding %s to %s failed unexpectedly", pod.key, node)
                await self._unreserve(pod, node)
                return False, None
            finally:
                self.in_flight -= 1

    async def _post_binding(self, pod: PodView, node: str) -> tuple[bool, int | None]:
        try:
            await self.binder.bind(pod, node)
        except KubeError as error:
            self.count("denied")
            log.info("binding %s to %s refused (%s): %s", pod.key, node, error.status, error)
            await self._unreserve(pod, node, answered=True)
            if error.status != 404:
                self._record(pod_event(namespace=pod.namespace, name=pod.name, uid=pod.uid,
                                       reason="FailedScheduling", message=f"binding to {node} refused: {error}",
                                       component=self._component()))
            return False, error.status
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("binding %s to %s failed: %s", pod.key, node, error)
            await self._unreserve(pod, node)
            return False, None
        self.count("bound")
        policy = pod.policy or self.default_profile
        self.counters[f"bound:{policy}"] = self.counters.get(f"bound:{policy}", 0) + 1
        if self.settings.scheduled_events:
            self._record(scheduled_event(namespace=pod.namespace, name=pod.name, uid=pod.uid, node=node,
                                         component=self._component()))
        return True, 200

    async def _unreserve(self, pod: PodView, node: str, *, answered: bool = False) -> None:
        """Drop the reservation of a binding that failed. One the webhook admitted stays (the binding may have
        happened after all); `answered` (the apiserver answered with an error, so the write is over) asks the
        resolver's sync to check it at once."""
        try:
            # The release's change-stream entry gives the room back to this worker's table, as to every other.
            await self.ledger.release_assumed(uid=pod.uid, node=node, answered=answered)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("cannot release the reservation of %s on %s (it expires by itself): %s", pod.key, node, error)

    def _done(self, work: Work, *, forget: bool = True, bound: bool = False) -> None:
        """Acknowledge soon (``_ack_loop`` sends them in batches); ``forget`` False keeps the uids dispatched;
        ``bound`` tells the dispatcher the pods are bound (it waits for its watch to agree before forgetting)."""
        item = work.item
        uids = ([m.uid for m in item.members] or [item.uid]) if forget else []
        if self.preemptor is not None:
            self.preemptor.forget(item.uid)
        if bound:
            uids = [f"+{uid}" for uid in uids]
        self.conflict_rounds.pop(item.uid, None)
        self._acks.append((work.message_id, uids))
        self._ack_ready.set()

    async def _flush_acks(self) -> bool:
        """Send the acknowledgements gathered so far; False when Redis could not take them (they are kept)."""
        done, self._acks = self._acks, []
        try:
            await self.queue.ack_many(self.settings.id, done)
        except LedgerUnavailable as error:
            log.warning("cannot acknowledge %d items (they stay queued and are retried): %s", len(done), error)
            self._acks[:0] = done
            return False
        return True

    async def _ack_loop(self) -> None:
        while not self.stopping.is_set():
            if not self._acks:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_WAKE_SECONDS):
                        await self._ack_ready.wait()
                self._ack_ready.clear()
                if not self._acks:
                    continue
            await asyncio.sleep(0.01)  # gather the acknowledgements of a burst into one round trip
            if not await self._flush_acks():
                await asyncio.sleep(0.5)  # Redis unreachable: try again shortly

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        outage = False
        while not self.stopping.is_set():
            (busy, decided), self._rate_mark = self._rate_mark, (self.deciding_seconds, self.decided)
            if self.deciding_seconds > busy and self.decided > decided:
                rate = (self.decided - decided) / (self.deciding_seconds - busy)
                self.decide_rate = rate if not self.decide_rate else 0.5 * (self.decide_rate + rate)
            try:
                if not await self.queue.heartbeat(self.info(), ttl_seconds=self.settings.heartbeat_ttl_seconds,
                                                  binding=self.binds.demand > 0):
                    self._suspect = True
                self.binds.resize(bindlimit.share(self.settings.binds_in_flight_budget,
                                                  self.queue.binding_workers, self.settings.max_binds_in_flight))
                self._last_beat = time.monotonic()
            except LedgerUnavailable as error:
                if not outage:
                    log.warning("cannot send heartbeat (retrying every beat until Redis answers): %s", error)
                outage = True
            else:
                outage = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat_interval_seconds):
                    await self._beat_now.wait()  # set early by the first batch, and by stopping
            self._beat_now.clear()

    async def run(self) -> None:
        """Run until ``stopping`` is set, then shut down gracefully."""
        if self.events is not None:
            self.events.start()
        supervise = self.supervisor.run
        feed = asyncio.create_task(supervise("feed", lambda: self.feed.follow(self.stopping), until=self.stopping),
                                   name="node-feed")
        await first_of(self.feed.loaded.wait(), self.stopping.wait(), self.supervisor.fatal.wait())
        log.info("worker %s ready: %d nodes, policies %s", self.settings.id, len(self.nodes.names),
                 ",".join(self.settings.policies))
        loops = [
            asyncio.create_task(supervise(name, loop, until=self.stopping), name=name)
            for name, loop in (("heartbeat", self._heartbeat_loop), ("intake", self._intake_loop),
                               ("retry", self._retry_loop), ("schedule", self._schedule_loop),
                               ("ack", self._ack_loop))
        ]
        await first_of(self.stopping.wait(), self.supervisor.fatal.wait())
        if self.supervisor.fatal.is_set():
            log.critical("worker %s stopping: a loop is dead (%s)", self.settings.id, self.supervisor.health())
            self.stopping.set()
        for wake in (self._ready_event, self._retry_added, self._ack_ready, self._beat_now):
            wake.set()  # the loops waiting on them see `stopping` now, not at their next timeout
        log.info("worker %s stopping: %d bindings in flight", self.settings.id, len(self._bind_tasks))
        await asyncio.gather(*loops[1:], return_exceptions=True)
        if self._bind_tasks:
            await asyncio.wait(self._bind_tasks, timeout=10)
        await self._flush_acks()
        released = 0
        with contextlib.suppress(LedgerUnavailable, LedgerNotReadyError):
            released = await self.ledger.release_owner(self.settings.id)
        with contextlib.suppress(LedgerUnavailable):
            await self.queue.deregister(self.settings.id)
        await asyncio.gather(loops[0], feed, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self.events is not None:
            await self.events.close(timeout=5)
        if self.http is not None:
            await self.http.close()
        log.info("worker %s stopped: released %d reservations; unfinished work returns to the dispatcher",
                 self.settings.id, released)


