"""The dispatch core: the `Dispatcher`, the I/O shell of the leader's rounds and the follower's refresh.

A watch on unbound pods (field selector ``spec.nodeName=``) keeps the pending pods (`Dispatcher.pending`). The
leader sends every pending pod that is not in the dispatched map to the least-loaded live worker serving its policy
(one transaction writes the stream entry and the map), and every reclaim interval it takes the work of dead workers
back and sends it again. A pod whose policy no live worker serves waits, is retried every round, and gets a
``NoWorkerForPolicy`` event. Followers keep their watch and their view of Redis warm and take over on election.

The view the watches keep and its handlers are `ClusterView` (dispatcher/view.py), which `Dispatcher` extends. The
decisions are pure and live apart: the pending-pod book (dispatcher/pending.py), the gangs' memory and plan
(dispatcher/gangbook.py), the workers' loads and stalls (dispatcher/loads.py), why pods wait
(dispatcher/waiting.py), Reservation hints (dispatcher/hints.py); notices are written by dispatcher/notices.py and
the roles switched by dispatcher/roles.py. What stays here is the Redis and apiserver I/O around them.

Invariants:
- Only the leader writes the work queues and the dispatched map (workers acknowledge their own items), and each
  write carries its term (`hoss.queue.Fence`): once another leader took over, Redis refuses what this one still
  sends (`hoss.queue.Fenced`, counted in ``hoss_dispatcher_fenced_writes_total``), so a leader paused past its
  Lease changes nothing when it wakes. A new leader writes its term before its first round.
- A pod is in at most one worker's stream at a time: it is sent again only after it left the dispatched map,
  because its worker died and was reclaimed, because the map named a worker that no longer exists, or because
  its worker acknowledged it and the pod still looks pending ``informer_lag_seconds`` later (the watch may lag
  the binding; a worker hands back only what it cannot parse, so repeats back off exponentially).
- A dispatched uid leaves the map when its pod leaves the pending set (bound or deleted), or after
  ``informer_lag_seconds`` of not being pending at all (e.g. deleted while no leader watched).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
from redis.exceptions import RedisError

from dispatcher import dependencies
from dispatcher.gangbook import gang_key
from dispatcher.gangs import PLUGINS_API, GangKey, PodGroupSpec, count_members
from dispatcher.hints import with_hints
from dispatcher.intake import PendingPod, dispatch_order, item_uids, plan_work_items, single_item
from dispatcher.loads import Assignments, WorkerWatch, worker_figures, worker_loads
from dispatcher.metrics import DispatcherMetrics
from dispatcher.notices import Notifier
from dispatcher.podgroup_status import StatusChange, wall_time_text
from dispatcher.routing import choose_worker
from dispatcher.settings import DispatcherSettings
from dispatcher.view import ClusterView
from dispatcher.waiting import NO_WORKER_REASON, no_worker_message, waits_for
from hoss.errors import LedgerUnavailable
from hoss.kube.client import KubeError
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resourceclaims import pod_claims_problem
from hoss.queue import Fenced, WorkerInfo, WorkItem, WorkQueue

log = logging.getLogger(__name__)

FRESH_BEATS_SECONDS = 0.1
"""How old the workers' heartbeats may be when the dispatcher is about to pass over a busier worker (engaging one
with less outstanding); older ones are read again first, so they are read at most this often."""


@dataclass
class TickReport:
    """What one leader round did."""

    dead_workers: list[str] = field(default_factory=list)
    reclaimed: int = 0
    """Pod uids taken back from dead workers."""
    dispatched: int = 0
    """Pod uids sent to workers."""
    waiting: int = 0
    """Pods waiting for a worker after the round."""


def _always_leader() -> bool:
    return True


class Dispatcher(ClusterView):
    """The leader's rounds and the follower's read-only refresh, over the view its watches keep (`ClusterView`).

    One task runs `lead` or `follow` at a time; the informer's handlers run in another task and only touch the
    in-memory views, so no lock is needed (every method here runs between awaits of the one event loop).
    """

    def __init__(
        self,
        *,
        queue: WorkQueue,
        settings: DispatcherSettings,
        notifier: Notifier | None = None,
        metrics: DispatcherMetrics | None = None,
        rng: random.Random | None = None,
        is_leader: Callable[[], bool] = _always_leader,
        on_fenced: Callable[[int], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``on_fenced``: what to do when Redis refused a write because a leader of a later term (its argument)
        wrote since: the elector's `hoss.kube.leader.LeaderElector.raise_term`, which finds out whether this
        replica still holds the Lease (and raises its term past the stored one) or lost it (and steps down)."""
        super().__init__(settings=settings, metrics=metrics, clock=clock, wall=wall)
        self.queue = queue
        self._on_fenced = on_fenced
        self.notifier = notifier
        self.workers: list[WorkerInfo] = []
        """Live workers as of the last round."""
        self.watch = WorkerWatch()
        """The workers' progress and the sends since their last heartbeats (stalls, backlog)."""
        self._beats_read_at = -math.inf
        """When `workers` was last read from their heartbeats (``clock``)."""
        self.redis_error: str | None = None
        self._rng = rng if rng is not None else random.Random()
        self._is_leader = is_leader
        self._notices: asyncio.Task[None] | None = None
        m = self.metrics
        m.pending.set_function(lambda: len(self.pending))
        m.undispatched.set_function(self.undispatched_count)
        m.waiting.set_function(lambda: len(self.waiting))
        m.live_workers.set_function(lambda: len(self.workers))
        m.track_workers(lambda: worker_figures(self.workers, self.dispatched, self.watch, now_unix=self._wall()))

    # -- leader -------------------------------------------------------------------------------------------

    async def lead(self) -> None:
        """Dispatch and reclaim until cancelled: a full round every reclaim interval, new pods as they come."""
        await self.synced.wait()
        log.info("leading: %d pending pods to look at", len(self.pending))
        await self._guarded(self.queue.claim_term())  # a Redis that does not answer: the first write claims it
        try:
            await self._lead_rounds()
        finally:
            if self._notices is not None:
                self._notices.cancel()

    async def _lead_rounds(self) -> None:
        interval = self.settings.reclaim_interval_seconds
        while True:
            if await self._guarded(self.tick()):
                self.metrics.rounds.labels("leader").inc()
            deadline = self._clock() + interval
            while (remaining := deadline - self._clock()) > 0:
                try:
                    async with asyncio.timeout(remaining):
                        await self._wakeup.wait()
                except TimeoutError:
                    break
                self._wakeup.clear()
                # While Redis is down, new pods wait for the next full round, which also notices the recovery.
                if self.redis_error is None:
                    await self._guarded(self.dispatch_pending(fresh_only=True))

    async def tick(self) -> TickReport:
        """One leader round: reclaim dead workers' work, resync the dispatched map, send every pod that needs a
        worker, and tell pods that wait why."""
        report = await self.reclaim_step()
        await self._flush_gone()
        await self._sync_dispatched(leader=True)
        report.dispatched += await self.dispatch_pending()
        report.waiting = len(self.waiting)
        self._notify_waiting()
        return report

    async def reclaim_step(self) -> TickReport:
        """Refresh the live workers; take every unfinished item of each dead worker back and send its pods to
        live workers serving their policy (those no live worker serves wait)."""
        live, dead = await self.queue.workers()
        stalled = self._take_beats(live)
        report = TickReport(dead_workers=sorted(dead | stalled))
        reclaimed: dict[str, None] = {}
        for worker_id in report.dead_workers:
            if not self._is_leader():
                break
            items = await self.queue.reclaim(worker_id)
            uids = list(dict.fromkeys(
                [uid for item in items for uid in item_uids(item)]
                + [uid for uid, owner in self.dispatched.items() if owner == worker_id]
            ))
            # Until they are sent again these pods belong to nobody: a leader that dies right here leaves them
            # undispatched in Redis (its successor sends them), never assigned to a worker that is gone.
            await self.queue.forget(uids)
            self.book.reclaimed(uids)
            reclaimed.update(dict.fromkeys(uids))
            still_pending = sum(1 for uid in uids if uid in self.pending)
            log.warning(
                "worker %s %s: took back %d items (%d pods still pending)", worker_id,
                f"heartbeats but read nothing for {self.settings.stall_seconds:.0f}s" if worker_id in stalled
                else "stopped heartbeating", len(items), still_pending,
            )
            self.watch.forget(worker_id)
            self.metrics.dead_workers.inc()
            self.metrics.reclaimed_pods.inc(len(uids))
        report.reclaimed = len(reclaimed)
        pods = [self.pending[uid] for uid in reclaimed if uid in self.pending]
        report.dispatched = await self._send(sorted(pods, key=dispatch_order))
        return report

    def _take_beats(self, live: Sequence[WorkerInfo]) -> set[str]:
        """Route to the ``live`` workers that are neither stalled nor unhealthy; the stalled ones are returned."""
        stalled = self.watch.stalled(live, now=self._clock(), stall_seconds=self.settings.stall_seconds)
        self.workers = [w for w in live if w.id not in stalled and not w.unhealthy]
        self.watch.note_beats(live)
        self._beats_read_at = self._clock()
        return stalled

    async def _look_again(self) -> bool:
        """Read the workers' heartbeats again before passing over a busier worker or parking a pod no listed
        worker serves, unless they were read within FRESH_BEATS_SECONDS: the view is up to a round old, and a
        worker that started deciding since (its first beat with a rate comes right after its first batch) may well
        keep up, as a worker that started since may serve the pod. True when they were read."""
        if self._clock() - self._beats_read_at < FRESH_BEATS_SECONDS:
            return False
        live, _dead = await self.queue.workers()
        self._take_beats(live)
        return True

    async def dispatch_pending(self, *, fresh_only: bool = False) -> int:
        """Send the pending pods that need a worker (only those new since the last call, with ``fresh_only``)."""
        await self._resend_changed()
        pods = self.book.to_send(fresh_only=fresh_only, now=self._clock(),
                                 lag_seconds=self.settings.informer_lag_seconds)
        return await self._send(pods)

    async def _resend_changed(self) -> None:
        """Queue the new version of every dispatched pod that changed, behind the old one on the same worker
        (the worker drops the old one it holds, and one it is deciding reserves nothing: the ledger calls it
        stale). Gang members are left to their item:
        their bindings carry the uid, and the gang is re-sent whole if it fails."""
        for uid in self.book.take_changed():
            pod, worker = self.pending.get(uid), self.dispatched.get(uid)
            if pod is None or worker is None or gang_key(pod) is not None:
                continue
            item = self._with_hints(single_item(pod, attempt=self.book.attempts.get(uid, 0)))
            if await self.queue.resend_changed(worker, item):
                log.info("pod %s changed while queued on worker %s: its new version follows", pod.key, worker)

    async def _send(self, pods: Sequence[PendingPod]) -> int:
        pods = [pod for pod in pods if not self._waits_for_jobs(pod) and not self._waits_for_claims(pod)]
        if not pods:
            return 0
        plan = self.gangs.plan(pods, pending=self.pending, dispatched=self.dispatched, podgroups=self.podgroups,
                               attempts=self.book.attempts, now=self._clock())
        for waiter, reason, message in plan.waits:
            self._wait(waiter, reason=reason, message=message)
        by_uid = {pod.uid: pod for pod in pods}
        for pod in plan.singles:
            by_uid.setdefault(pod.uid, pod)  # members of a started gang that were not in this batch
        for item in plan.items:
            for member in item.members:
                by_uid.setdefault(member.uid, self.pending[member.uid])
        loads = worker_loads(self.workers, self.dispatched)
        backlog = self.watch.backlog(self.workers, now_unix=self._wall())
        sent = 0
        batch: list[tuple[str, WorkItem]] = []

        def choose(policy: str) -> WorkerInfo | None:
            return choose_worker(self.workers, policy, loads=loads, rng=self._rng,
                                 pack_depth=self.settings.pack_depth, backlog=backlog)

        singles = plan_work_items(plan.singles, attempts=self.book.attempts)
        for item in [*map(self._with_hints, singles), *self._gangs_ready(plan.items)]:
            uids = item_uids(item)
            worker = choose(item.policy)
            if ((worker is None or any(count > loads.get(worker.id, 0) for count in loads.values()))
                    and await self._look_again()):
                backlog = self.watch.backlog(self.workers, now_unix=self._wall())
                for worker_id, assigned in batch:  # chosen in this burst, not sent yet
                    backlog[worker_id] = backlog.get(worker_id, 0) + len(item_uids(assigned))
                worker = choose(item.policy)
            if worker is None:
                for uid in uids:
                    self._wait(by_uid[uid])
                continue
            batch.append((worker.id, item))
            loads[worker.id] = loads.get(worker.id, 0) + len(uids)
            backlog[worker.id] = backlog.get(worker.id, 0) + len(uids)
        if not self._is_leader():
            log.info("no longer leader: stopped dispatching")
            return 0
        # One transaction per burst, in chunks so that a huge backlog does not make one giant reply.
        for start in range(0, len(batch), 500):
            await self.queue.enqueue_many(batch[start:start + 500])
        now, wall = self._clock(), self._wall()
        for worker_id, item in batch:
            uids = item_uids(item)
            self.watch.sent(worker_id, len(uids), now=now, now_unix=wall)
            for uid in uids:
                self.dispatched[uid] = worker_id
                self.waiting.pop(uid, None)
                self.metrics.dispatch_latency.observe(max(now - by_uid[uid].seen_at, 0.0))
            current = self.pending.get(item.uid)
            if not item.members and current is not None and current.digest != by_uid[item.uid].digest:
                # The pod changed while its item was on its way (its claim was made, a namespace relabelled): the
                # worker holds the older version, so the new one follows it, as for any dispatched pod that changes.
                # (Compared with the pending pod the item was made from: an item carrying Reservation hints has a
                # version of its own.)
                self.book.changed[item.uid] = None
                self.wake()
            self.rate.dispatched(len(uids))
            self.metrics.dispatched.labels(item.policy).inc(len(uids))
            log.debug("dispatched %s (policy %s, attempt %d) to worker %s", item.key, item.policy, item.attempt,
                      worker_id)
            sent += len(uids)
        return sent

    # -- dependencies and Reservations ----------------------------------------------------------------------

    def _waits_for_jobs(self, pod: PendingPod) -> bool:
        """True (and the pod told why, or failed) when its ``hoss.io/depends-on`` Jobs and PodGroups do not allow
        it yet (dispatcher/dependencies.py)."""
        annotation = pod.annotations.get(dependencies.ANNOTATION)
        if annotation is None:
            return False
        own = next((str(r.get("name")) for r in pod.owner_references if r.get("kind") == "Job"), None)
        blocked = dependencies.verdict(annotation, own_job=own, jobs=self.jobs.get(pod.namespace, {}),
                                       podgroups=self.podgroup_states.get(pod.namespace, {}))
        if blocked is None:
            return False
        reason, message = blocked
        if reason == dependencies.FAILED:
            if self.settings.failed_dependency == "fail" and self.notifier is not None:
                self._fail(pod, reason, f"{message}; the pod is failed (its Job counts the failure)")
                return True
            message += "; the pod waits (re-create the dependency to retry)"
        self._wait(pod, reason=reason, message=message)
        return True

    def _waits_for_claims(self, pod: PendingPod) -> bool:
        """True (and the pod told why) when a ResourceClaim of the pod is not there to use yet: not made yet, missing,
        being deleted or not the pod's. kube-scheduler holds such a pod back before any attempt (DynamicResources'
        PreEnqueue); so does the dispatcher, and sends it once the claim's change changes its form (a gang's
        members thus go whole, with their claims)."""
        problem = _claims_problem(pod)
        if not problem:
            return False
        self._wait(pod, reason="Unschedulable", message=problem)
        return True

    def _gangs_ready(self, items: Sequence[WorkItem]) -> list[WorkItem]:
        """The gang items whose members' ResourceClaims are all there to use; the others are held back whole (a
        member pending since before this batch may still wait for its claim), each member told why."""
        ready = []
        for item in items:
            members = [self.pending[m.uid] for m in item.members if m.uid in self.pending]
            waiting = next((member for member in members if _claims_problem(member)), None)
            if waiting is None:
                ready.append(item)
                continue
            for member in members:
                if not self._waits_for_claims(member):
                    self._wait(member, reason="Unschedulable",
                               message=f"gang {item.key}: waits for the ResourceClaims of member {waiting.key}")
        return ready

    def _fail(self, pod: PendingPod, reason: str, message: str) -> None:
        """Set the pod Failed in the background, once; the pod watch then drops it (a terminal phase)."""
        if pod.uid in self._failing or self.notifier is None:
            return
        self.waiting.pop(pod.uid, None)
        log.info("pod %s fails: %s", pod.key, message)
        notifier = self.notifier

        async def fail() -> None:
            written = False
            try:
                written = await notifier.failed(pod, reason=reason, message=message)
            finally:
                if not written:  # looked at again next round; once written, kept until the pod watch drops it
                    self._failing.pop(pod.uid, None)
        self._failing[pod.uid] = asyncio.get_running_loop().create_task(fail(), name=f"fail-{pod.uid}")

    def _with_hints(self, item: WorkItem) -> WorkItem:
        """The item, its compact pod carrying the Available Reservations that own the pod (dispatcher/hints.py)."""
        pod = self.pending.get(item.uid)
        if pod is None or not any(r.available for r in self.reservations.values()) or item.uid in self.reservations:
            return item
        return with_hints(item, pod, [r for r in self.reservations.values() if r.available])

    # -- gangs ----------------------------------------------------------------------------------------------

    async def refresh_gangs(
        self, list_members: Callable[[str, str], Awaitable[list[Json]]],
        write_status: Callable[[GangKey, PodGroupSpec, StatusChange], Awaitable[None]] | None = None,
    ) -> None:
        """Count the members of every gang that changed, and of every gang whose PodGroup is not in a final phase
        (bound, running, succeeded, failed), write its PodGroup's status when that changed
        (dispatcher/podgroup_status.py), and wake the rounds when a count did. A gang without a PodGroup is
        counted until it has no pending member and its counts stood still for a few rounds."""
        pending_gangs = self._pending_gangs()
        for key in self.gangs.due(self.podgroups, now=self._clock()):
            selector = self.gangs.selectors.get(key, None if key.api == PLUGINS_API else "")
            if selector is None:
                self.gangs.dirty.pop(key, None)
                continue
            counted_at = self._clock()
            try:
                counts = count_members(await list_members(key.namespace, selector), key)
            except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("cannot count the members of gang %s: %s", key, error)
                continue
            changed = self.gangs.counted(key, counts, at=counted_at)
            if changed:
                self.wake()
            group = self.podgroups.get(key)
            if group is not None and write_status is not None:
                change = self.gangs.status_due(key, group, counts, now=wall_time_text(self._wall()))
                if change is not None:
                    try:
                        await write_status(key, group, change)
                    except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                        log.warning("cannot write the status of PodGroup %s: %s", key, error)
                    else:
                        self.gangs.status_written(key, change.status)
            self.gangs.settle(key, changed=changed, pending=key in pending_gangs, tracked=group is not None)

    # -- waiting pods and their notices ---------------------------------------------------------------------

    def _wait(self, pod: PendingPod, *, reason: str = NO_WORKER_REASON, message: str = "") -> None:
        if self.waiting.hold(pod, reason=reason, message=message, now_unix=self._wall()):
            log.info("%s %s waits: %s", waits_for(pod), pod.key,
                     message or no_worker_message(pod.policy, what=waits_for(pod)))

    async def drain_notices(self) -> None:
        """Wait for the NoWorkerForPolicy notices started by the last round."""
        if self._notices is not None:
            await asyncio.gather(self._notices, return_exceptions=True)

    def _notify_waiting(self) -> None:
        """Start the notices that are due, in the background: a slow apiserver must not hold up dispatching."""
        if self.notifier is None or (self._notices is not None and not self._notices.done()):
            return
        pods = self.waiting.due(self.pending, now=self._clock(),
                                interval=self.settings.no_worker_event_interval_seconds)
        if not pods:
            return
        self._notices = asyncio.create_task(self._send_notices(self.notifier, pods), name="no-worker-notices")

    async def _send_notices(self, notifier: Notifier, pods: Sequence[PendingPod]) -> None:
        notices = [self.waiting.notice(pod) for pod in pods]
        await asyncio.gather(*(
            notifier.waiting(pod, reason=reason, message=message)
            for pod, (reason, message) in zip(pods, notices, strict=True)
        ))
        self.metrics.no_worker_events.inc(len(pods))

    # -- the dispatched map against Redis's ---------------------------------------------------------------

    async def _flush_gone(self) -> None:
        if not self.book.gone:
            return
        uids = sorted(self.book.gone)
        await self.queue.mark_gone(uids)
        self.book.forget_gone(uids)

    async def _sync_dispatched(self, *, leader: bool) -> None:
        """Replace the in-memory map with Redis's; as leader, also forget entries that name no live worker and
        entries whose pod has not been pending for ``informer_lag_seconds``."""
        current = await self.queue.dispatched()
        now = self._clock()
        self.book.acknowledged(current, now=now)
        if leader:
            lag = self.settings.informer_lag_seconds
            forget, stale = self.book.stale_entries(current, live={worker.id for worker in self.workers}, now=now,
                                                    lag_seconds=lag)
            if forget:
                await self.queue.forget(forget)
                log.info("forgot %d dispatched entries (%d naming no live worker, %d not pending for %.0fs)",
                         len(forget), len(forget) - stale, stale, lag)
                self.book.forgotten(forget, current)
        self.book.dispatched = Assignments(current)

    # -- follower -----------------------------------------------------------------------------------------

    async def follow(self) -> None:
        """Keep the view of workers and the dispatched map current without writing anything, until cancelled."""
        while True:
            if await self._guarded(self.observe()):
                self.metrics.rounds.labels("follower").inc()
            await asyncio.sleep(self.settings.reclaim_interval_seconds)

    async def observe(self) -> None:
        live, _dead = await self.queue.workers()
        self.workers = live
        await self._sync_dispatched(leader=False)
        # The leader does these from its own watch; a replica that takes over starts with a full round.
        self.book.fresh.clear()
        self.book.gone.clear()
        self.waiting.clear()

    async def _guarded(self, step: Awaitable[object]) -> bool:
        """Run one step; a Redis failure pauses (logged once per outage) instead of stopping the dispatcher."""
        try:
            await step
        except Fenced as error:
            self.metrics.fenced_writes.inc()
            log.warning("%s", error)
            if error.newer is not None and self._on_fenced is not None:
                await self._on_fenced(error.newer)
            return False
        except (LedgerUnavailable, RedisError) as error:
            if self.redis_error is None:
                log.warning("Redis unreachable; dispatching paused until it answers: %s", error)
            self.redis_error = str(error) or type(error).__name__
            self.metrics.redis_errors.inc()
            return False
        if self.redis_error is not None:
            log.info("Redis answers again; dispatching resumed")
            self.redis_error = None
        return True


def _claims_problem(pod: PendingPod) -> str:
    """Why a ResourceClaim of the pod is not there to use ('' when none is missing)."""
    if '"resourceClaims"' not in pod.compact:
        return ""
    return pod_claims_problem(compact.decode(pod.compact))
