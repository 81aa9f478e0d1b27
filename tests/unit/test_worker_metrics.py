"""A worker's metrics under kube-scheduler's names: attempts by result and their durations, the end-to-end duration
from the time the dispatcher queued the pod, pending pods by queue, the Bind extension point, sampled plugin
durations that leave the decisions unchanged, and the preemption victims."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from hoss.framework.cycle import FilterResult, Profile, evaluate
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import PlacedPod
from hoss.framework.profiles import load_profiles
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.ledger.arguments import NodeRow
from hoss.ledger.client import Ledger
from hoss.queue import GangMember, WorkItem
from tests.kube_objects import node_row, pod_view, raw_node, raw_pod, table
from tests.unit.tls_apiserver import Seen, TLSApiserver
from workers.attempts import Attempts
from workers.intake import Work
from workers.metrics import ERROR, SCHEDULED, UNSCHEDULABLE, PendingCollector, SchedulerMetrics, attempts_label
from workers.preempt import Preemptor
from workers.timing import Sampler, TimedBinder, timed_profile

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> SchedulerMetrics:
    return SchedulerMetrics(registry)


def work(uid: str = "p1", *, queued_unix: float = 0.0, members: int = 0) -> Work:
    gang = tuple(GangMember(uid=f"{uid}-{i}", namespace="team", name=f"{uid}-{i}") for i in range(members))
    return Work(message_id="1-0", item=WorkItem(uid=uid, namespace="team", name=uid, policy="default",
                                                members=gang, queued_unix=queued_unix))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_a_bound_pod_ends_a_scheduled_attempt_and_its_end_to_end_time_runs_from_when_it_was_queued(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    clock, wall = Clock(100.0), Clock(5000.0)
    attempts = Attempts(metrics, clock=clock, wall=wall)
    item = work(queued_unix=4990.0)
    attempts.begin([item])
    clock.now, wall.now = 100.25, 5000.25
    attempts.end(item, SCHEDULED, "default")
    assert value(registry, "scheduler_schedule_attempts_total", result="scheduled", profile="default") == 1
    assert value(registry, "scheduler_scheduling_attempt_duration_seconds_sum", result="scheduled",
                 profile="default") == pytest.approx(0.25)
    assert value(registry, "scheduler_pod_scheduling_sli_duration_seconds_sum", attempts="1") == \
        pytest.approx(10.25)
    assert value(registry, "scheduler_pod_scheduling_attempts_sum") == 1


def test_a_pod_placed_on_its_third_attempt_counts_two_unschedulable_ones_first(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    attempts = Attempts(metrics, clock=Clock(1.0), wall=Clock(100.0))
    item = work(queued_unix=40.0)
    for result in (UNSCHEDULABLE, UNSCHEDULABLE, SCHEDULED):
        attempts.begin([item])
        attempts.end(item, result, "binpack")
    assert value(registry, "scheduler_schedule_attempts_total", result="unschedulable", profile="binpack") == 2
    assert value(registry, "scheduler_schedule_attempts_total", result="scheduled", profile="binpack") == 1
    assert value(registry, "scheduler_pod_scheduling_sli_duration_seconds_count", attempts="3") == 1
    assert value(registry, "scheduler_pod_scheduling_sli_duration_seconds_sum", attempts="3") == 60.0
    assert value(registry, "scheduler_pod_scheduling_attempts_sum") == 3


def test_an_attempt_ends_once_and_an_item_acknowledged_is_forgotten(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    attempts = Attempts(metrics)
    item = work()
    attempts.begin([item])
    attempts.end(item, ERROR, "default")
    attempts.end(item, ERROR, "default")  # e.g. a conflict, then its retry
    assert value(registry, "scheduler_schedule_attempts_total", result="error", profile="default") == 1
    attempts.begin([item])
    attempts.forget(item.item.uid)  # gone or stale: no attempt result
    attempts.end(item, SCHEDULED, "default")
    assert value(registry, "scheduler_schedule_attempts_total", result="scheduled", profile="default") == 0
    assert not attempts.began and not attempts.count and not attempts.last


def test_a_gang_counts_an_attempt_per_member_and_no_end_to_end_time_without_a_queue_time(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    attempts = Attempts(metrics)
    gang = work("g", members=3)
    attempts.begin([gang])
    attempts.end(gang, SCHEDULED, "gang-topology")
    assert value(registry, "scheduler_schedule_attempts_total", result="scheduled", profile="gang-topology") == 3
    assert value(registry, "scheduler_scheduling_attempt_duration_seconds_count", result="scheduled",
                 profile="gang-topology") == 3
    # Sent by a dispatcher that does not say when the pod was queued: no end-to-end time rather than a wrong one.
    assert value(registry, "scheduler_pod_scheduling_sli_duration_seconds_count", attempts="1") == 0


def test_the_end_to_end_duration_is_never_negative_when_the_clocks_disagree(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    attempts = Attempts(metrics, wall=Clock(1000.0))
    item = work(queued_unix=1003.0)  # the dispatcher's clock runs 3 s ahead
    attempts.begin([item])
    attempts.end(item, SCHEDULED, "default")
    assert value(registry, "scheduler_pod_scheduling_sli_duration_seconds_sum", attempts="1") == 0.0


def test_attempts_label_caps_at_fifteen_as_kube_scheduler_does() -> None:
    assert [attempts_label(n) for n in (1, 14, 15, 40)] == ["1", "14", "15+", "15+"]


def test_pending_pods_are_counted_by_kube_schedulers_queues(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    attempts = Attempts(metrics)
    ready = [work("r1"), work("r2", members=4)]
    fits_nowhere, lost_a_race, never_tried = work("u"), work("c"), work("n")
    for item, result in ((fits_nowhere, UNSCHEDULABLE), (lost_a_race, ERROR)):
        attempts.begin([item])
        attempts.end(item, result, "default")
    waiting = [fits_nowhere, lost_a_race, never_tried]
    registry.register(PendingCollector(lambda: attempts.queues(ready, waiting)))
    assert {queue: value(registry, "scheduler_pending_pods", queue=queue)
            for queue in ("active", "backoff", "unschedulable")} == {"active": 5, "backoff": 2, "unschedulable": 1}


@pytest.fixture
def profile() -> Profile:
    profiles, _default = load_profiles(POLICIES)
    return profiles["gpu"]


def nodes() -> NodeTable:
    return table(*(raw_node(f"n{i}", {"cpu": str(4 + i), "memory": "16Gi", "pods": "110",
                                     **({"nvidia.com/gpu": "8"} if i % 2 else {})}) for i in range(6)))


def test_a_timed_profile_decides_exactly_as_its_profile_and_times_each_plugin_call(
    registry: CollectorRegistry, metrics: SchedulerMetrics, profile: Profile
) -> None:
    pod = pod_view("train", {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "2"})
    table_ = nodes()
    plain = evaluate(profile, pod, table_)
    timed = evaluate(timed_profile(profile, metrics), pod, table_)
    assert np.array_equal(plain.feasible, timed.feasible) and plain.reasons == timed.reasons
    assert np.array_equal(plain.scores, timed.scores)
    for plugin in profile.filters:
        assert value(registry, "hoss_plugin_execution_duration_seconds_count", plugin=plugin.name,
                     extension_point="Filter", status="Success") == 1, plugin.name
    for scorer, _weight in profile.scores:
        scored = value(registry, "hoss_plugin_execution_duration_seconds_count", plugin=scorer.name,
                       extension_point="Score", status="Success")
        skipped = value(registry, "hoss_plugin_execution_duration_seconds_count", plugin=scorer.name,
                        extension_point="PreScore", status="Success")
        assert scored == 1 or skipped == 1, scorer.name


class Exploding:
    name = "Exploding"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        raise RuntimeError("a plugin bug")


def test_a_plugin_that_raises_is_timed_with_kube_schedulers_error_status(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    broken = Profile(name="broken", filters=[Exploding()], scores=[])
    with pytest.raises(RuntimeError, match="a plugin bug"):
        evaluate(timed_profile(broken, metrics), pod_view(), nodes())
    assert value(registry, "hoss_plugin_execution_duration_seconds_count", plugin="Exploding",
                 extension_point="Filter", status="Error") == 1


def test_the_sampler_times_one_evaluation_in_ten_and_reuses_its_timed_copy(
    metrics: SchedulerMetrics, profile: Profile
) -> None:
    sampler = Sampler(metrics, seed=7)
    chosen = [sampler.profile(profile) for _ in range(5000)]
    timed = [p for p in chosen if p is not profile]
    assert 400 <= len(timed) <= 600
    assert len({id(p) for p in timed}) == 1  # one timed copy per profile, made once


class Binder:
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    async def bind(self, pod: PodView, node: str) -> None:
        if self.refuse:
            raise KubeError("denied by the webhook", status=409)


async def test_each_binding_post_is_timed_as_kube_schedulers_bind_extension_point(
    registry: CollectorRegistry, metrics: SchedulerMetrics
) -> None:
    ok = TimedBinder(Binder(refuse=False), metrics, profile_of=lambda pod: "default")
    refused = TimedBinder(Binder(refuse=True), metrics, profile_of=lambda pod: "default")
    await ok.bind(pod_view(), "n1")
    await ok.bind(pod_view(), "n1")
    with pytest.raises(KubeError):
        await refused.bind(pod_view(), "n1")
    assert value(registry, "scheduler_framework_extension_point_duration_seconds_count", extension_point="Bind",
                 status="Success", profile="default") == 2
    assert value(registry, "scheduler_framework_extension_point_duration_seconds_count", extension_point="Bind",
                 status="Error", profile="default") == 1


# --- preemption victims, with a real ledger script (fakeredis) and an in-process apiserver --------------------

NODE = {"cpu": "4", "memory": "16Gi", "pods": "110"}


@pytest.fixture
def ledger_nodes() -> list[NodeRow]:
    return [node_row("n1", {"cpu": 4000, "memory": 16 << 30, "pods": 110}, described=False)]


@pytest.fixture
async def rest(tmp_path: Path) -> AsyncIterator[KubeREST]:
    async def respond(seen: Seen) -> web.StreamResponse:
        if seen.raw_path == "/apis/policy/v1/poddisruptionbudgets":
            return web.json_response({"kind": "PodDisruptionBudgetList", "items": []})
        return web.json_response({}, status=201 if seen.method == "POST" else 200)

    server = TLSApiserver(tmp_path, respond=respond)
    await server.start()
    async with await KubeREST.connect(str(server.kubeconfig())) as client:
        yield client
    await server.stop()


def placed(table_: NodeTable, names: Iterator[str], *, cpu: int) -> None:
    name = next(names)
    pod = PlacedPod(uid=f"uid-{name}", node="n1", namespace="team", labels={}, ports=(), name=name, priority=1,
                    request={"cpu": cpu, "pods": 1}, created="2026-01-01T00:00:00Z")
    table_.place_pod(pod)
    table_.add_used("n1", pod.request)


async def test_a_preemption_observes_its_victims_as_kube_scheduler_does(
    registry: CollectorRegistry, metrics: SchedulerMetrics, rest: KubeREST, ledger: Ledger
) -> None:
    profiles, default = load_profiles(POLICIES)
    preemptor = Preemptor(rest, ledger, record=lambda event: None, component="hoss-worker/w", hold_seconds=60,
                          metrics=metrics)
    table_ = table(raw_node("n1", NODE))
    names = (f"low-{i}" for i in itertools.count())
    for _ in range(4):
        placed(table_, names, cpu=1000)
    raw = raw_pod("urgent", {"cpu": "3"})
    raw["spec"]["priority"] = 100
    message = await preemptor.attempt(profiles[default], parse_pod(raw), raw, table_, "full.")
    assert "evicted 3 lower-priority pod(s)" in message, message
    assert value(registry, "scheduler_preemption_victims_count") == 1
    assert value(registry, "scheduler_preemption_victims_sum") == 3
    assert value(registry, "scheduler_preemption_victims_bucket", le="2.0") == 0
    assert value(registry, "scheduler_preemption_victims_bucket", le="4.0") == 1
