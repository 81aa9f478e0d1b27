"""The worker core: read work from the dispatcher, decide, reserve in the ledger, bind. The whole cycle is here,
as in kube-scheduler's schedule_one.go, so it stays whole at about 500 lines; each step's details live in the
module named after it.

A worker watches nothing on the apiserver. Its node table comes from the ledger (`hoss.framework.feed`: one load, then
the ledger's change stream), and each work item carries its pod in compact form (`hoss.model.compact`). The
apiserver sees a worker only when it binds a pod and records events. Per batch of work items:

1. read the items of this worker's stream (`workers.stream`) and parse each item's pod (`workers.intake`; a
   malformed pod gets an event, PodScheduled=False and is acknowledged);
2. decide each pod in turn (`workers.deciding`): the best few nodes are candidates, and every placement is counted
   in the node table at once, so later pods of the batch see it; a gang is placed all or nothing
   (`workers.gang`); a pod that fits nowhere may preempt or reclaim (`workers.preempt`);
3. reserve the whole batch in the ledger in one call, each pod on the first of its candidates that still fits;
   the ledger also answers "stale" for a pod the dispatcher has since seen changed or gone;
4. post the bindings (`workers.binding`), many in flight, while the next batch is decided; a Reservation to place
   gets its status written instead (`workers.reservations`);
5. acknowledge the work item (`workers.acks`). A pod that fits nowhere gets PodScheduled=False and a
   FailedScheduling event (`workers.notices`) and is retried with backoff, sooner when the ledger shows a node
   gaining room (`workers.backlog`).

Invariants: a work item is acknowledged only when its pod is bound, gone, stale or cannot be parsed (it then
carries an event saying why); the worker holds one item per pod, a newer version read taking the older's place
(`workers.backlog`: the older is stale); a failed binding releases only a reservation that is still assumed, never
a bound entry. On SIGTERM the worker stops reading, lets bindings in flight finish, releases its reservations and drops
its heartbeat, so the dispatcher hands its unfinished items to other workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.cycle import Profile, Unschedulable
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.kube.events import EventSink, EventTarget, post_event
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
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
from hoss.model.devices import DeviceId
from hoss.queue import GONE, WorkerInfo, WorkQueue
from hoss.reload import ConfigFile, Reporter, follow
from hoss.supervise import Supervisor, first_of
from workers import bindlimit
from workers.acks import Acks, acked_uids
from workers.arguments import batch_pod, decided_meta, gang_members, inter_pod_keys
from workers.attempts import Attempts
from workers.backlog import Backlog
from workers.binding import Binder, Bindings, RestBinder, verdict
from workers.bindlimit import BindLimit
from workers.connections import Pipelined
from workers.deciding import Decided, Decider, Policies, Shared, hold_in_batch, parse_policies, settle_batch
from workers.devices import DeviceBinder, needs_devices
from workers.fetch import fetch
from workers.gang import place_gang
from workers.heartbeat import Heartbeat, Pace
from workers.intake import Work, gated, members_of
from workers.metrics import ERROR, SCHEDULED, UNSCHEDULABLE, PendingCollector, Tally
from workers.notices import Notices, quota_message
from workers.preempt import Preemptor
from workers.reservations import keep_room, reservation_name, taken_once
from workers.settings import WorkerSettings
from workers.stream import WorkStream
from workers.timing import TimedBinder
from workers.victims import eligible
from workers.volumes import PREBIND, VolumeBinder, needs_prebind

log = logging.getLogger(__name__)

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


PROMISE_AFTER_BINDING_SECONDS = 5.0
"""How long a bound pod's ReadWriteOncePod claims and attach slots stay promised to it (`workers.volumes`): until the
resolver's sync has indexed the binding, which every worker's VolumeRestrictions and NodeVolumeLimits then read."""
LEDGER_PAUSE_SECONDS = 0.5
"""How long the schedule loop pauses after a batch found the ledger unavailable."""
BIND_DRAIN_SECONDS = 10.0
"""How long stopping waits for the bindings in flight."""


class Worker:
    """One scheduler worker process.

    ``rest`` reaches the apiserver (bindings, events, pod conditions); ``binder`` replaces the binding call
    (the benchmark's in-process sink). Without ``rest`` no event or condition is written. ``pipelined`` carries
    the scripts and the blocking reads when given (its owner closes it); otherwise ``redis`` carries everything.
    ``target`` is what the worker's events about itself (a reload of its policies) are about: its Pod.
    """

    def __init__(self, settings: WorkerSettings, *, redis: Redis, rest: KubeREST | None,
                 binder: Binder | None = None, pipelined: Pipelined | None = None,
                 target: EventTarget | None = None) -> None:
        self.settings = settings
        self.rest = rest
        if binder is None:
            if rest is None:
                raise ValueError("a worker needs a KubeREST or a binder")
            binder = RestBinder(rest)
        self.tally = Tally()
        binder = TimedBinder(binder, self.tally.scheduler, profile_of=lambda pod: self._profile_name(pod.policy or ""))
        events = EventSink(rest, per_second=settings.events_per_second, concurrency=EVENT_POSTS_IN_FLIGHT) \
            if rest is not None else None
        self.notices = Notices(rest, events, component=f"hoss-worker/{settings.id}")
        scripts = None if pipelined is None else pipelined.scripts
        self.queue = WorkQueue(redis, scripts=scripts, reads=None if pipelined is None else pipelined.work)
        self.ledger = Ledger(redis, scripts=scripts, reads=None if pipelined is None else pipelined.changes)
        self.attempts = Attempts(self.tally.scheduler)
        self.backlog = Backlog(backoff_initial=settings.backoff_initial_seconds,
                               backoff_max=settings.backoff_max_seconds, jitter=random.Random(settings.seed),
                               superseded=self._superseded)
        self.nodes = NodeTable()
        self.feed = NodeFeed(self.ledger, self.nodes, on_room=self.backlog.retry_waiting_soon,
                             linger_ms=settings.feed_linger_ms, idle=self._idle,
                             pause_after_seconds=settings.feed_pause_after_idle_seconds)
        self.policies_file = ConfigFile(settings.policies_file, what="policies", parse=functools.partial(
            parse_policies, source=settings.policies_file, served=settings.policies))
        """The policy file, read at start and every ``config_reload_seconds`` (`hoss.reload`)."""
        self.decider = Decider(settings, self.policies_file.load(), self.nodes, self.feed, tally=self.tally)
        self.reloads = Reporter(counter=self.tally.config_reloads, target=target or EventTarget(),
                                component=self.notices.component,
                                post=None if rest is None else functools.partial(post_event, rest))
        self.preemptor = None if rest is None else Preemptor(
            rest, self.ledger, record=self.notices.record, component=self.notices.component,
            hold_seconds=settings.preemption_hold_seconds, metrics=self.tally.scheduler)
        """Preemption for unschedulable pods above the lowest placed priority (`workers.preempt`); None without an
        apiserver."""
        self.binds = BindLimit(bindlimit.share(settings.binds_in_flight_budget, 1, settings.max_binds_in_flight))
        self.bindings = Bindings(binder, self.ledger, limit=self.binds, tally=self.tally, notices=self.notices,
                                 scheduled_events=settings.scheduled_events,
                                 default_policy=self.decider.default_profile, reader=rest)
        self.volumes = None if rest is None \
            else VolumeBinder(rest, self.ledger, timeout_seconds=settings.volume_bind_timeout_seconds,
                              promise_seconds=settings.reservation_ttl_seconds)
        """Binds claims that wait for their first consumer before the pod's binding (`workers.volumes`)."""
        self.devices = None if rest is None \
            else DeviceBinder(rest, self.ledger, promise_seconds=settings.reservation_ttl_seconds)
        """Allocates and reserves ResourceClaims before the pod's binding (`workers.devices`)."""
        self.acks = Acks(self.queue, settings.id)
        self.pace = Pace()
        self.heartbeat = Heartbeat(self.queue, settings, binds=self.binds, pace=self.pace, info=self.info)
        self.tally.last_heartbeat.set_function(lambda: self.heartbeat.last_beat_unix)
        self.tally.registry.register(PendingCollector(
            lambda: self.attempts.queues(self.backlog.ready, (retry.work for retry in self.backlog.retries))))
        self.stream = WorkStream(self.queue, settings, backlog=self.backlog, heartbeat=self.heartbeat,
                                 tally=self.tally)
        self.supervisor = Supervisor()
        self.started = time.time()
        self.stopping = asyncio.Event()
        self._taken: dict[str, str] = {}
        """pod uid -> the allocateOnce Reservation whose room its reservation took, until its binding is answered"""
        self._bind_tasks: set[asyncio.Task[None]] = set()
        self._prebinding: set[str] = set()
        """uids of pods whose claims are being bound (`workers.volumes`) or whose binding follows: a newer version
        of such a pod (the dispatcher sends one when its claims change, as they do by that PreBind) waits until
        that binding is answered, so that one pod never claims volumes on two nodes at once."""

    @property
    def counters(self) -> dict[str, int]:
        """Pods handled by outcome."""
        return self.tally.counters

    @property
    def requeues(self) -> int:
        """Times this worker found its queue gone and registered again."""
        return self.stream.requeues

    def info(self) -> WorkerInfo:
        """What the heartbeat carries."""
        return WorkerInfo(
            id=self.settings.id,
            policies=list(self.settings.policies),
            queue_depth=self.backlog.depth,
            in_flight=self.bindings.in_flight,
            capacity=self.binds.limit,
            started_unix=self.started,
            counters=dict(self.tally.counters),
            progress=self.pace.progress,
            unhealthy=sorted(self.supervisor.health()),
            ready=len(self.backlog.ready),
            decide_rate=self.pace.rate,
        )

    def _idle(self) -> bool:
        """Nothing to decide, retry, bind or acknowledge: the node table may go stale until there is (every binding
        runs in a bind task)."""
        return not (self.backlog or self._bind_tasks or self.acks)

    # --- the loops ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until ``stopping`` is set, then shut down gracefully."""
        self.notices.start()
        supervise = self.supervisor.run
        feed = asyncio.create_task(supervise("feed", lambda: self.feed.follow(self.stopping), until=self.stopping),
                                   name="node-feed")
        await first_of(self.feed.loaded.wait(), self.stopping.wait(), self.supervisor.fatal.wait())
        log.info("worker %s ready: %d nodes, policies %s", self.settings.id, len(self.nodes.names),
                 ",".join(self.settings.policies))
        loops = [
            asyncio.create_task(supervise(name, loop, until=self.stopping), name=name)
            for name, loop in (("heartbeat", functools.partial(self.heartbeat.beat, self.stopping)),
                               ("intake", functools.partial(self.stream.read, self.stopping)),
                               ("retry", functools.partial(self.backlog.move_due, self.stopping)),
                               ("schedule", self._schedule_loop),
                               ("ack", functools.partial(self.acks.send, self.stopping)))
        ]
        # The policies' watch waits for nothing but its next poll: it is cancelled on stopping.
        watch = asyncio.create_task(supervise("policies", functools.partial(
            follow, self.policies_file, every=self.settings.config_reload_seconds, apply=self._policies_reloaded,
            report=self.reloads.report)), name="policies") if self.settings.config_reload_seconds > 0 else None
        await first_of(self.stopping.wait(), self.supervisor.fatal.wait())
        if self.supervisor.fatal.is_set():
            log.critical("worker %s stopping: a loop is dead (%s)", self.settings.id, self.supervisor.health())
            self.stopping.set()
        # The loops waiting on their events see `stopping` now, not at their next timeout.
        self.backlog.wake()
        self.acks.wake()
        self.heartbeat.soon()
        log.info("worker %s stopping: %d bindings in flight", self.settings.id, len(self._bind_tasks))
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        await asyncio.gather(*loops[1:], return_exceptions=True)
        if self._bind_tasks:
            await asyncio.wait(self._bind_tasks, timeout=BIND_DRAIN_SECONDS)
        await self.acks.flush()
        released = 0
        with contextlib.suppress(LedgerUnavailable, LedgerNotReadyError):
            released = await self.ledger.release_owner(self.settings.id)
        with contextlib.suppress(LedgerUnavailable):
            await self.queue.deregister(self.settings.id)
        await asyncio.gather(loops[0], feed, return_exceptions=True)
        await self.notices.close()
        await self.decider.close()
        log.info("worker %s stopped: released %d reservations; unfinished work returns to the dispatcher",
                 self.settings.id, released)

    async def _schedule_loop(self) -> None:
        while not self.stopping.is_set():
            if not self.backlog.ready:
                await self.backlog.wait_ready()
                continue
            if await self.stream.lost_while_away():
                continue
            batch = self.backlog.take(self.settings.decide_batch)
            self._adopt_policies()
            self.attempts.begin(batch)
            self.pace.batch(sum(len(work.item.members) or 1 for work in batch))
            await self.feed.ready()  # a feed paused while this worker was idle catches up first
            started = time.monotonic()
            try:
                await self.schedule(batch)
            except (LedgerUnavailable, LedgerNotReadyError) as error:
                log.warning("ledger unavailable while scheduling %d pods: %s", len(batch), error)
                for work in batch:
                    self._retry_later(work, soon=True)
                await asyncio.sleep(LEDGER_PAUSE_SECONDS)
            except Exception as error:
                log.exception("scheduling a batch of %d pods failed; retrying them one by one", len(batch))
                await self._isolate(batch, error)
            finally:
                self.pace.spent(time.monotonic() - started)
                if not self.pace.rate:
                    self.heartbeat.soon()

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

    def _policies_reloaded(self, policies: Policies) -> None:
        """The policy file changed and parsed: its profiles decide from the next batch on, and the pods that wait
        are tried again soon, since the new profiles may place them."""
        self.decider.stage(policies)
        self.backlog.retry_waiting_soon()

    def _adopt_policies(self) -> None:
        """Before a batch: the policies reloaded since the last one go in use, for the whole batch."""
        adopted = self.decider.adopt()
        if adopted is not None:
            self.bindings.default_policy = adopted.default

    # --- one batch: decide, reserve, bind ----------------------------------------------------------------

    async def schedule(self, batch: Sequence[Work]) -> None:
        """Decide, reserve and start binding one batch of work items."""
        singles: list[Work] = []
        for work in batch:
            if work.fetch:  # queued without its pod (`workers.fetch`)
                fetched = await fetch(self.rest, work)
                if fetched == "retry":
                    self._retry_later(work, soon=True)
                    continue
                if fetched == "gone":
                    self.tally.count("gone")
                    self._done(work)
                    continue
            if work.unsupported:
                self._unschedulable(work, work.problem)
            elif work.problem:
                self.tally.count("malformed")
                self.notices.malformed(work)
                self._done(work)
            elif work.pod is not None and work.item.uid in self._prebinding:
                self._retry_later(work)  # with backoff: a claim's provisioning may take minutes
            elif gated(work):
                self.tally.count("gone")  # the dispatcher sends it again once its gates are removed
                self._done(work)
            elif work.item.members:
                await self.schedule_gang(work)
            else:
                singles.append(work)
        if singles:
            await self._schedule_singles(singles)

    async def _schedule_singles(self, batch: Sequence[Work]) -> None:
        decided: list[Decided] = []
        preempting: list[tuple[Work, PodView, Profile, str]] = []
        shared: Shared = {}
        # The change-stream position these decisions see: the ledger refuses a pod where an inter-pod domain that
        # matters to it changed after it (see 'Inter-pod domains' in hoss/ledger/lua/common.lua).
        position = self.feed.position
        # Higher priority first, as kube-scheduler's queue pops them (stable: arrival order otherwise), so that a
        # retried preemptor is not beaten to its room by lower-priority pods of the same batch.
        for work in sorted(batch, key=lambda w: -(w.pod.priority if w.pod is not None else 0)):
            pod = work.pod
            assert pod is not None
            profile = self.decider.profile_of(work.item.policy)
            try:
                decision = await self.decider.decide(profile, work, shared)
            except (LedgerUnavailable, LedgerNotReadyError):
                raise
            except Exception as error:
                self._failed(work, error)
                continue
            if isinstance(decision, Unschedulable):
                if self.preemptor is not None and not reservation_name(work.raw):
                    self.tally.scheduler.preemption_attempts.inc()  # kube-scheduler's PostFilter ran for it
                if self.preemptor is not None and not reservation_name(work.raw) \
                        and await self.preemptor.may_preempt(pod, self.nodes):
                    preempting.append((work, pod, profile, decision.message))
                else:
                    self._unschedulable(work, decision.message)
                continue
            hold_in_batch(self.nodes, pod, decision.candidates[0], shared)
            decided.append((work, pod, decision))
        if decided:
            await self._reserve_decided(decided, position)
        for work, pod, profile, message in preempting:
            # After the batch's reservations, so that the table counts them (`workers.preempt`).
            assert self.preemptor is not None
            self._unschedulable(work, await self.preemptor.attempt(profile, pod, work.raw, self.nodes, message))

    async def _promised(self, decided: Sequence[Decided]) -> list[Decided]:
        """The decided pods whose ReadWriteOncePod claims the ledger promised them (`workers.volumes`); a pod whose
        claim is promised to another pod waits, its tentative placement undone, before it reserves any room."""
        if self.volumes is None or not any(needs_prebind(pod) for _w, pod, _d in decided):
            return list(decided)
        kept: list[Decided] = []
        for entry in decided:
            work, pod, decision = entry
            refused = await self.volumes.promise(pod, node=decision.candidates[0], nodes=self.nodes)
            if refused is None:
                kept.append(entry)
                continue
            settle_batch(self.nodes, [entry], LedgerNotReady(refused))
            self._unschedulable(work, refused)
        return kept

    async def _reserve_decided(self, decided: Sequence[Decided], position: str) -> None:
        decided = await self._promised(decided)
        if not decided:
            return
        results = await self.ledger.reserve_batch(
            [batch_pod(work, pod, decision, position, nodes=self.nodes) for work, pod, decision in decided],
            owner=self.settings.id, ttl_seconds=self.settings.reservation_ttl_seconds,
        )
        settle_batch(self.nodes, decided, results)
        if self.volumes is not None:
            for index, (_work, pod, decision) in enumerate(decided):
                result = results[index] if isinstance(results, list) else None
                if not (isinstance(result, Reserved) and result.node == decision.candidates[0]):
                    # the attach slots promised on the first candidate are not taken there
                    await self.volumes.give_back_slots(pod, node=decision.candidates[0])
        if isinstance(results, LedgerNotReady):
            for work, _pod, _decision in decided:
                self._retry_later(work, soon=True)
            return
        conflicted: set[str] = set()
        reclaiming: list[tuple[Work, PodView, str]] = []
        for (work, pod, _decision), result in zip(decided, results, strict=True):
            match result:
                case Reserved(node=node, consumed=consumed, change=change):
                    self._expect(node, self.nodes.request_on(node, pod) if node in self.nodes else pod.request,
                                 change)
                    self.backlog.forget_conflicts(pod.uid)
                    if name := reservation_name(work.raw):
                        self._start(self._keep(work, pod, node, name))
                        continue
                    if consumed and (taken := taken_once(work.raw, node)):
                        self._taken[pod.uid] = taken
                    self._start_binding(work, [(pod, node)])
                case HeldElsewhere():
                    self.tally.count("gone")  # bound already (by us earlier, or by another scheduler)
                    self._done(work)
                case Stale(marker=marker):
                    self.tally.count("stale")
                    # A newer version follows in our stream (keep the uid dispatched), or the pod is gone.
                    self._done(work, forget=marker == GONE)
                case QuotaExceeded():
                    # The namespace's elastic quota refuses the pod on every node: unschedulable, with the quota
                    # named (scheduler-plugins' CapacityScheduling refuses it in PreFilter likewise); a tenant
                    # within its min reclaims from tenants that borrow (`workers.victims.reclaim_candidates`).
                    if self.preemptor is not None and not work.item.members:
                        self.tally.scheduler.preemption_attempts.inc()
                        reclaiming.append((work, pod, quota_message(result)))
                    else:
                        self._unschedulable(work, quota_message(result))
                case Conflict(node=node):
                    self.tally.count("conflicts")
                    self._end_attempt(work, ERROR)  # lost the race for the node's room
                    conflicted.add(node)
                    if self.backlog.lost_conflict(pod.uid):
                        self.backlog.push(work)
                    else:
                        self._retry_later(work)
                case UnknownNode():
                    self._retry_later(work, soon=True)
        if conflicted:
            # The change stream brings the truth within moments; read those nodes now so the retry sees it.
            await self._refresh_usage(sorted(conflicted))
        for work, pod, message in reclaiming:
            assert self.preemptor is not None
            profile = self.decider.profile_of(work.item.policy)
            self._unschedulable(work, await self.preemptor.reclaim(profile, pod, work.raw, self.nodes, message))

    async def schedule_gang(self, work: Work) -> None:
        """All or nothing: place the members, reserve them in one ledger call, then bind them."""
        item = work.item
        # Members bound already (the gang started before and was re-sent) need no room and count towards
        # min-available; the rest must reach it together.
        bound = await self.ledger.bound_nodes([view.uid for view, _raw in work.members])
        views = [view for view, _raw in work.members if view.uid not in bound]
        if not views:
            self.tally.count("gone")
            self._done(work)
            return
        need = max(1, min(len(views), item.min_available - len(bound)))
        profile = self.decider.profile_of(item.policy)
        position = self.feed.position  # the pod index the plan reads: the ledger refuses it if a domain moved on
        domain = None
        if item.domain_key:  # the gang's domain is the one its bound members are in, if any
            domains = {self.nodes.labels[self.nodes.row(node)].get(item.domain_key) for node in bound.values()
                       if node in self.nodes}
            domain = next(iter(domains)) if len(domains) == 1 and None not in domains else None
        placement = place_gang(profile, views, self.nodes, rng=self.decider.rng, min_available=need,
                               topology_key=profile.topology_key, gang=item.gang, domain_key=item.domain_key,
                               domain=domain)
        if isinstance(placement, Unschedulable):
            message = placement.message
            if self.preemptor is not None:
                self.tally.scheduler.preemption_attempts.inc()
            if self.preemptor is not None and len(views) + len(bound) >= item.min_available:
                raws = {view.uid: raw for view, raw in work.members}
                needed = [(view, raws[view.uid]) for view in views[:need]]
                started, text = False, message
                if await self.preemptor.has_quota(views[0].namespace):
                    # A tenant within its min reclaims for the whole gang first (CapacityScheduling), all or nothing.
                    started, text = await self.preemptor.reclaim_gang(profile, item.uid, needed, self.nodes, message)
                if not started and any(eligible(view, self.nodes) for view in views):
                    text = await self.preemptor.attempt_gang(profile, item.uid, needed, self.nodes, message)
                message = text
            self._unschedulable(work, message)
            return
        chosen = [v for v in views if v.uid in placement.assignments]
        members = gang_members(work, chosen, placement.assignments, nodes=self.nodes)
        result = await self.ledger.reserve_gang(members=members, owner=self.settings.id,
                                                ttl_seconds=self.settings.reservation_ttl_seconds,
                                                position=position, inter_pod_keys=[inter_pod_keys(v) for v in chosen])
        match result:
            case GangReserved(change=change):
                for placed in members:
                    self._expect(placed.node, placed.request, change)
                log.info("gang %s: %d members reserved on %d nodes (leaves: %s)", item.gang, len(members),
                         len({m.node for m in members}), ", ".join(placement.leaves) or "-")
                self._start_binding(work, [(v, placement.assignments[v.uid]) for v in chosen])
            case HeldElsewhere(state="bound"):
                # A member is bound already: the gang started before (members were recreated or re-sent).
                self.tally.count("gone")
                self._done(work)
            case QuotaExceeded():
                message = quota_message(result)
                if self.preemptor is not None:
                    # A tenant within its min reclaims for the whole gang at once, all or nothing.
                    self.tally.scheduler.preemption_attempts.inc()
                    raws = {view.uid: raw for view, raw in work.members}
                    _started, message = await self.preemptor.reclaim_gang(
                        profile, item.uid, [(view, raws[view.uid]) for view in chosen], self.nodes, message)
                self._unschedulable(work, message)
            case Conflict(node=node):
                self.tally.count("conflicts")
                await self._refresh_usage(sorted({m.node for m in members} | {node}))
                self._retry_later(work, soon=True)
            case LedgerNotReady() | UnknownNode() | HeldElsewhere():
                await self._refresh_usage(sorted({m.node for m in members}))
                self._retry_later(work, soon=True)

    def _start_binding(self, work: Work, placements: list[tuple[PodView, str]]) -> None:
        """Bind the item's placements while the next batch is decided; pods with claims to bind are marked at once
        (`_prebinding`), before the next batch can read a newer version of them."""
        self._prebinding |= {pod.uid for pod, _node in placements if _prebinds(pod)}
        self._start(self._bind_item(work, placements))

    def _start(self, binding: Coroutine[Any, Any, None]) -> None:
        """Run a binding (or a Reservation's status write) while the next batch is decided."""
        task = asyncio.create_task(binding)
        self._bind_tasks.add(task)
        task.add_done_callback(self._bind_tasks.discard)

    async def _bind_item(self, work: Work, placements: list[tuple[PodView, str]]) -> None:
        """Bind every placement of the item; acknowledge when all are bound, else try the item again."""
        if any(_prebinds(pod) for pod, _node in placements):
            uids = {pod.uid for pod, _node in placements}
            self._prebinding |= uids  # marked already by `_start_binding`; kept until the bindings are answered
            try:
                await self._bind_with_volumes(work, placements)
            finally:
                self._prebinding -= uids
            return
        await self._post_bindings(work, placements)

    async def _bind_with_volumes(self, work: Work, placements: list[tuple[PodView, str]]) -> None:
        """kube-scheduler's PreBind for the claims waiting for their first consumer and the ResourceClaims, then
        the bindings."""
        message, took = await self._prebind(placements)
        if message is not None:
            for pod, node in placements:
                await self.bindings.unreserve(pod, node)
            self._unschedulable(work, message)
            return
        answer = await self._post_bindings(work, placements)
        if answer == "bound" and self.volumes is not None:
            for pod, node in placements:
                if pod.disks or (pod.storage is not None and (pod.storage.once or pod.storage.attach)):
                    # bound: the ledger's entry names its claims from now on; the promise only bridges the moments
                    # until every worker's pod index has it
                    await self.volumes.promise(pod, node=node, nodes=self.nodes,
                                               seconds=PROMISE_AFTER_BINDING_SECONDS)
        if self.devices is not None:
            for pod, _node in placements:
                if not needs_devices(pod):
                    continue
                if answer == "bound":
                    await self.devices.bound(pod, took.get(pod.uid, frozenset()))
                else:
                    # kube-scheduler's Unreserve: the pod leaves its claims' reservedFor
                    await self.devices.unreserve(pod, list(pod.devices.claims) if pod.devices else [], [])

    async def _post_bindings(self, work: Work, placements: list[tuple[PodView, str]]) -> str:
        """Post the bindings; their verdict (`workers.binding.verdict`)."""
        item = work.item
        forms = {view.uid: raw for view, raw in work.members} or {item.uid: work.raw}
        outcomes = await asyncio.gather(*(self.bindings.bind(pod, node, form=forms.get(pod.uid))
                                          for pod, node in placements))
        for (pod, node), outcome in zip(placements, outcomes, strict=True):
            # A failed binding released its entry, and with it the share it took of a Reservation's room.
            taken = self._taken.pop(pod.uid, None)
            if outcome.bound and taken is not None:
                self.notices.reservation_used(taken, pod, node)
        answer = verdict(outcomes, gang=bool(item.members))
        match answer:
            case "bound":
                self.backlog.placed(item.uid)
                self.notices.placed([member.uid for member in members_of(item)])
                self._done(work, bound=True)
            case "gone":
                self.tally.count("gone")
                self._done(work)
            case "changed":
                # The item is out of date. A single pod stays dispatched here: the dispatcher sends its new version
                # behind this one once its watch sees the change. A gang's new versions are not sent behind it, so
                # its pods are handed back and the gang is sent again whole, as its members are now.
                self._done(work, forget=bool(item.members))
            case again:
                self._retry_later(work, soon=again == "retry soon")
        return answer

    async def _prebind(self, placements: list[tuple[PodView, str]],
                       ) -> tuple[str | None, dict[str, frozenset[DeviceId]]]:
        """Bind the claims waiting for their first consumer and allocate the ResourceClaims for each placement
        (`workers.volumes`, `workers.devices`), a gang's members in order, each leaving out the devices the ones
        before it took: the first failure's message (or None), and the devices each pod took."""
        taken: frozenset[DeviceId] = frozenset()
        took: dict[str, frozenset[DeviceId]] = {}
        for pod, node in placements:
            if not _prebinds(pod):
                continue
            if self.volumes is None or self.devices is None:
                return f"{PREBIND}this worker has no apiserver client", took
            message = await self.volumes.prebind(pod, node, self.nodes)
            if message is None:
                message, devices = await self.devices.prebind(pod, node, self.nodes, taken=taken)
                took[pod.uid] = devices
                taken |= devices
            if message is not None:
                return message, took
        return None, took

    async def _keep(self, work: Work, pod: PodView, node: str, name: str) -> None:
        """A Reservation's room is reserved on `node`: write its status and keep the room (`keep_room`)."""
        if not await keep_room(self.rest, self.ledger, name=name, pod=pod, node=node,
                               meta=decided_meta(work, pod)["meta"]):
            await self.bindings.unreserve(pod, node)
            self._retry_later(work)
            return
        self.tally.count("reserved")
        self.notices.reservation_placed(name, pod.uid, node)
        self._done(work, bound=True)

    # --- outcomes ----------------------------------------------------------------------------------------

    def _expect(self, node: str, request: Mapping[str, int], change: str) -> None:
        """The ledger reserved `request` on `node` in entry `change`: the table counts it until the feed brings
        that entry."""
        if node in self.nodes:
            self.nodes.expect(node, request, change, self.feed.position)

    async def _refresh_usage(self, names: Sequence[str]) -> None:
        usage = await self.ledger.node_usage(names)
        for name, (_alloc, used) in usage.items():
            if name in self.nodes:
                self.nodes.set_totals(name, used)

    def _done(self, work: Work, *, forget: bool = True, bound: bool = False) -> None:
        """Acknowledge soon (`workers.acks`); ``forget`` False keeps the uids dispatched; ``bound`` tells the
        dispatcher the pods are bound (it waits for its watch to agree before forgetting)."""
        item = work.item
        if bound:
            self._end_attempt(work, SCHEDULED)
        if not self.backlog.holds(item.uid):  # else its attempts and preemption go on with the newer version
            self.attempts.forget(item.uid)
            if self.preemptor is not None:
                self.preemptor.forget(item.uid)
            self.backlog.forget_conflicts(item.uid)
        self.acks.add(work.message_id, acked_uids(item, forget=forget, bound=bound))

    def _superseded(self, work: Work) -> None:
        """A newer version of the item's pod took its place in the backlog (`workers.backlog`): acknowledge this
        one as stale, its uid staying dispatched, and tell nobody (the pod's owner hears of the pod, not of its
        versions)."""
        self.tally.count("stale")
        log.debug("pod %s: a newer version of its work item replaces %s", work.item.key, work.message_id)
        self.acks.add(work.message_id, acked_uids(work.item, forget=False, bound=False))

    def _retry_later(self, work: Work, *, soon: bool = False, result: str = ERROR) -> None:
        """Try the item again later; its attempt ended with `result`."""
        self._end_attempt(work, result)
        self.backlog.retry(work, soon=soon)
        self.tally.count("retries")

    def _unschedulable(self, work: Work, message: str) -> None:
        self.tally.count("unschedulable")
        self.notices.unschedulable(work, message)
        self._retry_later(work, result=UNSCHEDULABLE)

    def _profile_name(self, policy: str) -> str:
        return self.decider.profile_of(policy).name

    def _end_attempt(self, work: Work, result: str) -> None:
        """The item's scheduling attempt ended (`workers.attempts`)."""
        self.attempts.end(work, result, self._profile_name(work.item.policy))

    def _failed(self, work: Work, error: Exception) -> None:
        """Processing this pod raised (e.g. a plugin bug): say so on the pod once, and retry it with backoff."""
        self.tally.count("errors")
        self.notices.failed(work, error)
        self._retry_later(work)


def _prebinds(pod: PodView) -> bool:
    """Whether the pod has volume claims or ResourceClaims to write before its own binding (PreBind)."""
    return needs_prebind(pod) or needs_devices(pod)
