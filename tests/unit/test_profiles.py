"""configs/policies.yaml loads into working profiles; every mistake in a policy file names profile, plugin, field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hoss.framework.cycle import Placement, decide
from hoss.framework.errors import ProfileError
from hoss.framework.plugins.binpack import MostAllocated
from hoss.framework.plugins.spread import LeastAllocated
from hoss.framework.profiles import load_profiles, parse_profiles, profile_for
from tests.kube_objects import GPU_NODE, pod_view, raw_node, table

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"
FILTERS = ["NodeUnschedulable", "TaintToleration", "NodeAffinity", "NodePorts", "NodePool", "NodeResourcesFit",
           "VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone", "DynamicResources",
           "PodTopologySpread",
           "InterPodAffinity"]


def test_shipped_policies_load_with_their_four_profiles() -> None:
    profiles, default = load_profiles(POLICIES)

    assert default == "default"
    assert sorted(profiles) == ["binpack", "default", "gang-topology", "gpu"]
    for profile in profiles.values():
        assert [plugin.name for plugin in profile.filters] == FILTERS
        assert profile.extenders == ()
    assert profiles["gang-topology"].topology_key == "topology.hoss.io/leaf"
    assert {name for name, profile in profiles.items() if profile.topology_key is None} == {
        "default",
        "binpack",
        "gpu",
    }
    for profile in profiles.values():
        # kube-scheduler's default weights for node preferences, PreferNoSchedule taints, ScheduleAnyway spread
        # and preferred pod (anti-)affinity, in every profile.
        assert [(plugin.name, weight) for plugin, weight in profile.scores[:4]] == [
            ("NodeAffinity", 2), ("TaintToleration", 3), ("PodTopologySpread", 2), ("InterPodAffinity", 2)]
    [(spread, spread_weight)] = profiles["default"].scores[4:]
    [(binpack, binpack_weight)] = profiles["binpack"].scores[4:]
    assert isinstance(spread, LeastAllocated)
    assert spread.weights == {"cpu": 1, "memory": 1}
    assert isinstance(binpack, MostAllocated)
    assert binpack.weights == {"cpu": 1, "memory": 1, "nvidia.com/gpu": 1}
    assert spread_weight == binpack_weight == 1


def test_shipped_gpu_profile_keeps_cpu_pods_off_gpu_nodes_whatever_the_other_scores_say() -> None:
    profiles, _ = load_profiles(POLICIES)
    scores = {plugin.name: weight for plugin, weight in profiles["gpu"].scores}

    assert set(scores) == {"NodeAffinity", "TaintToleration", "PodTopologySpread", "InterPodAffinity", "GpuPacking",
                           "MostAllocated", "CpuOffGpuNodes"}
    # A GPU node's 0 from CpuOffGpuNodes must outweigh a full 100 from every other score plugin.
    assert scores["CpuOffGpuNodes"] > sum(weight for name, weight in scores.items() if name != "CpuOffGpuNodes")


def test_shipped_profiles_spread_and_pack_as_named() -> None:
    profiles, default = load_profiles(POLICIES)
    nodes = table(*(raw_node(f"gpu-{i}", GPU_NODE) for i in range(3)))
    nodes.set_used("gpu-1", {"nvidia.com/gpu": 4, "cpu": 8000})
    plain = pod_view("a", {"cpu": "1", "nvidia.com/gpu": "1"})
    packed = pod_view("b", {"cpu": "1", "nvidia.com/gpu": "1"}, labels={"hoss.io/policy": "binpack"})

    spread_choice = decide(profile_for(plain, profiles, default), plain, nodes, rng=np.random.default_rng(0))
    binpack_choice = decide(profile_for(packed, profiles, default), packed, nodes, rng=np.random.default_rng(0))

    assert isinstance(spread_choice, Placement)
    assert isinstance(binpack_choice, Placement)
    assert spread_choice.candidates[0] != "gpu-1"
    assert binpack_choice.candidates[0] == "gpu-1"


def test_profile_for_picks_by_label_and_refuses_an_unknown_policy() -> None:
    profiles, default = load_profiles(POLICIES)

    assert profile_for(pod_view(), profiles, default).name == "default"
    assert profile_for(pod_view(labels={"hoss.io/policy": "binpack"}), profiles, default).name == "binpack"
    with pytest.raises(ProfileError, match="'gpu-pack'") as caught:
        profile_for(pod_view(labels={"hoss.io/policy": "gpu-pack"}), profiles, default)
    assert caught.value.field == "metadata.labels.hoss.io/policy"


def policies(**profile: Any) -> dict[str, Any]:
    entry = {"name": "batch", "filters": [{"name": "NodeResourcesFit"}], "scores": [{"name": "MostAllocated"}]}
    return {"defaultProfile": "batch", "profiles": [{**entry, **profile}]}


@pytest.mark.parametrize(
    ("data", "plugin", "field", "reason"),
    [
        (
            policies(filters=[{"name": "NodeResourcesFit"}, {"name": "GpuMagic"}]),
            "GpuMagic",
            "filters[1].name",
            "known filter plugins: DynamicResources, InterPodAffinity, NodeAffinity",
        ),
        (
            policies(filters=[{"name": "LeastAllocated"}]),
            "LeastAllocated",
            "filters[0].name",
            "it is a score plugin, list it under scores",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "weight": 0}]),
            "MostAllocated",
            "scores[0].weight",
            "greater than or equal to 1",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "weight": "high"}]),
            "MostAllocated",
            "scores[0].weight",
            "valid integer",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "weight": 1.5}]),
            "MostAllocated",
            "scores[0].weight",
            "valid integer",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "args": {"resources": {"nvidia.com/gpu": 0}}}]),
            "MostAllocated",
            "scores[0].args.resources.nvidia.com/gpu",
            "greater than or equal to 1",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "args": {"resource": {"cpu": 1}}}]),
            "MostAllocated",
            "scores[0].args.resource",
            "Extra inputs are not permitted",
        ),
        (
            policies(filters=[{"name": "NodeAffinity", "args": {"strict": True}}]),
            "NodeAffinity",
            "filters[0].args.strict",
            "Extra inputs are not permitted",
        ),
        (
            policies(scores=[{"name": "MostAllocated"}, {"name": "MostAllocated", "weight": 2}]),
            "MostAllocated",
            "scores[1].name",
            "listed twice",
        ),
        (
            policies(scores=[{"name": "MostAllocated", "wieght": 2}]),
            "MostAllocated",
            "scores[0].wieght",
            "Extra inputs are not permitted",
        ),
        (policies(filters="NodeResourcesFit"), None, "filters", "valid list"),
    ],
)
def test_bad_profile_names_profile_plugin_and_field(
    data: dict[str, Any], plugin: str | None, field: str, reason: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles(data)

    assert (caught.value.profile, caught.value.plugin, caught.value.field) == ("batch", plugin, field)
    assert reason in caught.value.reason
    assert "profile 'batch'" in str(caught.value)


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ({"profiles": policies()["profiles"]}, "defaultProfile", "Field required"),
        ({**policies(), "defaultProfile": "gpu"}, "defaultProfile", "'gpu' names no profile; profiles: batch"),
        ({**policies(), "profiles": []}, "profiles", "at least 1 item"),
        ({**policies(), "extra": 1}, "extra", "Extra inputs are not permitted"),
        (["not", "a", "mapping"], None, "valid dictionary"),
    ],
)
def test_bad_top_level_names_the_field(data: object, field: str | None, reason: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles(data)

    assert caught.value.field == field
    assert reason in caught.value.reason


def test_duplicate_profile_names_are_refused() -> None:
    data = policies()
    data["profiles"] = data["profiles"] * 2

    with pytest.raises(ProfileError, match="duplicate profile name") as caught:
        parse_profiles(data)

    assert caught.value.field == "profiles[1].name"


def test_profile_without_a_name_is_named_by_position() -> None:
    data = policies()
    del data["profiles"][0]["name"]

    with pytest.raises(ProfileError) as caught:
        parse_profiles(data)

    assert (caught.value.profile, caught.value.field) == ("profiles[0]", "name")


def test_invalid_yaml_and_missing_file_say_so(tmp_path: Path) -> None:
    broken = tmp_path / "policies.yaml"
    broken.write_text("defaultProfile: default\nprofiles: [\n", encoding="utf-8")

    with pytest.raises(ProfileError, match="not valid YAML") as caught:
        load_profiles(broken)
    assert str(broken) in str(caught.value)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profiles(tmp_path / "missing.yaml")


def test_profile_without_scores_is_allowed() -> None:
    data = {"defaultProfile": "fit", "profiles": [{"name": "fit", "filters": [{"name": "NodeResourcesFit"}]}]}

    profiles, _ = parse_profiles(data)

    assert profiles["fit"].scores == []


EXTENDER = {"urlPrefix": "http://extender.example:8888/scheduler", "filterVerb": "filter"}


def test_profile_extenders_and_topology_key_are_loaded() -> None:
    extender = {**EXTENDER, "prioritizeVerb": "prioritize", "weight": 3, "ignorable": True, "timeoutSeconds": 2}

    profiles, _ = parse_profiles(policies(extenders=[extender], topologyKey="rack"))

    [config] = profiles["batch"].extenders
    assert config.url("filter") == "http://extender.example:8888/scheduler/filter"
    assert (config.weight, config.ignorable, config.timeout_seconds, config.node_cache_capable) == (3, True, 2.0, False)
    assert profiles["batch"].topology_key == "rack"


@pytest.mark.parametrize(
    ("extender", "field", "reason"),
    [
        ({"urlPrefix": "http://x:1/s"}, "extenders[0]", "needs a filterVerb or a prioritizeVerb"),
        ({**EXTENDER, "urlPrefix": "extender:8888"}, "extenders[0].urlPrefix", "URL"),
        ({**EXTENDER, "weight": 0}, "extenders[0].weight", "greater than or equal to 1"),
        ({**EXTENDER, "timeoutSeconds": 0}, "extenders[0].timeoutSeconds", "greater than 0"),
        ({**EXTENDER, "bindVerb": "bind"}, "extenders[0].bindVerb", "Extra inputs are not permitted"),
    ],
)
def test_bad_extender_names_the_field(extender: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles(policies(extenders=[extender]))

    assert (caught.value.profile, caught.value.field) == ("batch", field)
    assert reason in caught.value.reason


def test_bad_namespace_pools_name_the_field() -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles({**policies(), "namespacePools": {"team-a": ["pool-a"]}})

    assert caught.value.field == "namespacePools.team-a"
