"""Cluster-default topology spread constraints (kube-scheduler's System defaulting and List defaults): the
dispatcher's default selector from Services and controllers, and PodTopologySpread's score with the defaults,
against hand-worked cases."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dispatcher.intake import parse_pending_pod
from dispatcher.spreading import SelectorSources
from hoss.framework.errors import ProfileError
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.topology import ZONE, PodTopologySpread
from hoss.framework.pod import PodView, parse_pod
from hoss.framework.podindex import parse_placed
from hoss.framework.profiles import load_profiles
from hoss.model import compact
from tests.kube_objects import Json, raw_node, raw_pod, table

HOST = "kubernetes.io/hostname"


def owned(raw: Json, kind: str, name: str, api: str = "apps/v1") -> Json:
    raw["metadata"]["ownerReferences"] = [{"apiVersion": api, "kind": kind, "name": name, "uid": "u",
                                           "controller": True}]
    return raw


def obj(name: str, spec: Json, namespace: str = "team") -> Json:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def sources() -> SelectorSources:
    found = SelectorSources()
    found.replace("service", [obj("web", {"selector": {"app": "web"}}), obj("all", {"selector": {"tier": "x"}}),
                              obj("elsewhere", {"selector": {"app": "web"}}, namespace="other"),
                              obj("headless", {})])
    found.replace("rs", [obj("web-abc", {"selector": {"matchLabels": {"app": "web", "hash": "abc"},
                                                      "matchExpressions": [{"key": "env", "operator": "Exists"}]}})])
    found.replace("rc", [obj("legacy", {"selector": {"app": "legacy"}})])
    found.replace("ss", [])
    return found


def test_the_default_selector_merges_the_services_selecting_the_pod_and_its_controllers() -> None:
    found = sources()
    web = raw_pod("web-1", labels={"app": "web", "hash": "abc", "env": "prod"})
    assert found.default_selector(web) == {"matchLabels": {"app": "web"}}, "only its own namespace's Services"
    assert found.default_selector(owned(web, "ReplicaSet", "web-abc")) == {
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]},
                             {"key": "hash", "operator": "In", "values": ["abc"]},
                             {"key": "env", "operator": "Exists"}]}
    legacy = owned(raw_pod("l", labels={"app": "legacy"}), "ReplicationController", "legacy", api="v1")
    assert found.default_selector(legacy) == {"matchLabels": {"app": "legacy"}}
    assert found.default_selector(raw_pod("bare", labels={"app": "none"})) is None, "nothing selects it"
    # an owner of another kind (a Job) adds nothing; a deleted Service stops selecting
    found.apply("service", "DELETED", obj("web", {"selector": {"app": "web"}}))
    assert found.default_selector(owned(raw_pod("j", labels={"app": "web"}), "Job", "j", api="batch/v1")) is None


def test_the_compact_form_carries_the_default_selector_only_for_pods_without_constraints() -> None:
    found = sources()
    web = raw_pod("web-1", labels={"app": "web"})
    pending = parse_pending_pod(web, scheduler_names=["hoss"], default_policy="default", seen_at=0.0,
                                sources=found)
    assert pending is not None
    assert compact.decode(pending.compact)[compact.DEFAULT_SPREAD] == {"matchLabels": {"app": "web"}}
    web["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": HOST,
                                                 "whenUnsatisfiable": "ScheduleAnyway",
                                                 "labelSelector": {"matchLabels": {"app": "web"}}}]
    pending = parse_pending_pod(web, scheduler_names=["hoss"], default_policy="default", seen_at=0.0,
                                sources=found)
    assert pending is not None and compact.DEFAULT_SPREAD not in compact.decode(pending.compact)


def cluster() -> NodeTable:
    # n1, n2 in zone z1; n3 in z2; n4 without a zone label. Placed web pods: n1 two, n3 one.
    nodes = table(*(raw_node(f"n{i}", labels={HOST: f"n{i}", **({ZONE: z} if z else {})})
                    for i, z in ((1, "z1"), (2, "z1"), (3, "z2"), (4, ""))))
    for n, node in enumerate(("n1", "n1", "n3")):
        placed = raw_pod(f"p{n}", labels={"app": "web"})
        placed["metadata"]["uid"] = f"uid-p{n}"
        _ports, meta = compact.pod_meta(placed)
        nodes.place_pod(parse_placed(f"uid-p{n}", node, meta))
    return nodes


def incoming(selector: Json | None = None) -> PodView:
    raw = raw_pod("web-new", labels={"app": "web"})
    if selector is not None:
        raw[compact.DEFAULT_SPREAD] = selector
    return parse_pod(raw)


def scores(plugin: PodTopologySpread, pod: PodView, nodes: NodeTable) -> tuple[dict[str, float], dict[str, float]]:
    feasible = np.ones(len(nodes), dtype=np.bool_)
    raw = plugin.score(pod, nodes, feasible)
    normal = plugin.normalize(raw, feasible)
    return (dict(zip(nodes.names, raw.tolist(), strict=True)), dict(zip(nodes.names, normal.tolist(), strict=True)))


def test_system_defaults_score_by_hostname_and_zone_and_still_score_nodes_without_a_zone() -> None:
    nodes, plugin = cluster(), PodTopologySpread()
    pod = incoming({"matchLabels": {"app": "web"}})
    assert pod.reads_pod_index and not plugin.skips(pod, nodes)
    host, zone = math.log(4 + 2), math.log(3 + 2)  # 4 scored nodes; zones z1, z2 and "" (n4)
    expected = {"n1": round(2 * host + 2 + 2 * zone + 4), "n2": round(0 * host + 2 + 2 * zone + 4),
                "n3": round(1 * host + 2 + 1 * zone + 4), "n4": round(0 * host + 2)}
    assert expected == {"n1": 13, "n2": 9, "n3": 9, "n4": 2}
    raw, normal = scores(plugin, pod, nodes)
    assert raw == expected
    # 100 * (max + min - s) // max with max 13, min 2
    assert normal == {"n1": 15.0, "n2": 46.0, "n3": 46.0, "n4": 100.0}


def test_no_default_selector_own_constraints_or_an_empty_list_mean_no_defaults() -> None:
    nodes = cluster()
    assert PodTopologySpread().skips(incoming(), nodes), "nothing selects the pod"
    disabled = PodTopologySpread.from_args({"defaultingType": "List"})
    assert disabled.skips(incoming({"matchLabels": {"app": "web"}}), nodes)
    own = raw_pod("web-new", labels={"app": "web"})
    own["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable":
                                                 "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "web"}}}]
    own[compact.DEFAULT_SPREAD] = {"matchLabels": {"app": "web"}}
    assert PodTopologySpread().skips(parse_pod(own), nodes), "its own (hard) constraints replace the defaults"


def test_list_defaults_replace_the_system_ones_and_ignore_nodes_lacking_their_keys() -> None:
    nodes = cluster()
    plugin = PodTopologySpread.from_args({"defaultingType": "List", "defaultConstraints": [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}]})
    raw, normal = scores(plugin, incoming({"matchLabels": {"app": "web"}}), nodes)
    size = math.log(2 + 2)  # z1 and z2; n4 is ignored (requireAllTopologies with List defaults)
    assert raw == {"n1": round(2 * size), "n2": round(2 * size), "n3": round(size), "n4": -1.0}
    assert normal == {"n1": 33.0, "n2": 33.0, "n3": 100.0, "n4": 0.0}  # raw 3, 3, 1: 100 * (3 + 1 - s) // 3


@pytest.mark.parametrize(("args", "wrong"), [
    ({"defaultConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway"}]},
     "defaultingType is System"),
    ({"defaultingType": "List", "defaultConstraints": [
        {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule"}]}, "whenUnsatisfiable"),
    ({"defaultingType": "Cluster"}, "defaultingType"),
])
def test_bad_default_constraint_args_are_refused_naming_the_field(tmp_path: Path, args: Json, wrong: str) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump({"defaultProfile": "p", "profiles": [
        {"name": "p", "filters": [{"name": "NodeResourcesFit"}],
         "scores": [{"name": "PodTopologySpread", "weight": 2, "args": args}]}]}))
    with pytest.raises(ProfileError, match=wrong):
        load_profiles(path)
