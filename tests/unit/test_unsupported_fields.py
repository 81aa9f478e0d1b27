"""Fields kube-scheduler honours that hoss does not yet: refused by name, never placed as if absent."""

from __future__ import annotations

import pytest

from hoss.framework.errors import UnsupportedPodField
from hoss.framework.pod import check_supported, parse_pod
from hoss.framework.podindex import HostPort
from hoss.model import compact
from hoss.queue import WorkItem
from tests.kube_objects import Json, raw_pod
from workers.intake import parse_work


def with_spec(**spec: object) -> Json:
    pod = raw_pod("p")
    pod["spec"].update(spec)
    return pod


def refused_field(pod: Json) -> str | None:
    """The field check_supported refuses on the pod's compact form (what a worker sees), or None."""
    try:
        check_supported(compact.compact_pod(pod))
    except UnsupportedPodField as error:
        return error.field
    return None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        # queued by a dispatcher that did not describe the claims (no `storage` in the form): refused by name
        ({"volumes": [{"name": "cache", "emptyDir": {}}, {"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
         "spec.volumes[1].persistentVolumeClaim"),
        ({"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
         "spec.volumes[0].ephemeral"),
        ({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}]}, "spec.resourceClaims"),
    ],
)
def test_a_field_hoss_does_not_honour_is_refused_by_its_path(spec: Json, field: str) -> None:
    assert refused_field(with_spec(**spec)) == field
    assert str(UnsupportedPodField(field)) == f"hoss does not support {field} yet"


@pytest.mark.parametrize("source", [
    {"csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}},
    {"emptyDir": {}}, {"configMap": {"name": "c"}}, {"secret": {"secretName": "s"}},
    {"projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
    {"hostPath": {"path": "/data"}}, {"nfs": {"server": "nfs.example", "path": "/export"}},
    {"downwardAPI": {"items": []}},
])
def test_volumes_that_constrain_no_node_are_neither_refused_nor_carried(source: Json) -> None:
    pod = with_spec(volumes=[{"name": "v", **source}])
    assert refused_field(pod) is None
    assert "volumes" not in compact.compact_pod(pod)["spec"]


def test_an_in_tree_disk_is_carried_for_volume_restrictions_and_not_refused() -> None:
    pod = with_spec(volumes=[{"name": "cache", "emptyDir": {}}, {"name": "v", "gcePersistentDisk": {"pdName": "d"}}])
    assert refused_field(pod) is None
    assert compact.compact_pod(pod)["spec"]["volumes"] == [{"name": "cache"},
                                                           {"name": "v", "gcePersistentDisk": {"pdName": "d"}}]


def test_a_claim_the_dispatcher_described_is_not_refused() -> None:
    pod = with_spec(volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}])
    form = compact.compact_pod(pod)
    form["storage"] = {"bound": [], "delayed": []}
    check_supported(form)
    assert parse_pod(form).storage is not None


def test_fields_hoss_honours_are_not_refused() -> None:
    pod = with_spec(
        volumes=[{"name": "cfg", "configMap": {"name": "c"}}, {"name": "tmp", "emptyDir": {}}],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
        ]}},
        schedulingGates=[],
        priority=10,
        topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
    )
    pod["spec"]["affinity"]["podAntiAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 3, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {"matchLabels": {"a": "b"}}}}]}
    assert refused_field(pod) is None
    assert parse_pod(compact.compact_pod(pod)).spread_constraints[0].hard


def test_a_work_item_with_a_refused_field_is_unschedulable_not_malformed() -> None:
    pod = with_spec(resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu-claim"}])
    encoded = compact.encode(compact.compact_pod(pod)).decode()
    work = parse_work("1-0", WorkItem(uid="uid-p", namespace="team", name="p", policy="default", pod=encoded))
    assert work.unsupported
    assert work.problem == "hoss does not support spec.resourceClaims yet"


def test_a_namespace_selector_no_dispatcher_resolved_is_refused_by_its_path_in_preferred_terms_too() -> None:
    term = {"weight": 5, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {},
                                             "namespaceSelector": {"matchLabels": {"team": "a"}}}}
    pod = with_spec(affinity={"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}})
    encoded = compact.encode(compact.compact_pod(pod)).decode()
    work = parse_work("1-0", WorkItem(uid="uid-p", namespace="team", name="p", policy="default", pod=encoded))
    assert work.unsupported
    assert work.problem == ("hoss does not support spec.affinity.podAntiAffinity."
                            "preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.namespaceSelector yet")


def test_host_ports_are_sanitised_as_kube_scheduler_does() -> None:
    pod = with_spec(
        containers=[{"name": "a", "ports": [{"containerPort": 80, "hostPort": 8080},
                                            {"containerPort": 53, "hostPort": 53, "protocol": "UDP",
                                             "hostIP": "10.0.0.1"},
                                            {"containerPort": 9090}]}],
        initContainers=[{"name": "init", "ports": [{"containerPort": 1, "hostPort": 1}]},
                        {"name": "sidecar", "restartPolicy": "Always", "ports": [{"containerPort": 2, "hostPort": 2}]}],
    )
    view = parse_pod(compact.compact_pod(pod))
    assert view.host_ports == (HostPort("TCP", "0.0.0.0", 2), HostPort("TCP", "0.0.0.0", 8080),
                               HostPort("UDP", "10.0.0.1", 53))


def test_host_port_conflicts_follow_the_wildcard_rule() -> None:
    wildcard, specific, other = HostPort("TCP", "0.0.0.0", 80), HostPort("TCP", "10.0.0.1", 80), \
        HostPort("TCP", "10.0.0.2", 80)
    assert wildcard.conflicts(specific) and specific.conflicts(wildcard)
    assert not specific.conflicts(other)
    assert specific.conflicts(HostPort("TCP", "10.0.0.1", 80))
    assert not wildcard.conflicts(HostPort("UDP", "0.0.0.0", 80))
    assert not wildcard.conflicts(HostPort("TCP", "0.0.0.0", 81))


def test_scheduling_gates_are_parsed() -> None:
    view = parse_pod(compact.compact_pod(with_spec(schedulingGates=[{"name": "example.com/wait"}])))
    assert view.scheduling_gates == ("example.com/wait",)
