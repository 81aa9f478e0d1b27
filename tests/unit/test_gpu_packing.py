"""GPU packing: GPU pods fill partly used GPU nodes, CPU pods stay off GPU nodes, and the fragmentation figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hoss.framework.cycle import FilterPlugin, Placement, Profile, Unschedulable, decide
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.gpu import CpuOffGpuNodes, GpuPacking, gpu_fragmentation
from hoss.framework.profiles import load_profiles
from tests.kube_objects import CPU_NODE, GPU_NODE, pod_view, raw_node, table

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"
GPU = "nvidia.com/gpu"
FIT: list[FilterPlugin] = [NodeResourcesFit()]


def placed(decision: Placement | Unschedulable) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision


def packing_scores(plugin: GpuPacking | CpuOffGpuNodes, requests: dict[str, str], nodes: NodeTable) -> dict[str, float]:
    feasible = np.ones(len(nodes), dtype=np.bool_)
    raw = plugin.score(pod_view(requests=requests), nodes, feasible)
    return dict(zip(nodes.names, plugin.normalize(raw, feasible).tolist(), strict=True))


def gpu_nodes(used: dict[str, int]) -> NodeTable:
    nodes = table(*(raw_node(name, GPU_NODE) for name in used))
    for name, gpus in used.items():
        nodes.set_used(name, {GPU: gpus})
    return nodes


# --- GpuPacking ------------------------------------------------------------------------------------------------


def test_gpu_packing_prefers_the_node_left_with_fewest_free_gpus() -> None:
    nodes = gpu_nodes({"empty": 0, "half": 4, "nearly-full": 6})

    scores = packing_scores(GpuPacking(), {"cpu": "1", GPU: "2"}, nodes)

    # Leftover 6, 2 and 0 of at most 8: 100 * (1 - leftover/8).
    assert scores == {"empty": 25.0, "half": 75.0, "nearly-full": 100.0}


def test_gpu_packing_counts_leftover_gpus_across_node_sizes() -> None:
    nodes = table(raw_node("four", {**GPU_NODE, GPU: "4"}), raw_node("eight", GPU_NODE))
    nodes.set_used("eight", {GPU: 5})

    scores = packing_scores(GpuPacking(), {GPU: "2"}, nodes)

    # Leftover: four 2, eight 1 -> the 8-GPU node is the tighter fit although it is the bigger node.
    assert scores["eight"] > scores["four"]


def test_gpu_packing_is_neutral_for_pods_without_gpus() -> None:
    nodes = gpu_nodes({"empty": 0, "half": 4})

    assert packing_scores(GpuPacking(), {"cpu": "1"}, nodes) == {"empty": 100.0, "half": 100.0}


def test_gpu_packing_reads_the_configured_resource() -> None:
    nodes = table(*(raw_node(name, {"cpu": "8", "amd.com/gpu": "8"}) for name in ("a", "b")))
    nodes.set_used("b", {"amd.com/gpu": 7})
    plugin = GpuPacking.from_args({"resource": "amd.com/gpu"})

    assert packing_scores(plugin, {"amd.com/gpu": "1"}, nodes) == {"a": 12.5, "b": 100.0}
    assert packing_scores(GpuPacking.from_args({}), {"amd.com/gpu": "1"}, nodes) == {"a": 100.0, "b": 100.0}


# --- CpuOffGpuNodes --------------------------------------------------------------------------------------------


def test_cpu_pod_goes_to_a_busy_cpu_node_rather_than_an_idle_gpu_node() -> None:
    profiles, _ = load_profiles(POLICIES)
    nodes = table(raw_node("gpu", GPU_NODE), raw_node("cpu", CPU_NODE))
    nodes.set_used("cpu", {"cpu": 30_000})
    pod = pod_view(requests={"cpu": "1", "memory": "1Gi"}, labels={"hoss.io/policy": "gpu"})

    decision = placed(decide(profiles["gpu"], pod, nodes, rng=np.random.default_rng(0)))

    assert decision.candidates == ["cpu", "gpu"]


def test_cpu_pod_uses_a_gpu_node_only_when_no_cpu_node_fits() -> None:
    profiles, _ = load_profiles(POLICIES)
    nodes = table(raw_node("gpu", GPU_NODE), raw_node("cpu", CPU_NODE))
    nodes.set_used("cpu", {"cpu": 32_000})

    decision = placed(decide(profiles["gpu"], pod_view(requests={"cpu": "1"}), nodes, rng=np.random.default_rng(0)))

    assert decision.candidates == ["gpu"]


def test_cpu_off_gpu_nodes_leaves_gpu_pods_alone() -> None:
    nodes = table(raw_node("gpu", GPU_NODE), raw_node("cpu", CPU_NODE))

    assert packing_scores(CpuOffGpuNodes(), {"cpu": "1"}, nodes) == {"gpu": 0.0, "cpu": 100.0}
    assert packing_scores(CpuOffGpuNodes(), {"cpu": "1", GPU: "1"}, nodes) == {"gpu": 100.0, "cpu": 100.0}


# --- Fragmentation ---------------------------------------------------------------------------------------------


def test_gpu_fragmentation_counts_free_partly_used_and_full_nodes() -> None:
    nodes = gpu_nodes({"free-1": 0, "free-2": 0, "part-1": 3, "part-2": 7, "full": 8})
    nodes.upsert_node(raw_node("cpu", CPU_NODE))

    assert gpu_fragmentation(nodes) == {
        "gpu_nodes": 5,
        "fully_free_nodes": 2,
        "partly_used_nodes": 2,
        "full_nodes": 1,
        "stranded_gpus": 5 + 1,
    }


def test_gpu_fragmentation_of_a_cluster_without_gpus_is_all_zero() -> None:
    assert gpu_fragmentation(table(raw_node("cpu", CPU_NODE))) == {
        "gpu_nodes": 0,
        "fully_free_nodes": 0,
        "partly_used_nodes": 0,
        "full_nodes": 0,
        "stranded_gpus": 0,
    }


# --- The comparison --------------------------------------------------------------------------------------------


def place_gpu_stream(profile: Profile) -> NodeTable:
    """A stream of 1-, 2-, 3- and 4-GPU pods (80 GPUs of 128), placed one by one on 16 8-GPU nodes."""
    nodes = table(*(raw_node(f"gpu-{i:02}", GPU_NODE) for i in range(16)))
    rng = np.random.default_rng(7)
    for position, gpus in enumerate([1, 2, 3, 4] * 8):
        pod = pod_view(f"train-{position}", {"cpu": "2", "memory": "8Gi", GPU: str(gpus)})
        decision = placed(decide(profile, pod, nodes, rng=rng))
        nodes.add_used(decision.candidates[0], pod.request)
    return nodes


def test_gpu_profile_leaves_more_whole_gpu_nodes_than_spread_and_no_fewer_than_binpack(
    capsys: pytest.CaptureFixture[str],
) -> None:
    profiles, _ = load_profiles(POLICIES)

    packed = gpu_fragmentation(place_gpu_stream(profiles["gpu"]))
    spread = gpu_fragmentation(place_gpu_stream(profiles["default"]))
    binpack = gpu_fragmentation(place_gpu_stream(profiles["binpack"]))

    with capsys.disabled():
        print(
            f"\nGPU stream on 16x8 GPUs: fully free nodes gpu={packed['fully_free_nodes']} "
            f"default={spread['fully_free_nodes']}; stranded GPUs gpu={packed['stranded_gpus']} "
            f"default={spread['stranded_gpus']}; binpack: fully free {binpack['fully_free_nodes']}, stranded "
            f"{binpack['stranded_gpus']}"
        )
    assert packed["fully_free_nodes"] > spread["fully_free_nodes"]
    assert packed["stranded_gpus"] < spread["stranded_gpus"]
    # 80 GPUs need at least 10 nodes, so 6 free is the best possible; packing gets close.
    assert packed["fully_free_nodes"] >= 5
    # Generic bin-packing (MostAllocated on cpu, memory and GPUs) does as well on a stream of GPU pods alone;
    # the gpu profile must never do worse.
    assert packed["fully_free_nodes"] >= binpack["fully_free_nodes"]
    assert packed["stranded_gpus"] <= binpack["stranded_gpus"]
