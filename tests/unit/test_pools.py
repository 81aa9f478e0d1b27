"""Node pools: pods confined by their pool label, tenants by their namespace, exclusive pools, and pool usage."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hoss.framework.cycle import FilterPlugin, FilterResult, Placement, Profile, Unschedulable, decide
from hoss.framework.errors import ProfileError
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.pools import NodePool, pool_usage
from hoss.framework.profiles import parse_profiles
from tests.kube_objects import CPU_NODE, GPU_NODE, pod_view, raw_node, table

POOL = "hoss.io/pool"
GPU = "nvidia.com/gpu"


def pooled_nodes() -> NodeTable:
    """Two nodes in pool gpu-a, one in gpu-b, two in shared, one without a pool."""
    return table(
        raw_node("a1", GPU_NODE, labels={POOL: "gpu-a"}),
        raw_node("a2", GPU_NODE, labels={POOL: "gpu-a"}),
        raw_node("b1", GPU_NODE, labels={POOL: "gpu-b"}),
        raw_node("s1", labels={POOL: "shared"}),
        raw_node("s2", labels={POOL: "shared"}),
        raw_node("loose"),
    )


def passing(result: FilterResult, nodes: NodeTable) -> list[str]:
    return [name for name, ok in zip(nodes.names, result.mask, strict=True) if ok]


def refused(decision: Placement | Unschedulable) -> Unschedulable:
    assert isinstance(decision, Unschedulable), decision
    return decision


def pool_profile(**args: Any) -> Profile:
    filters: list[FilterPlugin] = [NodePool.from_args(args), NodeResourcesFit()]
    return Profile(name="pools", filters=filters, scores=[])


def test_pod_without_a_pool_may_run_anywhere() -> None:
    nodes = pooled_nodes()

    assert passing(NodePool().filter(pod_view(), nodes), nodes) == nodes.names


def test_pod_label_confines_the_pod_to_its_pool() -> None:
    nodes = pooled_nodes()

    assert passing(NodePool().filter(pod_view(labels={POOL: "gpu-a"}), nodes), nodes) == ["a1", "a2"]


def test_pool_refusal_reads_like_kube_scheduler() -> None:
    nodes = pooled_nodes()
    nodes.set_used("a1", {GPU: 8})
    nodes.set_used("a2", {GPU: 8})
    pod = pod_view(requests={"cpu": "1", GPU: "1"}, labels={POOL: "gpu-a"})

    decision = refused(decide(pool_profile(), pod, nodes, rng=np.random.default_rng(0)))

    assert (
        decision.message == "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) were not in pool gpu-a."
    )


def test_pool_no_node_has_rejects_every_node() -> None:
    nodes = pooled_nodes()

    decision = refused(decide(pool_profile(), pod_view(labels={POOL: "gpu-z"}), nodes, rng=np.random.default_rng(0)))

    assert decision.message == "0/6 nodes are available: 6 node(s) were not in pool gpu-z."


def test_tenant_namespace_is_confined_to_its_pool_without_a_label() -> None:
    nodes = pooled_nodes()
    plugin = NodePool.from_args({"namespacePools": {"team-b": "gpu-b"}})

    assert passing(plugin.filter(pod_view(namespace="team-b"), nodes), nodes) == ["b1"]
    assert passing(plugin.filter(pod_view(namespace="team-b", labels={POOL: "gpu-b"}), nodes), nodes) == ["b1"]
    # Other namespaces are not affected unless the pools are exclusive.
    assert passing(plugin.filter(pod_view(namespace="team-c"), nodes), nodes) == nodes.names


def test_tenant_pod_naming_another_pool_fits_nowhere_and_says_why() -> None:
    nodes = pooled_nodes()
    pod = pod_view(namespace="team-b", labels={POOL: "gpu-a"})

    decision = refused(
        decide(pool_profile(namespacePools={"team-b": "gpu-b"}), pod, nodes, rng=np.random.default_rng(0))
    )

    assert decision.message == (
        "0/6 nodes are available: 6 pod asks for pool gpu-a but namespace team-b is confined to pool gpu-b."
    )


def test_exclusive_pools_keep_other_pods_off() -> None:
    nodes = pooled_nodes()
    plugin = NodePool.from_args({"namespacePools": {"team-a": "gpu-a", "team-b": "gpu-b"}, "exclusive": True})

    plain = plugin.filter(pod_view(namespace="web"), nodes)
    tenant = plugin.filter(pod_view(namespace="team-a"), nodes)

    assert passing(plain, nodes) == ["s1", "s2", "loose"]
    assert {reason: int(marked.sum()) for reason, marked in plain.reasons.items()} == {
        "node(s) were in a tenant-exclusive pool": 3
    }
    assert passing(tenant, nodes) == ["a1", "a2"]


def test_exclusive_pool_cannot_be_borrowed_by_naming_it() -> None:
    nodes = pooled_nodes()
    profile = pool_profile(namespacePools={"team-a": "gpu-a"}, exclusive=True)
    pod = pod_view(namespace="web", labels={POOL: "gpu-a"})

    decision = refused(decide(profile, pod, nodes, rng=np.random.default_rng(0)))

    assert decision.message == "0/6 nodes are available: 6 pool gpu-a is exclusive to namespace(s) team-a."


def test_non_exclusive_mapped_pool_may_be_named_by_others() -> None:
    nodes = pooled_nodes()
    plugin = NodePool.from_args({"namespacePools": {"team-a": "gpu-a"}})

    assert passing(plugin.filter(pod_view(namespace="web", labels={POOL: "gpu-a"}), nodes), nodes) == ["a1", "a2"]


def test_relabelled_node_changes_pool() -> None:
    nodes = pooled_nodes()
    nodes.upsert_node(raw_node("loose", labels={POOL: "gpu-a"}))

    assert passing(NodePool().filter(pod_view(labels={POOL: "gpu-a"}), nodes), nodes) == ["a1", "a2", "loose"]


def test_bad_node_pool_args_are_refused() -> None:
    with pytest.raises(ValueError, match="namespacePool"):
        NodePool.from_args({"namespacePool": {"team-a": "gpu-a"}})


# --- Policy file ------------------------------------------------------------------------------------------------


def profile_entry(name: str, *filters: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "filters": [*filters, {"name": "NodeResourcesFit"}], "scores": [{"name": "LeastAllocated"}]}


def test_top_level_namespace_pools_confine_tenants_in_every_profile() -> None:
    data = {
        "defaultProfile": "default",
        "namespacePools": {"team-b": "gpu-b"},
        "profiles": [
            profile_entry("default", {"name": "NodePool"}),
            profile_entry("own", {"name": "NodePool", "args": {"namespacePools": {"team-b": "shared"}}}),
        ],
    }
    profiles, _ = parse_profiles(data)
    nodes = pooled_nodes()
    pod = pod_view(namespace="team-b")

    default = decide(profiles["default"], pod, nodes, rng=np.random.default_rng(0))
    own = decide(profiles["own"], pod, nodes, rng=np.random.default_rng(0))

    assert isinstance(default, Placement)
    assert default.candidates == ["b1"]
    # A profile's own args win over the file-wide mapping.
    assert isinstance(own, Placement)
    assert sorted(own.candidates) == ["s1", "s2"]


def test_namespace_pools_with_a_profile_lacking_node_pool_is_refused() -> None:
    data = {
        "defaultProfile": "default",
        "namespacePools": {"team-b": "gpu-b"},
        "profiles": [profile_entry("default", {"name": "NodePool"}), profile_entry("escape")],
    }

    with pytest.raises(ProfileError, match="every profile needs the NodePool filter") as caught:
        parse_profiles(data)

    assert caught.value.profile == "escape"


# --- pool_usage -------------------------------------------------------------------------------------------------


def test_pool_usage_sums_nodes_alloc_and_usage_per_pool() -> None:
    nodes = pooled_nodes()
    nodes.set_used("a1", {GPU: 3, "cpu": 4000})
    nodes.set_used("a2", {GPU: 1})
    nodes.set_used("loose", {"cpu": 1000})

    usage = pool_usage(nodes)

    assert sorted(usage) == ["gpu-a", "gpu-b", "shared"]
    assert usage["gpu-a"]["nodes"] == 2
    assert usage["gpu-a"]["alloc"][GPU] == 16
    assert usage["gpu-a"]["alloc"]["cpu"] == 128_000
    assert usage["gpu-a"]["used"] == {GPU: 4, "cpu": 4000}
    assert usage["shared"] == {
        "nodes": 2,
        "alloc": {"cpu": 64_000, "memory": 2 * 128 * 2**30, "pods": 220},
        "used": {},
    }


def test_pool_usage_forgets_removed_nodes() -> None:
    nodes = pooled_nodes()
    nodes.remove_node("b1")
    nodes.upsert_node(raw_node("a2", CPU_NODE))

    usage = pool_usage(nodes)

    assert sorted(usage) == ["gpu-a", "shared"]
    assert usage["gpu-a"]["nodes"] == 1
