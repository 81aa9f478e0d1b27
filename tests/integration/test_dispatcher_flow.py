"""The dispatcher's rounds against a real redis-server: dispatch, reclaim from dead workers, waiting, /status.

Workers are simulated with the protocol's own calls (heartbeat, read, ack); the pending-pod watch is simulated
by calling the dispatcher's informer handlers with raw pods; no apiserver is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import random
import socket
import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio
from aiohttp import web

from dispatcher import reservations as dispatcher_reservations
from dispatcher.core import FRESH_BEATS_SECONDS, Dispatcher
from dispatcher.leader import LeaderElector
from dispatcher.roles import cancel_and_wait, run_roles
from dispatcher.routing import POLICY_LABEL
from dispatcher.server import ServiceState, build_app
from dispatcher.status import SystemStatus
from dispatcher.waiting import no_worker_message
from hoss.ledger.client import Ledger
from hoss.queue import WorkerInfo, WorkItem, WorkQueue, queue_key
from tests.integration.dispatching import (
    ALIVE_SECONDS,
    Json,
    RecordingNotifier,
    beat,
    dead,
    make_dispatcher,
    pending_pod,
    rounds,
    settings,
    stream_uids,
)
from tests.waiting import until

pytestmark = pytest.mark.integration

DYING_SECONDS = 0.4
"""The heartbeat TTL of a worker about to die."""


async def test_dead_workers_items_go_to_a_live_worker_none_lost_none_twice(queue: WorkQueue) -> None:
    pods = [pending_pod(n) for n in range(12)]
    by_uid = {pod["metadata"]["uid"]: pod for pod in pods}
    dispatcher = await make_dispatcher(queue, pods, pack_depth=4)  # each worker takes 4, then they are spread
    await beat(queue, "a", ttl=DYING_SECONDS)
    await beat(queue, "b")

    first = await dispatcher.tick()

    on_a, on_b = await stream_uids(queue, "a"), await stream_uids(queue, "b")
    assert first.dispatched == 12
    assert on_a and on_b, "both workers get a share"
    assert sorted(on_a + on_b) == sorted(by_uid)
    # Worker a takes three items, binds one of them (acknowledged; the watch sees the pod leave), then dies
    # holding two delivered-but-unacknowledged items and the rest undelivered.
    await queue.ensure_group("a")
    delivered = await queue.read("a", count=3, block_ms=50)
    done_id, done = delivered[0]
    await queue.ack("a", done_id, [done.uid])
    await dispatcher.on_event("DELETED", by_uid[done.uid])
    await dead(queue, "a")
    await beat(queue, "b")

    report = await dispatcher.reclaim_step()

    assert report.dead_workers == ["a"]
    assert report.reclaimed == len(on_a) - 1
    assert not await queue.redis.exists(queue_key("a"))
    on_b_now = await stream_uids(queue, "b")
    assert len(on_b_now) == len(set(on_b_now)), "no pod twice on one worker"
    assert set(on_b_now) == set(by_uid) - {done.uid}, "every unfinished pod is on the live worker"
    assert await queue.dispatched() == dict.fromkeys(set(by_uid) - {done.uid}, "b")
    assert dispatcher.throughput().bound_total == 1


async def test_live_worker_consuming_while_another_dies_sees_every_pod_exactly_once(queue: WorkQueue) -> None:
    pods = [pending_pod(n) for n in range(40)]
    by_uid = {pod["metadata"]["uid"]: pod for pod in pods}
    dispatcher = await make_dispatcher(queue, pods, pack_depth=8)  # both workers get a share
    await beat(queue, "doomed", ttl=DYING_SECONDS)
    await beat(queue, "steady")
    await queue.ensure_group("steady")
    bound: list[str] = []
    stop = asyncio.Event()

    async def steady_worker() -> None:
        while not stop.is_set():
            await beat(queue, "steady")
            for message_id, item in await queue.read("steady", count=4, block_ms=20):
                bound.append(item.uid)
                await queue.ack("steady", message_id, [item.uid])
                await dispatcher.on_event("DELETED", by_uid[item.uid])

    consumer = asyncio.create_task(steady_worker())
    try:
        await dispatcher.tick()
        assert await stream_uids(queue, "doomed"), "the doomed worker got a share before it died"

        async def all_bound() -> tuple[bool, str]:
            await dispatcher.tick()  # a round takes the doomed worker's pods back once its heartbeat expired
            return len(bound) == len(pods), f"{len(bound)}/{len(pods)} bound"

        await until(all_bound, timeout=20, what="every pod to be bound, the doomed worker's too")
    finally:
        stop.set()
        await consumer

    assert sorted(bound) == sorted(by_uid), "every pod bound exactly once"
    assert await queue.dispatched() == {}
    assert dispatcher.pending == {}


async def test_pod_waits_for_a_worker_serving_its_policy_and_is_told_once_per_interval(queue: WorkQueue) -> None:
    notifier = RecordingNotifier()
    dispatcher = await make_dispatcher(queue, [pending_pod(1, policy="gpu"), pending_pod(2)], notifier=notifier)
    await beat(queue, "cpu")

    first = await dispatcher.tick()
    await dispatcher.drain_notices()
    await dispatcher.tick()
    await dispatcher.drain_notices()

    assert first.dispatched == 1 and first.waiting == 1
    assert await stream_uids(queue, "cpu") == ["uid-2"]
    assert notifier.notices == [("team/pod-1", "no live hoss worker serves policy 'gpu'; the pod waits until one does")]
    assert no_worker_message("gpu") == notifier.notices[0][1]
    [row] = dispatcher.queue_status().waiting_for_worker
    assert (row.pod, row.policy) == ("team/pod-1", "gpu")

    await beat(queue, "gpu-worker", policies=("gpu",))
    await dispatcher.tick()

    assert await stream_uids(queue, "gpu-worker") == ["uid-1"]
    assert dispatcher.queue_status().waiting_for_worker == []
    assert dispatcher.queue_status().undispatched == 0


async def test_reclaimed_pods_whose_policy_nobody_serves_wait_and_are_not_lost(queue: WorkQueue) -> None:
    notifier = RecordingNotifier()
    dispatcher = await make_dispatcher(queue, [pending_pod(n, policy="gpu") for n in range(3)], notifier=notifier)
    await beat(queue, "gpu-1", policies=("gpu",), ttl=DYING_SECONDS)
    await dispatcher.tick()
    await dead(queue, "gpu-1")

    report = await dispatcher.tick()
    await dispatcher.drain_notices()

    assert report.reclaimed == 3 and report.waiting == 3
    assert await queue.dispatched() == {}, "pods in nobody's stream are not marked dispatched"
    assert len(notifier.notices) == 3
    await beat(queue, "gpu-2", policies=("gpu",))
    await dispatcher.tick()
    assert sorted(await stream_uids(queue, "gpu-2")) == ["uid-0", "uid-1", "uid-2"]


async def test_new_leader_does_not_resend_what_the_old_one_dispatched(queue: WorkQueue) -> None:
    pods = [pending_pod(n) for n in range(6)]
    await beat(queue, "a")
    await beat(queue, "b")
    old = await make_dispatcher(queue, pods)
    await old.tick()
    before = {w: await stream_uids(queue, w) for w in ("a", "b")}

    new = await make_dispatcher(queue, pods)
    report = await new.tick()

    assert report.dispatched == 0
    assert {w: await stream_uids(queue, w) for w in ("a", "b")} == before


async def test_leader_that_died_between_reclaim_and_resend_loses_nothing(queue: WorkQueue) -> None:
    pods = [pending_pod(n) for n in range(8)]
    await beat(queue, "a", ttl=DYING_SECONDS)
    await beat(queue, "b")
    old = await make_dispatcher(queue, pods)
    await old.tick()
    on_a = await stream_uids(queue, "a")
    await dead(queue, "a")
    await beat(queue, "b")
    # The old leader took a's stream and died before forgetting or re-sending anything.
    assert len(await queue.reclaim("a")) == len(on_a)

    successor = await make_dispatcher(queue, pods)
    await successor.tick()

    assert sorted(await stream_uids(queue, "b")) == sorted(p["metadata"]["uid"] for p in pods)
    assert await queue.dispatched() == {p["metadata"]["uid"]: "b" for p in pods}


async def test_pod_bound_elsewhere_is_forgotten_and_counted(queue: WorkQueue) -> None:
    pods = [pending_pod(1), pending_pod(2)]
    await beat(queue, "a")
    dispatcher = await make_dispatcher(queue, pods)
    await dispatcher.tick()

    await dispatcher.on_event("DELETED", pods[0])
    await dispatcher.tick()

    assert await queue.dispatched() == {"uid-2": "a"}
    assert dispatcher.throughput().bound_total == 1
    assert dispatcher.throughput().dispatched_total == 2
    assert dispatcher.throughput().bound_per_second_1m == pytest.approx(1 / 60, abs=1e-3)


async def test_foreign_finished_and_deleting_pods_are_not_dispatched(queue: WorkQueue) -> None:
    foreign = pending_pod(1) | {"spec": {"schedulerName": "default-scheduler"}}
    finished = pending_pod(2) | {"status": {"phase": "Succeeded"}}
    deleting = pending_pod(3)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-22T08:00:00Z"
    malformed: Json = {"metadata": {"name": "no-uid"}, "spec": {"schedulerName": "hoss"}}
    await beat(queue, "a")
    dispatcher = await make_dispatcher(queue, [foreign, finished, deleting, malformed, pending_pod(4)])

    await dispatcher.tick()

    assert await stream_uids(queue, "a") == ["uid-4"]


# --- leadership ----------------------------------------------------------------------------------------------


class MemoryLease:
    """A Lease nobody else contends for."""

    name = "hoss-dispatcher"
    namespace = "hoss-system"

    def __init__(self) -> None:
        self.lease: Json | None = None
        self.version = 0

    async def read(self) -> Json | None:
        return copy.deepcopy(self.lease)

    async def create(self, body: Json) -> Json:
        return self._store(body)

    async def replace(self, body: Json) -> Json:
        return self._store(body)

    def _store(self, body: Json) -> Json:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def memory_elector(identity: str = "test-dispatcher") -> LeaderElector:
    return LeaderElector(MemoryLease(), identity=identity, lease_duration_seconds=15, renew_deadline_seconds=10,
                         renew_interval_seconds=2)


async def test_only_the_leader_dispatches_and_losing_the_lease_stops_it(queue: WorkQueue) -> None:
    elector = memory_elector()
    dispatcher = await make_dispatcher(queue, [pending_pod(1)], is_leader=lambda: elector.is_leader,
                                       reclaim_interval_seconds=0.05)
    await beat(queue, "a")
    roles = asyncio.create_task(run_roles(dispatcher, elector))
    try:
        await until(lambda: rounds(dispatcher, "follower") >= 2, timeout=10, what="two rounds as a follower")
        assert await stream_uids(queue, "a") == [], "a follower sends nothing"

        await elector.try_once()

        async def sent() -> tuple[bool, str]:
            uids = await stream_uids(queue, "a")
            return uids == ["uid-1"], f"on a: {uids}"

        await until(sent, timeout=10, what="the new leader to send the pending pod")

        await elector.release()
        await dispatcher.on_event("ADDED", pending_pod(2))
        followed = rounds(dispatcher, "follower")
        await until(lambda: rounds(dispatcher, "follower") >= followed + 2, timeout=10,
                    what="two more rounds as a follower")
        assert await stream_uids(queue, "a") == ["uid-1"], "after losing the Lease nothing more is sent"
    finally:
        roles.cancel()
        await asyncio.gather(roles, return_exceptions=True)


async def test_stopping_a_role_that_swallows_a_cancellation_still_ends_it() -> None:
    """redis-py can swallow a cancellation while it opens a connection; the role must end all the same."""
    swallowed = 0
    running = asyncio.Event()

    async def role_that_swallows_once() -> None:
        nonlocal swallowed
        running.set()
        with contextlib.suppress(asyncio.CancelledError):  # the swallowing, as redis-py does it
            await asyncio.sleep(10)
        swallowed += 1
        await asyncio.sleep(10)

    role = asyncio.create_task(role_that_swallows_once())
    await until(running.is_set, timeout=10, what="the role to run")

    await asyncio.wait_for(cancel_and_wait(role, retry_seconds=0.01), timeout=5)

    assert role.cancelled() and swallowed == 1


# --- /status --------------------------------------------------------------------------------------------------


async def serve_status(state: ServiceState) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port, *_ = runner.addresses[0]
    return runner, f"http://{host}:{port}"


async def test_status_reports_workers_queues_ledger_and_summed_resolver_verdicts(
    queue: WorkQueue, client: redis.asyncio.Redis
) -> None:
    await beat(queue, "a", queue_depth=2, in_flight=1, counters={"bound": 5, "conflicts": 2})
    await beat(queue, "b", counters={"conflicts": 3})
    await beat(queue, "gone", ttl=DYING_SECONDS)
    ledger = Ledger(client)
    await ledger.rebuild(nodes=[("n1", {"cpu": 4000, "memory": 8 << 30}, {}), ("n2", {"cpu": 2000}, {})], bound=[])
    for instance, verdicts, denials in [
        ("r1", {"reserved": 10, "conflict": 1}, [{"at": 100.0, "pod": "team/x", "node": "n1", "username": "u",
                                                   "reason": "conflict", "message": "no room"}]),
        ("r2", {"reserved": 5, "fits": 2}, [{"at": 200.0, "pod": "team/y", "node": "n2", "username": "u",
                                              "reason": "conflict", "message": "no room either"}]),
    ]:
        await client.hset(f"{{hoss}}:resolver:{instance}", mapping={
            "verdicts": json.dumps(verdicts), "recent_denials": json.dumps(denials), "updated_unix": "123.5"})
    notifier = RecordingNotifier()
    elector = memory_elector()
    await elector.try_once()
    dispatcher = await make_dispatcher(queue, [pending_pod(1), pending_pod(2, policy="gpu")], notifier=notifier)
    await dispatcher.tick()
    await dead(queue, "gone")
    await beat(queue, "late")  # after the leader's last read: alive, not yet on its routing list
    runner, url = await serve_status(ServiceState(
        settings=dispatcher.settings, dispatcher=dispatcher, elector=elector, redis=client, ledger=ledger))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/status") as response:
                assert response.status == 200
                status = SystemStatus.model_validate(await response.json())
            async with http.get(f"{url}/metrics") as response:
                metrics = await response.text()
            async with http.get(f"{url}/healthz") as response:
                assert await response.text() == "ok"
    finally:
        await runner.cleanup()

    assert status.version == 1 and status.leader and status.identity == "test-dispatcher"
    assert status.redis == "ok"
    workers = {w.id: w for w in status.workers}
    assert set(workers) == {"a", "b", "gone", "late"}
    assert not workers["gone"].alive and workers["gone"].heartbeat_age_seconds is None
    assert {w.id: (w.alive, w.routed) for w in status.workers} == {
        "a": (True, True), "b": (True, True), "gone": (False, False), "late": (True, False)}
    assert (workers["a"].queue_depth, workers["a"].in_flight) == (2, 1)
    assert sum(w.outstanding for w in status.workers) == 1
    assert status.conflicts == 5
    assert status.queues.pending_total == 2 and status.queues.undispatched == 1
    assert [w.pod for w in status.queues.waiting_for_worker] == ["team/pod-2"]
    assert status.throughput.dispatched_total == 1
    assert status.ledger is not None and status.ledger.ready and status.ledger.nodes == 2
    assert status.ledger.resources["cpu"].alloc == 6000
    assert status.resolver is not None
    assert status.resolver.verdicts == {"conflict": 1, "fits": 2, "reserved": 15}
    assert [d.pod for d in status.resolver.recent_denials] == ["team/y", "team/x"]
    assert 'hoss_dispatcher_pods_dispatched_total{policy="default"} 1.0' in metrics
    assert "hoss_dispatcher_pending_pods 2.0" in metrics


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_status_answers_when_redis_is_unreachable(queue: WorkQueue) -> None:
    unreachable = redis.asyncio.Redis.from_url(
        f"redis://127.0.0.1:{closed_port()}/0", decode_responses=True, socket_connect_timeout=0.5, retry=None
    )
    dispatcher = await make_dispatcher(WorkQueue(unreachable), [pending_pod(1)])
    elector = memory_elector()
    runner, url = await serve_status(ServiceState(
        settings=dispatcher.settings, dispatcher=dispatcher, elector=elector, redis=unreachable,
        ledger=Ledger(unreachable)))
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/status") as response:
            assert response.status == 200
            status = SystemStatus.model_validate(await response.json())
    finally:
        await runner.cleanup()
        await unreachable.aclose()

    assert status.redis.startswith("unreachable: ")
    assert not status.leader
    assert status.workers == [] and status.ledger is None and status.resolver is None
    assert status.queues.pending_total == 1


async def test_dispatch_round_against_unreachable_redis_pauses_instead_of_failing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unreachable = redis.asyncio.Redis.from_url(
        f"redis://127.0.0.1:{closed_port()}/0", decode_responses=True, socket_connect_timeout=0.5, retry=None
    )
    dispatcher = await make_dispatcher(WorkQueue(unreachable), [pending_pod(1)], reclaim_interval_seconds=0.05)
    lead = asyncio.create_task(dispatcher.lead())

    def failed_rounds() -> float:
        return dispatcher.metrics.registry.get_sample_value("hoss_dispatcher_redis_errors_total") or 0.0

    try:
        await until(lambda: failed_rounds() >= 2 or lead.done(), timeout=10, what="two rounds failing on Redis")
        assert not lead.done(), "the rounds go on"
        assert dispatcher.redis_error is not None
        assert rounds(dispatcher, "leader") == 0
    finally:
        lead.cancel()
        await asyncio.gather(lead, return_exceptions=True)
        await unreachable.aclose()
    assert list(dispatcher.pending) == ["uid-1"], "the pod is still there to be sent when Redis is back"
    assert len([r for r in caplog.records if "Redis unreachable" in r.getMessage()]) == 1, "logged once per outage"


def namespace(name: str, **labels: str) -> Json:
    return {"metadata": {"name": name, "labels": labels}}


async def test_namespace_selectors_are_resolved_into_the_work_item_and_a_label_change_resends_it(
        queue: WorkQueue) -> None:
    selective = {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}},
                 "namespaceSelector": {"matchLabels": {"env": "prod"}}}
    raw = pending_pod(1)
    raw["spec"]["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [selective]}}
    plain = pending_pod(2)
    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(11))
    await dispatcher.on_namespace_list([namespace("team", env="dev"), namespace("db", env="prod")])
    await dispatcher.on_list([raw, plain])
    await beat(queue, "a")
    assert (await dispatcher.tick()).dispatched == 2

    def selected(fields: Any) -> Any:
        return json.loads(WorkItem.decode(fields).pod)["namespaces"]

    entries: Any = await queue.redis.xrange(queue_key("a"))
    forms = {WorkItem.decode(fields).uid: selected(fields) for _id, fields in entries}
    key = '{"matchLabels":{"env":"prod"}}'
    assert forms == {"uid-1": {"labels": {"env": "dev"}, "selected": {key: ["db"]}},
                     "uid-2": {"labels": {"env": "dev"}}}
    # a namespace unrelated to pod 2 gains env=prod: pod 1's selector now selects it, pod 2 is unchanged
    await dispatcher.on_namespace_event("MODIFIED", namespace("cache", env="prod"))
    await dispatcher.tick()
    entries = await queue.redis.xrange(queue_key("a"))
    resent = [(WorkItem.decode(fields).uid, selected(fields)) for _id, fields in entries[2:]]
    assert resent == [("uid-1", {"labels": {"env": "dev"}, "selected": {key: ["cache", "db"]}})]
    # the pods' own namespace changes its labels: both forms carry the new ones
    await dispatcher.on_namespace_event("MODIFIED", namespace("team", env="prod"))
    await dispatcher.tick()
    entries = await queue.redis.xrange(queue_key("a"))
    resent = [(WorkItem.decode(fields).uid, selected(fields)["labels"]) for _id, fields in entries[3:]]
    assert sorted(resent) == [("uid-1", {"env": "prod"}), ("uid-2", {"env": "prod"})]


async def test_a_reservation_no_worker_serves_is_told_so_and_placed_once_a_worker_appears(queue: WorkQueue) -> None:
    """A Pending Reservation whose template's policy has no live worker gets the pods' NoWorkerForPolicy notice
    (KubeNotifier turns it into a Warning event on the Reservation and a Scheduled=False condition), and is sent
    to a worker of that policy once one beats."""
    notifier = RecordingNotifier()
    dispatcher = await make_dispatcher(queue, [], notifier=notifier)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reservation = {
        "metadata": {"name": "slot", "uid": "uid-slot", "creationTimestamp": created},
        "spec": {"template": {"metadata": {"namespace": "team", "labels": {POLICY_LABEL: "gpu"}}, "spec": {
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "train"}}}], "allocateOnce": False},
    }
    dispatcher_reservations.observe(dispatcher, "ADDED", reservation)
    await beat(queue, "cpu")
    report = await dispatcher.tick()
    await dispatcher.drain_notices()
    assert report.waiting == 1 and await stream_uids(queue, "cpu") == []
    assert notifier.notices == [
        ("team/slot", "no live hoss worker serves policy 'gpu'; the Reservation waits until one does")]
    await beat(queue, "gpu-worker", policies=("gpu",))
    await dispatcher.tick()
    assert await stream_uids(queue, "gpu-worker") == ["uid-slot"]
    assert dispatcher.queue_status().waiting_for_worker == []


@pytest.mark.parametrize(("rate", "spilled"), [(2000.0, False), (100.0, True)])
async def test_pods_stay_on_the_engaged_worker_while_it_decides_as_fast_as_they_come(
    queue: WorkQueue, rate: float, spilled: bool
) -> None:
    """Pods arrive 50 every 0.1 s (500 a second). A worker that decides 2,000 a second keeps up: every pod goes to
    it, and the idle worker is never engaged. One that decides 100 a second falls behind: past the pack depth the
    dispatcher engages the other worker."""
    wall = [0.0]
    dispatcher = Dispatcher(queue=queue, settings=settings(pack_depth=64), rng=random.Random(12),
                            wall=lambda: wall[0])
    dispatcher.synced.set()
    await queue.heartbeat(WorkerInfo(id="engaged", policies=["default"], decide_rate=rate), ttl_seconds=ALIVE_SECONDS)
    await queue.heartbeat(WorkerInfo(id="idle", policies=["default"]), ttl_seconds=ALIVE_SECONDS)
    await dispatcher.reclaim_step()
    wall[0] = max(worker.heartbeat_unix for worker in dispatcher.workers)

    for wave in range(10):
        wall[0] += 0.1
        for n in range(wave * 50, wave * 50 + 50):
            await dispatcher.on_event("ADDED", pending_pod(n))
        await dispatcher.dispatch_pending(fresh_only=True)

    owners = list((await queue.dispatched()).values())
    assert len(owners) == 500
    if spilled:
        assert owners.count("idle") >= 200, "a worker that falls behind gets help"
    else:
        assert owners.count("engaged") == 500, "a worker that keeps up is not joined by an idle one"


async def test_before_engaging_another_worker_the_dispatcher_reads_the_busy_ones_rate_again(queue: WorkQueue) -> None:
    """A worker just started has no measured rate: the dispatcher counts every pod sent to it as waiting. It beats
    as soon as its first batch is decided; past the pack depth the dispatcher reads that beat before it engages
    an idle worker, finds the busy one keeping up, and keeps sending to it. With a view too fresh to read again,
    the same pods spill."""
    wall = [0.0]
    clock = [100.0]
    dispatcher = Dispatcher(queue=queue, settings=settings(pack_depth=64), rng=random.Random(12),
                            wall=lambda: wall[0], clock=lambda: clock[0])
    dispatcher.synced.set()
    await queue.heartbeat(WorkerInfo(id="w2", policies=["default"]), ttl_seconds=ALIVE_SECONDS)
    await queue.heartbeat(WorkerInfo(id="w1", policies=["default"]), ttl_seconds=ALIVE_SECONDS)
    await dispatcher.reclaim_step()
    wall[0] = max(worker.heartbeat_unix for worker in dispatcher.workers) + 0.01
    for n in range(50):
        await dispatcher.on_event("ADDED", pending_pod(n))
    await dispatcher.dispatch_pending(fresh_only=True)
    assert set((await queue.dispatched()).values()) == {"w2"}

    # w2 decided its first batch and beat at once, with its rate; the dispatcher has not read that beat yet.
    await queue.heartbeat(WorkerInfo(id="w2", policies=["default"], decide_rate=2000.0), ttl_seconds=ALIVE_SECONDS)
    wall[0] += 0.05
    clock[0] += 0.05  # the last read is 0.05 s old: too fresh to read again
    for n in range(50, 70):
        await dispatcher.on_event("ADDED", pending_pod(n))
    await dispatcher.dispatch_pending(fresh_only=True)
    owners = await queue.dispatched()
    assert [owners[f"uid-{n}"] for n in range(64, 70)] == ["w1"] * 6, "an unmeasured worker's sends all count"

    wall[0] += 0.1
    clock[0] += 0.1
    for n in range(70, 120):
        await dispatcher.on_event("ADDED", pending_pod(n))
    await dispatcher.dispatch_pending(fresh_only=True)
    owners = await queue.dispatched()
    assert [owners[f"uid-{n}"] for n in range(70, 120)] == ["w2"] * 50, "read again: w2 keeps up"


async def test_a_worker_that_started_since_the_last_round_gets_new_pods_before_the_next_round(
    queue: WorkQueue,
) -> None:
    """The routing list is read once a round (a second by default). A worker that starts between rounds must not
    leave the pods that arrive meanwhile waiting for the next round: before parking a pod no listed worker serves,
    the dispatcher reads the heartbeats again (unless it read them less than FRESH_BEATS_SECONDS ago)."""
    clock = [100.0]
    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(13), clock=lambda: clock[0])
    dispatcher.synced.set()
    await dispatcher.tick()  # a round with no worker at all
    assert dispatcher.workers == []

    await beat(queue, "fresh")
    clock[0] += FRESH_BEATS_SECONDS / 2  # read too recently to read again: the pod waits for a worker
    await dispatcher.on_event("ADDED", pending_pod(1))
    assert await dispatcher.dispatch_pending(fresh_only=True) == 0
    assert [row.pod for row in dispatcher.queue_status().waiting_for_worker] == ["team/pod-1"]

    clock[0] += FRESH_BEATS_SECONDS
    for n in range(2, 6):
        await dispatcher.on_event("ADDED", pending_pod(n))
    assert await dispatcher.dispatch_pending(fresh_only=True) == 4, "sent at once, no round in between"
    assert await stream_uids(queue, "fresh") == [f"uid-{n}" for n in range(2, 6)]
    assert [worker.id for worker in dispatcher.workers] == ["fresh"]

    await dispatcher.tick()  # the pod that arrived before the worker was seen goes with the next round
    assert sorted(await stream_uids(queue, "fresh")) == sorted(f"uid-{n}" for n in range(1, 6))
    assert dispatcher.queue_status().waiting_for_worker == []


async def test_what_a_pod_s_claim_needs_is_in_its_work_item_and_the_claim_binding_resends_it(
        queue: WorkQueue) -> None:
    """A pod whose Immediate claim is not bound yet goes out with kube-scheduler's reason in its form; once the
    claim is bound, its new version follows on the same worker with the PV's node affinity; a pod without volumes
    is not sent again."""
    claimed = pending_pod(1)
    claimed["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                                  {"name": "tmp", "emptyDir": {}}]
    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(11))
    claim: Json = {"metadata": {"name": "data", "namespace": "team", "uid": "c1", "resourceVersion": "1"},
             "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Pending"}}
    await dispatcher.storage_handlers("classes").on_list([{"metadata": {"name": "fast"}, "provisioner": "x",
                                                           "volumeBindingMode": "Immediate"}])
    await dispatcher.storage_handlers("claims").on_list([claim])
    await dispatcher.on_list([claimed, pending_pod(2)])
    await beat(queue, "a")
    assert (await dispatcher.tick()).dispatched == 2

    def storage(fields: Any) -> Any:
        return json.loads(WorkItem.decode(fields).pod).get("storage")

    entries: Any = await queue.redis.xrange(queue_key("a"))
    assert {WorkItem.decode(fields).uid: storage(fields) for _id, fields in entries} == {
        "uid-1": {"problem": "pod has unbound immediate PersistentVolumeClaims"}, "uid-2": None}
    affinity = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-3"]}]}]}}
    await dispatcher.storage_handlers("volumes").on_event("ADDED", {
        "metadata": {"name": "pv1", "resourceVersion": "2"},
        "spec": {"storageClassName": "fast", "capacity": {"storage": "1Gi"}, "nodeAffinity": affinity}})
    bound = {**claim, "metadata": {**claim["metadata"], "resourceVersion": "3",
                                   "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
             "spec": {**claim["spec"], "volumeName": "pv1"}}
    await dispatcher.storage_handlers("claims").on_event("MODIFIED", bound)
    await dispatcher.tick()
    entries = await queue.redis.xrange(queue_key("a"))
    resent = [(WorkItem.decode(fields).uid, storage(fields)) for _id, fields in entries[2:]]
    assert resent == [("uid-1", {"bound": [{"claim": "data", "pv": "pv1", "zones": {},
                                            "affinity": affinity["required"]["nodeSelectorTerms"]}],
                                 "delayed": []})]


class ClaimMadeWhileSending(WorkQueue):
    """A work queue during whose first send the ephemeral-volume controller makes the pod's claim (the watch event
    reaches the dispatcher while the item is on its way)."""

    def __init__(self, client: redis.asyncio.Redis, claim: Json) -> None:
        super().__init__(client)
        self.claim: Json | None = claim
        self.dispatcher: Dispatcher | None = None

    async def enqueue_many(self, assignments: Any) -> list[str]:
        sent = await super().enqueue_many(assignments)
        if self.claim is not None and self.dispatcher is not None:
            claim, self.claim = self.claim, None
            await self.dispatcher.storage_handlers("claims").on_event("ADDED", claim)
        return sent


async def test_a_pod_that_changes_while_its_item_is_on_its_way_gets_its_new_version_sent(
        client: redis.asyncio.Redis) -> None:
    """The claim of a generic ephemeral volume is made right after its pod; when the claim's event arrives while
    the pod's first item is being sent, the item with the claim follows it on the same worker."""
    pod = pending_pod(1)
    pod["spec"]["volumes"] = [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]
    claim: Json = {"metadata": {"name": "pod-1-scratch", "namespace": "team", "uid": "c1",
                                "ownerReferences": [{"uid": "uid-1", "controller": True}]},
                   "spec": {"storageClassName": "later", "accessModes": ["ReadWriteOnce"]}}
    queue = ClaimMadeWhileSending(client, claim)
    dispatcher = Dispatcher(queue=queue, settings=settings(), rng=random.Random(11))
    queue.dispatcher = dispatcher
    await dispatcher.storage_handlers("classes").on_list([{"metadata": {"name": "later"}, "provisioner": "x",
                                                           "volumeBindingMode": "WaitForFirstConsumer"}])
    await dispatcher.on_list([pod])
    await beat(queue, "a")
    assert (await dispatcher.tick()).dispatched == 1
    await dispatcher.tick()
    entries: Any = await queue.redis.xrange(queue_key("a"))
    forms = [json.loads(WorkItem.decode(fields).pod)["storage"] for _id, fields in entries]
    assert [list(form) for form in forms] == [["problem"], ["bound", "delayed"]]
    assert forms[1]["delayed"][0]["claim"] == "pod-1-scratch"
