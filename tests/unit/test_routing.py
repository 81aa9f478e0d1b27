"""Routing: which policy a pod asks for, and which live worker gets it."""

from __future__ import annotations

import random

from dispatcher.routing import POLICY_LABEL, choose_worker, policy_of
from hoss.queue import WorkerInfo
from tests.kube_objects import Json, raw_pod


def pod(labels: dict[str, str] | None = None) -> Json:
    return raw_pod("p", labels=labels)


def test_policy_label_selects_the_profile() -> None:
    assert policy_of(pod({POLICY_LABEL: "gpu"}), default="default") == "gpu"


def test_pod_without_policy_label_gets_the_default() -> None:
    assert policy_of(pod(), default="default") == "default"
    assert policy_of(pod({"app": "web"}), default="binpack") == "binpack"
    assert policy_of({"metadata": {"labels": None}}, default="default") == "default"


def test_empty_policy_label_counts_as_absent() -> None:
    assert policy_of(pod({POLICY_LABEL: ""}), default="default") == "default"


def test_only_workers_serving_the_policy_are_chosen() -> None:
    cpu = WorkerInfo(id="cpu", policies=["default"])
    gpu = WorkerInfo(id="gpu", policies=["gpu", "gang"])
    rng = random.Random(1)
    for _ in range(50):
        chosen = choose_worker([cpu, gpu], "gpu", loads={"cpu": 0, "gpu": 1000}, rng=rng)
        assert chosen is gpu


def test_less_loaded_of_two_workers_wins() -> None:
    busy = WorkerInfo(id="busy", policies=["default"])
    idle = WorkerInfo(id="idle", policies=["default"])
    rng = random.Random(2)
    for _ in range(50):
        assert choose_worker([busy, idle], "default", loads={"busy": 7, "idle": 2}, rng=rng) is idle
        assert choose_worker([idle, busy], "default", loads={"busy": 7, "idle": 2}, rng=rng) is idle


def test_heartbeat_load_counts_for_a_worker_the_dispatcher_has_no_count_for() -> None:
    busy = WorkerInfo(id="busy", policies=["default"], queue_depth=40, in_flight=8)
    idle = WorkerInfo(id="idle", policies=["default"], queue_depth=1)
    rng = random.Random(3)
    for _ in range(50):
        assert choose_worker([busy, idle], "default", loads={}, rng=rng) is idle


def test_no_worker_when_none_serves_the_policy() -> None:
    workers = [WorkerInfo(id="a", policies=["default"]), WorkerInfo(id="b", policies=["binpack"])]
    assert choose_worker(workers, "gpu", loads={}, rng=random.Random(4)) is None
    assert choose_worker([], "default", loads={}, rng=random.Random(4)) is None


def test_power_of_two_choices_spreads_a_burst_over_all_workers() -> None:
    workers = [WorkerInfo(id=f"w{i}", policies=["default"]) for i in range(4)]
    loads = {w.id: 0 for w in workers}
    rng = random.Random(5)
    for _ in range(400):
        chosen = choose_worker(workers, "default", loads=loads, rng=rng)
        assert chosen is not None
        loads[chosen.id] += 1
    assert max(loads.values()) - min(loads.values()) <= 10


def test_packing_fills_the_most_loaded_unfilled_worker_then_spreads() -> None:
    workers = [WorkerInfo(id=f"w{i}", policies=["default"]) for i in range(4)]
    workers.append(WorkerInfo(id="gpu", policies=["gpu"]))
    loads = {w.id: 0 for w in workers}
    rng = random.Random(6)
    order = []
    for _ in range(8):
        chosen = choose_worker(workers, "default", loads=loads, rng=rng, pack_depth=4)
        assert chosen is not None
        order.append(chosen.id)
        loads[chosen.id] += 1
    # a light load stays on one worker until it holds pack_depth pods, then on the next
    assert order[:4] == [order[0]] * 4
    assert order[4:] == [order[4]] * 4 and order[4] != order[0]
    assert loads["gpu"] == 0, "only workers serving the policy are packed"

    loads = {"w0": 1, "w1": 3, "w2": 0, "w3": 9}
    chosen = choose_worker(workers, "default", loads=loads, rng=rng, pack_depth=4)
    assert chosen is not None and chosen.id == "w1", "the most loaded of the workers below the depth"

    for _ in range(400):  # past the depth everywhere: power of two choices spreads the rest
        chosen = choose_worker(workers, "default", loads=loads, rng=rng, pack_depth=4)
        assert chosen is not None
        loads[chosen.id] += 1
    spread = [loads[f"w{i}"] for i in range(4)]
    assert max(spread) - min(spread) <= 12, spread


def test_pack_depth_zero_spreads_every_pod() -> None:
    workers = [WorkerInfo(id=f"w{i}", policies=["default"]) for i in range(4)]
    loads = {w.id: 0 for w in workers}
    rng = random.Random(7)
    for _ in range(8):
        chosen = choose_worker(workers, "default", loads=loads, rng=rng, pack_depth=0)
        assert chosen is not None
        loads[chosen.id] += 1
    assert max(loads.values()) < 8, "without packing a burst is not kept on one worker"


def test_a_worker_that_keeps_up_takes_every_pod_and_another_is_engaged_only_when_it_falls_behind() -> None:
    workers = [WorkerInfo(id=f"w{i}", policies=["default"]) for i in range(3)]
    loads = {"w0": 0, "w1": 50, "w2": 0}  # w1 already holds pods (outstanding, most of them decided)
    backlog = {"w0": 0, "w1": 0, "w2": 0}
    rng = random.Random(8)

    def send(n: int) -> list[str]:
        chosen = []
        for _ in range(n):
            worker = choose_worker(workers, "default", loads=loads, rng=rng, pack_depth=4, backlog=backlog)
            assert worker is not None
            chosen.append(worker.id)
            loads[worker.id] += 1
            backlog[worker.id] += 1
        return chosen

    assert send(4) == ["w1"] * 4, "the engaged worker takes pods until its backlog reaches the depth"
    second = send(4)
    assert second in (["w0"] * 4, ["w2"] * 4), "past it, one more worker is engaged, up to the depth"
    third = send(4)
    assert third in (["w0"] * 4, ["w2"] * 4) and third != second
    rest = send(300)
    spread = [backlog[f"w{i}"] for i in range(3)]
    assert max(spread) - min(spread) <= 12, "all past the depth: the smaller backlogs win"
    assert set(rest) == {"w0", "w1", "w2"}

    backlog.update(w1=0)  # w1 decided its backlog: it is the engaged worker again, the others' backlogs stand
    assert send(4) == ["w1"] * 4, "back to the engaged worker once it caught up"


def test_a_worker_with_decisions_waiting_is_passed_over_even_with_fewer_pods_outstanding() -> None:
    workers = [WorkerInfo(id="slow", policies=["default"], ready=40),
               WorkerInfo(id="quick", policies=["default"], ready=0)]
    loads = {"slow": 60, "quick": 10}
    chosen = choose_worker(workers, "default", loads=loads, rng=random.Random(9), pack_depth=32,
                           backlog={"slow": 40, "quick": 0})
    assert chosen is not None and chosen.id == "quick"
    # Without the dispatcher's estimate the heartbeat's ready count is the backlog.
    chosen = choose_worker(workers, "default", loads=loads, rng=random.Random(9), pack_depth=32, backlog={})
    assert chosen is not None and chosen.id == "quick"
