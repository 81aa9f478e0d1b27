"""The dashboard's views in /status: nodes, GPU fragmentation, pools, throughput history, pending reasons, gangs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from dispatcher.gangs import GangKey, PodGroupSpec
from dispatcher.intake import parse_pending_pod
from dispatcher.status import GPU_RESOURCE, QueueStatus, SystemStatus, ThroughputStatus
from dispatcher.statusviews import (
    PENDING_SHOWN,
    build_status,
    gang_view,
    gpu_fragmentation,
    node_statuses,
    pending_view,
    pool_statuses,
)
from dispatcher.throughput import BoundRate
from hoss.ledger.results import LedgerSnapshot, NodeSnapshot

GIB = 1 << 30


def gpu_node(used: int, *, alloc: int = 8, pool: str = "gpu") -> NodeSnapshot:
    return NodeSnapshot(
        alloc={"cpu": 64_000, "memory": 512 * GIB, GPU_RESOURCE: alloc},
        used={"cpu": 4_000 * used, "memory": 16 * GIB * used, GPU_RESOURCE: used},
        assumed=0, bound=used, labels={"hoss.io/pool": pool},
    )


def cpu_node(used_cpu: int, *, pool: str | None = "cpu", assumed: int = 0, bound: int = 0) -> NodeSnapshot:
    return NodeSnapshot(
        alloc={"cpu": 16_000, "memory": 64 * GIB, "pods": 110},
        used={"cpu": used_cpu, "memory": GIB, "pods": assumed + bound},
        assumed=assumed, bound=bound, labels={"hoss.io/pool": pool} if pool else {"kubernetes.io/os": "linux"},
    )


def snapshot(**nodes: NodeSnapshot) -> LedgerSnapshot:
    return LedgerSnapshot(ready=True, epoch="e1", nodes={name.replace("_", "-"): node for name, node in nodes.items()})


# --- nodes, GPUs, pools ------------------------------------------------------------------------------------


def test_each_node_shows_its_pool_allocatable_used_and_entry_counts_by_name() -> None:
    view = node_statuses(snapshot(b=cpu_node(1500, assumed=1, bound=2), a=cpu_node(0, pool=None)))

    assert [n.name for n in view] == ["a", "b"]
    assert view[0].pool is None
    b = view[1]
    assert (b.pool, b.assumed, b.bound) == ("cpu", 1, 2)
    assert b.alloc == {"cpu": 16_000, "memory": 64 * GIB, "pods": 110}
    assert b.used == {"cpu": 1500, "memory": GIB, "pods": 3}


def test_gpu_fragmentation_counts_free_partly_used_and_full_nodes_and_the_gpus_stranded_on_partly_used_ones() -> None:
    gpu = gpu_fragmentation(snapshot(
        free1=gpu_node(0), free2=gpu_node(0), half=gpu_node(4), seven=gpu_node(7), full=gpu_node(8),
        cpu=cpu_node(8000),
    ))

    assert (gpu.gpu_nodes, gpu.fully_free_nodes, gpu.partly_used_nodes, gpu.full_nodes) == (5, 2, 2, 1)
    assert gpu.stranded_gpus == 4 + 1
    assert (gpu.gpus, gpu.used_gpus) == (40, 19)


def test_an_overcommitted_gpu_node_counts_as_full_and_strands_nothing() -> None:
    gpu = gpu_fragmentation(snapshot(over=gpu_node(9)))

    assert (gpu.full_nodes, gpu.partly_used_nodes, gpu.stranded_gpus) == (1, 0, 0)


def test_a_cluster_without_gpus_reports_no_gpu_nodes() -> None:
    gpu = gpu_fragmentation(snapshot(a=cpu_node(0), b=cpu_node(16_000)))

    assert gpu.gpu_nodes == gpu.gpus == gpu.stranded_gpus == 0


def test_pools_sum_their_nodes_by_name_with_unpooled_nodes_last() -> None:
    pools = pool_statuses(snapshot(
        c1=cpu_node(1000), c2=cpu_node(3000), g1=gpu_node(2), g2=gpu_node(0), loose=cpu_node(500, pool=None),
    ))

    assert [(p.name, p.nodes) for p in pools] == [("cpu", 2), ("gpu", 2), (None, 1)]
    cpu, gpu, loose = pools
    assert (cpu.resources["cpu"].alloc, cpu.resources["cpu"].used) == (32_000, 4000)
    assert GPU_RESOURCE not in cpu.resources
    assert (gpu.resources[GPU_RESOURCE].alloc, gpu.resources[GPU_RESOURCE].used) == (16, 2)
    assert loose.resources["cpu"].used == 500


# --- throughput history ------------------------------------------------------------------------------------


def test_history_gives_bound_per_second_for_each_finished_interval_in_unix_time() -> None:
    rate = BoundRate(interval_seconds=5.0)
    for at in (100.5, 101.0, 102.0, 103.0, 104.0, 111.0):  # 5 in [100, 105), none in [105, 110), 1 in [110, 115)
        rate.bound(at)

    history = rate.history(116.0, now_unix=1_000_016.0)

    assert [(s.at, s.bound_per_second) for s in history] == [
        (1_000_005.0, 1.0), (1_000_010.0, 0.0), (1_000_015.0, 0.2),
    ]


def test_history_leaves_out_the_interval_still_running() -> None:
    rate = BoundRate(interval_seconds=5.0)
    rate.history(100.0, now_unix=100.0)
    rate.bound(101.0)

    assert rate.history(104.0, now_unix=104.0) == []
    assert [s.bound_per_second for s in rate.history(105.0, now_unix=105.0)] == [0.2]


def test_history_starts_when_the_dispatcher_first_looked_and_reaches_back_ten_minutes_at_most() -> None:
    rate = BoundRate(history_seconds=600.0, interval_seconds=5.0)
    rate.history(0.0, now_unix=0.0)
    rate.bound(2.0)
    for second in range(3000, 3010):
        rate.bound(second + 0.5)

    history = rate.history(3010.0, now_unix=3010.0)

    assert len(history) == 120
    assert history[0].at == 2415.0 and history[-1].at == 3010.0
    assert [s.bound_per_second for s in history[-2:]] == [1.0, 1.0]
    assert sum(s.bound_per_second for s in history[:-2]) == 0.0


def test_throughput_view_keeps_its_totals_and_one_minute_rate_beside_the_history() -> None:
    rate = BoundRate(interval_seconds=5.0)
    rate.dispatched(3)
    for at in (1.0, 2.0, 3.0):
        rate.bound(at)

    view = rate.view(10.0, now_unix=500.0)

    assert (view.dispatched_total, view.bound_total, view.bound_per_second_1m) == (3, 3, 0.05)
    assert view.history_interval_seconds == 5.0
    assert [(s.at, s.bound_per_second) for s in view.history] == [(495.0, 0.6), (500.0, 0.0)]


# --- pending pods and gangs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str = ""
    namespace: str = "team"
    policy: str = "default"
    seen_at: float = 50.0
    created_unix: float | None = 1000.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable_reason: str | None = None
    unschedulable_message: str | None = None
    scheduling_group: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pending(*pods: Pod, dispatched: Mapping[str, str] | None = None,
            waiting: Mapping[str, tuple[str, str]] | None = None, limit: int = PENDING_SHOWN) -> dict[str, str]:
    view = pending_view(
        pods, dispatched=dispatched or {}, waiting=waiting or {}, now_unix=2000.0, now_monotonic=100.0, limit=limit
    )
    return {row.pod: f"{row.reason}: {row.message}" for row in view.pods}


def test_a_pending_pod_waits_for_the_reason_its_podscheduled_condition_gives() -> None:
    pod = Pod("big", uid="u1", unschedulable_reason="Unschedulable",
              unschedulable_message="0/3 nodes are available: 3 Insufficient cpu.")

    assert pending(pod, dispatched={"u1": "w1"}) == {
        "team/big": "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."}


def test_without_a_condition_the_pod_is_dispatched_to_its_worker_or_waits_for_one() -> None:
    assert pending(Pod("sent", uid="u1"), Pod("new", uid="u2"), dispatched={"u1": "w7"}) == {
        "team/sent": "Dispatched: dispatched to w7",
        "team/new": "WaitingForWorker: waiting for a worker",
    }


def test_the_dispatchers_own_reason_to_hold_a_pod_back_comes_before_an_older_condition() -> None:
    pod = Pod("member", uid="u1", unschedulable_reason="Unschedulable", unschedulable_message="stale")

    assert pending(pod, waiting={"u1": ("GangIncomplete", "gang team/g: 1 of 3 required members are pending")}) == {
        "team/member": "GangIncomplete: gang team/g: 1 of 3 required members are pending"}


def test_pending_lists_the_oldest_pods_up_to_the_cap_and_counts_them_all() -> None:
    pods = [Pod(f"p{i}", uid=f"u{i}", created_unix=1000.0 - i) for i in range(5)]

    view = pending_view(pods, dispatched={}, waiting={}, now_unix=2000.0, now_monotonic=100.0, limit=3)

    assert view.total == 5
    assert [row.pod for row in view.pods] == ["team/p4", "team/p3", "team/p2"]
    assert view.pods[0].since == 996.0


def test_a_pod_without_creation_time_waits_since_the_dispatcher_first_saw_it() -> None:
    view = pending_view([Pod("p", created_unix=None, seen_at=40.0)], dispatched={}, waiting={}, now_unix=2000.0,
                        now_monotonic=100.0)

    assert view.pods[0].since == 1940.0


def test_gangs_count_pending_and_dispatched_members_and_how_many_they_need() -> None:
    light = {"pod-group.scheduling.sigs.k8s.io/name": "light", "pod-group.scheduling.sigs.k8s.io/min-available": "3"}
    crd = {"scheduling.x-k8s.io/pod-group": "train"}
    pods = [
        Pod("l0", uid="l0", labels=light), Pod("l1", uid="l1", labels=light),
        Pod("t0", uid="t0", labels=crd), Pod("t1", uid="t1", labels=crd), Pod("t2", uid="t2", labels=crd),
        Pod("v0", uid="v0", namespace="ml", annotations={"scheduling.k8s.io/group-name": "vol"}),
        Pod("solo", uid="s"),
    ]

    gangs = gang_view(pods, dispatched={"t0": "w1", "t1": "w1", "s": "w2"},
                      podgroups={GangKey("team", "train"): PodGroupSpec(min_member=4)})

    assert [(g.gang, g.pending, g.dispatched, g.min_available) for g in gangs] == [
        ("ml/vol", 1, 0, None), ("team/light", 2, 0, 3), ("team/train", 3, 2, 4),  # vol: no Volcano PodGroup yet
    ]
    assert pending(*pods)["team/t0"].startswith("WaitingForWorker")
    view = pending_view(pods, dispatched={}, waiting={}, now_unix=0.0, now_monotonic=0.0)
    assert {row.pod: row.gang for row in view.pods}["team/l0"] == "team/light"


def test_a_gang_whose_podgroup_is_not_seen_yet_needs_an_unknown_number() -> None:
    pods = [Pod("t0", uid="t0", labels={"scheduling.x-k8s.io/pod-group": "train"})]

    assert [g.min_available for g in gang_view(pods, dispatched={}, podgroups={})] == [None]


def test_pending_pod_parsing_keeps_the_podscheduled_false_condition_and_creation_time() -> None:
    raw = {
        "metadata": {"uid": "u1", "namespace": "team", "name": "big", "creationTimestamp": "2024-05-01T10:00:00Z"},
        "spec": {"schedulerName": "hoss"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient cpu."},
        ]},
    }

    pod = parse_pending_pod(raw, scheduler_names={"hoss"}, default_policy="default", seen_at=1.0)

    assert pod is not None
    assert (pod.unschedulable_reason, pod.unschedulable_message) == (
        "Unschedulable", "0/3 nodes are available: 3 Insufficient cpu.")
    assert pod.created_unix == 1714557600.0


def test_a_malformed_condition_or_creation_time_does_not_stop_a_pod_from_being_placed() -> None:
    raw = {
        "metadata": {"uid": "u1", "namespace": "team", "name": "p", "creationTimestamp": "yesterday"},
        "spec": {"schedulerName": "hoss"},
        "status": {"conditions": ["PodScheduled", {"type": "PodScheduled", "status": "False", "message": 7}]},
    }

    pod = parse_pending_pod(raw, scheduler_names={"hoss"}, default_policy="default", seen_at=1.0)

    assert pod is not None
    assert (pod.created_unix, pod.unschedulable_reason, pod.unschedulable_message) == (None, None, None)


# --- the document ------------------------------------------------------------------------------------------


def status(snap: LedgerSnapshot | None) -> SystemStatus:
    return build_status(
        identity="d1", leader=True, leader_identity="d1", redis_error=None if snap else "connection refused",
        queues=QueueStatus(pending_total=0, undispatched=0, waiting_for_worker=[]),
        throughput=ThroughputStatus(bound_per_second_1m=0.0, dispatched_total=0, bound_total=0),
        snapshot=snap, now_unix=1234.5,
    )


def test_status_carries_nodes_gpus_and_pools_from_the_ledger_snapshot() -> None:
    document = status(snapshot(g=gpu_node(3), c=cpu_node(0)))

    assert [n.name for n in document.nodes] == ["c", "g"]
    assert document.gpu is not None and document.gpu.stranded_gpus == 5
    assert [p.name for p in document.pools] == ["cpu", "gpu"]
    assert document.generated_unix == 1234.5


def test_without_redis_the_ledger_views_are_empty_not_made_up() -> None:
    document = status(None)

    assert document.redis == "unreachable: connection refused"
    assert (document.nodes, document.gpu, document.pools) == ([], None, [])


def test_a_version_1_document_from_before_the_dashboard_fields_still_reads_and_unknown_fields_are_ignored() -> None:
    old = status(None).model_dump(mode="json")
    for added in ("nodes", "gpu", "pools", "pending", "gangs", "generated_unix"):
        del old[added]
    del old["throughput"]["history"]
    old["field_from_a_newer_dispatcher"] = {"x": 1}

    document = SystemStatus.model_validate(old)

    assert document.version == 1 and document.nodes == [] and document.pending.total == 0


@pytest.mark.parametrize(("model", "name"), [
    ("SystemStatus", "nodes"), ("SystemStatus", "gpu"), ("SystemStatus", "pools"), ("SystemStatus", "pending"),
    ("SystemStatus", "gangs"), ("ThroughputStatus", "history"), ("GpuStatus", "stranded_gpus"),
    ("PendingPodStatus", "message"), ("NodeStatus", "assumed"), ("GangStatus", "min_available"),
])
def test_the_json_schema_documents_the_dashboard_fields(model: str, name: str) -> None:
    schema = SystemStatus.model_json_schema()
    definition = schema if model == "SystemStatus" else schema["$defs"][model]
    assert definition["properties"][name].get("description"), (model, name)
