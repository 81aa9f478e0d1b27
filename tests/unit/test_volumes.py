"""VolumeBinding and VolumeZone as kube-scheduler's plugins read a pod's claims: what the dispatcher computes from
the storage objects (`hoss.model.storage`) and what the worker's plugins make of it per node."""

from __future__ import annotations

import numpy as np

from hoss.framework.cycle import Profile, evaluate
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.affinity import NodeAffinity
from hoss.framework.plugins.volumes import (
    BIND_CONFLICT,
    NO_VOLUME_ZONE,
    NODE_CONFLICT,
    NOT_ENOUGH_SPACE,
    PV_NOT_EXIST,
    VolumeBinding,
    VolumeZone,
    plan,
)
from hoss.framework.pod import parse_pod
from hoss.model import compact
from hoss.model.storage import STORAGE, UNBOUND_IMMEDIATE, StorageCatalog, storage_context
from tests.kube_objects import Json, raw_node, raw_pod

HOST = "kubernetes.io/hostname"
NS = "team"


def on_node(node: str) -> Json:
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOST, "operator": "In", "values": [node]}]}]}}


def pv(name: str, *, storage_class: str = "local", size: str = "10Gi", node: str | None = None,
       claim: str | None = None, labels: dict[str, str] | None = None, modes: tuple[str, ...] = ("ReadWriteOnce",),
       ) -> Json:
    spec: Json = {"capacity": {"storage": size}, "storageClassName": storage_class, "accessModes": list(modes)}
    if node is not None:
        spec["nodeAffinity"] = on_node(node)
    if claim is not None:
        spec["claimRef"] = {"namespace": NS, "name": claim}
    return {"metadata": {"name": name, "resourceVersion": "7", "labels": labels or {}}, "spec": spec}


def pvc(name: str, *, storage_class: str = "local", size: str = "1Gi", volume: str = "", bound: bool = False,
        selector: Json | None = None, annotations: dict[str, str] | None = None, deleting: bool = False,
        modes: tuple[str, ...] = ("ReadWriteOnce",), owner: str | None = None) -> Json:
    metadata: Json = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "3",
                      "annotations": dict(annotations or {})}
    if bound:
        metadata["annotations"]["pv.kubernetes.io/bind-completed"] = "yes"
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if owner is not None:
        metadata["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": owner, "controller": True}]
    spec: Json = {"storageClassName": storage_class, "accessModes": list(modes),
                  "resources": {"requests": {"storage": size}}}
    if volume:
        spec["volumeName"] = volume
    if selector is not None:
        spec["selector"] = selector
    return {"metadata": metadata, "spec": spec, "status": {}}


def storage_class(name: str, *, wait: bool = True, provisioner: str = "kubernetes.io/no-provisioner",
                  topologies: list[Json] | None = None) -> Json:
    body: Json = {"metadata": {"name": name}, "provisioner": provisioner,
                  "volumeBindingMode": "WaitForFirstConsumer" if wait else "Immediate"}
    if topologies is not None:
        body["allowedTopologies"] = topologies
    return body


def catalog(*objects: Json) -> StorageCatalog:
    found = StorageCatalog()
    for raw in objects:
        if "provisioner" in raw:
            found.apply("classes", "ADDED", raw)
        elif "capacity" in raw.get("spec", {}):
            found.apply("volumes", "ADDED", raw)
        elif "storageClassName" in raw and "nodeTopology" in raw:
            found.apply("capacities", "ADDED", raw)
        elif raw.get("spec", {}).get("storageCapacity") is not None:
            found.apply("drivers", "ADDED", raw)
        else:
            found.apply("claims", "ADDED", raw)
    return found


def pod_with(*claims: str, ephemeral: str | None = None, uid: str = "uid-p") -> Json:
    pod = raw_pod("p", namespace=NS)
    pod["metadata"]["uid"] = uid
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "c"}},
                              *({"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                                for i, c in enumerate(claims))]
    if ephemeral is not None:
        pod["spec"]["volumes"].append({"name": ephemeral, "ephemeral": {"volumeClaimTemplate": {"spec": {}}}})
    return pod


def view(pod: Json, storage: StorageCatalog) -> Json:
    form = compact.compact_pod(pod)
    context = storage_context(form, storage)
    if context is not None:
        form[STORAGE] = context
    return form


def table(*nodes: tuple[str, dict[str, str]]) -> NodeTable:
    found = NodeTable()
    for name, labels in nodes:
        found.upsert_node(raw_node(name, labels={HOST: name, **labels}))
    return found


THREE = table(("a", {"zone": "z1"}), ("b", {"zone": "z2"}), ("c", {"zone": "z3"}))
PROFILE = Profile(name="default", filters=[NodeAffinity(), VolumeBinding(), VolumeZone()], scores=[])


def verdict(form: Json, nodes: NodeTable = THREE) -> tuple[list[str], str]:
    """The feasible nodes and the message when there is none."""
    evaluation = evaluate(PROFILE, parse_pod(form), nodes)
    feasible = [nodes.names[row] for row in np.flatnonzero(evaluation.feasible)]
    return feasible, "" if feasible else evaluation.unschedulable().message


def test_a_claim_that_is_not_ready_keeps_the_pod_off_every_node_with_kube_scheduler_s_words() -> None:
    imm = storage_class("imm", wait=False)
    cases = {
        "gone": (catalog(imm), 'persistentvolumeclaim "gone" not found'),
        "doomed": (catalog(imm, pvc("doomed", storage_class="imm", deleting=True)),
                   'persistentvolumeclaim "doomed" is being deleted'),
        "later": (catalog(imm, pvc("later", storage_class="imm")), UNBOUND_IMMEDIATE),
        "prebound": (catalog(storage_class("local"), pvc("prebound", volume="pv1")), UNBOUND_IMMEDIATE),
    }
    for claim, (storage, message) in cases.items():
        assert verdict(view(pod_with(claim), storage)) == ([], f"0/3 nodes are available: {message}."), claim


def test_an_ephemeral_volume_waits_for_its_claim_and_refuses_a_claim_it_does_not_own() -> None:
    wffc = storage_class("local")
    assert verdict(view(pod_with(ephemeral="scratch"), catalog(wffc)))[1] == (
        "0/3 nodes are available: waiting for ephemeral volume controller to create the persistentvolumeclaim "
        "\"p-scratch\".")
    stranger = catalog(wffc, pvc("p-scratch", owner="someone-else"), pv("pv1", node="b"))
    assert "was not created for pod team/p (pod is not owner)" in verdict(view(pod_with(ephemeral="scratch"),
                                                                               stranger))[1]
    own = catalog(wffc, pvc("p-scratch", owner="uid-p"), pv("pv1", node="b"))
    assert verdict(view(pod_with(ephemeral="scratch"), own)) == (["b"], "")


def test_a_bound_claim_allows_only_its_volume_s_nodes_and_zone() -> None:
    storage = catalog(storage_class("local"), pvc("data", volume="pv1", bound=True), pv("pv1", node="b"))
    assert verdict(view(pod_with("data"), storage)) == (["b"], "")
    zonal = pv("pv2", labels={"topology.kubernetes.io/zone": "z1__z3"})
    nodes = table(("a", {"topology.kubernetes.io/zone": "z1"}), ("b", {"topology.kubernetes.io/zone": "z2"}),
                  ("c", {"topology.kubernetes.io/zone": "z3"}), ("d", {}))
    storage = catalog(storage_class("local"), pvc("data", volume="pv2", bound=True), zonal)
    feasible, _ = verdict(view(pod_with("data"), storage), nodes)
    assert feasible == ["a", "c", "d"]  # a node without zone labels is not judged by VolumeZone
    only_b = pv("pv3", node="b", labels={"topology.kubernetes.io/zone": "z1"})
    storage = catalog(storage_class("local"), pvc("data", volume="pv3", bound=True), only_b)
    assert verdict(view(pod_with("data"), storage), nodes)[1] == (
        f"0/4 nodes are available: 1 {NO_VOLUME_ZONE}, 3 {NODE_CONFLICT}.")
    missing = catalog(storage_class("local"), pvc("data", volume="nope", bound=True))
    assert verdict(view(pod_with("data"), missing))[1] == f"0/3 nodes are available: 3 {PV_NOT_EXIST}."


def test_waiting_claims_take_the_smallest_free_volume_each_on_the_node_and_never_the_same_one() -> None:
    storage = catalog(
        storage_class("local"), pvc("small", size="1Gi"), pvc("big", size="5Gi"),
        pv("a-2g", node="a", size="2Gi"), pv("a-8g", node="a", size="8Gi"), pv("b-8g", node="b", size="8Gi"),
        pv("c-2g", node="c", size="2Gi"), pv("c-claimed", node="c", size="8Gi", claim="other"),
        pv("c-ssd", node="c", size="8Gi", storage_class="ssd"),
        pv("c-rox", node="c", size="8Gi", modes=("ReadOnlyMany",)))
    form = view(pod_with("big", "small"), storage)
    # b: its one PV goes to the smaller claim; c: no PV of 5Gi; neither can provision (no provisioner)
    assert verdict(form) == (["a"], "")
    needs = parse_pod(form).storage
    assert needs is not None
    chosen = plan(needs, THREE)
    names = {claim.claim: [option.name for option in claim.volumes] for claim in needs.delayed}
    assert names == {"small": ["a-2g", "c-2g", "a-8g", "b-8g"], "big": ["a-8g", "b-8g"]}
    row = THREE.row("a")
    assert names["small"][chosen.choices["small"][row]] == "a-2g"
    assert names["big"][chosen.choices["big"][row]] == "a-8g"
    one_pv = catalog(storage_class("local"), pvc("x"), pvc("y"), pv("only", node="a"))
    assert verdict(view(pod_with("x", "y"), one_pv))[1] == f"0/3 nodes are available: 3 {BIND_CONFLICT}."


def test_a_claim_s_selector_and_a_volume_pre_bound_to_it_decide_which_volume_it_may_take() -> None:
    storage = catalog(storage_class("local"), pvc("data", selector={"matchLabels": {"tier": "gold"}}),
                      pv("plain", node="a"), pv("gold", node="b", labels={"tier": "gold"}))
    assert verdict(view(pod_with("data"), storage))[0] == ["b"]
    prebound = catalog(storage_class("local"), pvc("data"), pv("mine", node="c", claim="data"), pv("any", node="a"))
    assert verdict(view(pod_with("data"), prebound))[0] == ["c"]


def test_provisioning_needs_a_provisioner_the_class_topology_and_published_capacity() -> None:
    topologies = [{"matchLabelExpressions": [{"key": "zone", "values": ["z1", "z2"]}]}]
    dynamic = storage_class("dyn", provisioner="csi.example.com", topologies=topologies)
    driver = {"metadata": {"name": "csi.example.com"}, "spec": {"storageCapacity": True}}
    capacity_z1 = {"metadata": {"name": "z1", "namespace": "kube-system"}, "storageClassName": "dyn",
                   "nodeTopology": {"matchLabels": {"zone": "z1"}}, "capacity": "2Gi"}
    capacity_z2 = {"metadata": {"name": "z2", "namespace": "kube-system"}, "storageClassName": "dyn",
                   "nodeTopology": {"matchLabels": {"zone": "z2"}}, "capacity": "100Gi"}
    storage = catalog(dynamic, driver, capacity_z1, capacity_z2, pvc("data", storage_class="dyn", size="5Gi"))
    assert verdict(view(pod_with("data"), storage))[0] == ["b"]
    huge = catalog(dynamic, driver, capacity_z1, capacity_z2, pvc("data", storage_class="dyn", size="500Gi"))
    assert verdict(view(pod_with("data"), huge))[1] == (
        f"0/3 nodes are available: 1 {BIND_CONFLICT}, 2 {NOT_ENOUGH_SPACE}.")
    no_driver = catalog(dynamic, pvc("data", storage_class="dyn", size="500Gi"))
    assert verdict(view(pod_with("data"), no_driver))[0] == ["a", "b"]  # capacity is not tracked: not checked
    no_provisioner = catalog(storage_class("local"), pvc("data"))
    assert verdict(view(pod_with("data"), no_provisioner))[1] == f"0/3 nodes are available: 3 {BIND_CONFLICT}."
    selected = catalog(dynamic, pvc("data", storage_class="dyn", annotations={
        "volume.kubernetes.io/selected-node": "a"}))
    assert verdict(view(pod_with("data"), selected))[0] == ["a"]


def test_a_pod_with_claims_under_a_profile_without_volume_binding_is_refused_by_name() -> None:
    storage = catalog(storage_class("local"), pvc("data", volume="pv1", bound=True), pv("pv1", node="b"))
    profile = Profile(name="bare", filters=[NodeAffinity()], scores=[])
    evaluation = evaluate(profile, parse_pod(view(pod_with("data"), storage)), THREE)
    assert evaluation.unschedulable().message == (
        "0/3 nodes are available: hoss profile 'bare' does not list the VolumeBinding filter, which the pod's "
        "volume claims need.")


def test_a_pod_without_claims_carries_no_storage_and_volume_binding_passes_every_node() -> None:
    pod = raw_pod("p", namespace=NS)
    pod["spec"]["volumes"] = [{"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io"}}]
    form = view(pod, catalog())
    assert STORAGE not in form and "volumes" not in form["spec"]
    assert verdict(form)[0] == ["a", "b", "c"]
