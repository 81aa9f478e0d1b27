"""NodeVolumeLimits and VolumeRestrictions' in-tree disks, as kube-scheduler's plugins read them: the CSI attach
limits from CSINodes, the volumes of the pods already on a node counted once by handle, and a disk mounted twice on
a node; what the dispatcher computes (`hoss.model.storage.attach_context`) and what the worker's filters make of
it per node."""

from __future__ import annotations

import numpy as np
import pytest

from hoss.framework.cycle import Profile, evaluate
from hoss.framework.errors import UnsupportedPodField
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.volumes import (
    DISK_CONFLICT,
    MAX_VOLUME_COUNT,
    NodeVolumeLimits,
    VolumeBinding,
    VolumeRestrictions,
)
from hoss.framework.pod import check_supported, parse_pod
from hoss.framework.podindex import parse_placed
from hoss.model import compact
from hoss.model.storage import STORAGE, StorageCatalog, storage_context
from tests.kube_objects import Json, raw_node, raw_pod

NS = "team"
DRIVER = "disk.csi.example.com"
HOST = "kubernetes.io/hostname"


def csinode(name: str, *drivers: tuple[str, int | None]) -> Json:
    return {"metadata": {"name": name}, "spec": {"drivers": [
        {"name": driver, "nodeID": name, **({"allocatable": {"count": count}} if count is not None else {})}
        for driver, count in drivers]}}


def csi_pv(name: str, *, driver: str = DRIVER, handle: str | None = None) -> Json:
    return {"metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "csi",
                     "csi": {"driver": driver, "volumeHandle": handle or f"h-{name}"}}}


def bound_claim(name: str, volume: str, *, namespace: str = NS) -> Json:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"storageClassName": "csi", "volumeName": volume, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}, "status": {"phase": "Bound"}}


def waiting_claim(name: str, *, storage_class: str = "wffc") -> Json:
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}, "status": {"phase": "Pending"}}


def catalog(*, csinodes: list[Json], pvs: list[Json] = (), claims: list[Json] = (),  # type: ignore[assignment]
            classes: list[Json] = ()) -> StorageCatalog:  # type: ignore[assignment]
    found = StorageCatalog()
    for kind, items in (("csinodes", csinodes), ("volumes", pvs), ("claims", claims), ("classes", classes)):
        found.replace(kind, list(items))
    return found


def pod_using(name: str, *claims: str, uid: str | None = None, volumes: list[Json] | None = None) -> Json:
    pod = raw_pod(name, namespace=NS, uid=uid or f"uid-{name}")
    pod["spec"]["volumes"] = [*({"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
                                for i, c in enumerate(claims)), *(volumes or [])]
    return pod


def form_of(pod: Json, storage: StorageCatalog) -> Json:
    form = compact.compact_pod(pod)
    context = storage_context(form, storage)
    if context is not None:
        form[STORAGE] = context
    return form


def nodes_with(*names: str) -> NodeTable:
    table = NodeTable()
    for name in names:
        table.upsert_node(raw_node(name, labels={HOST: name}))
    return table


def place(table: NodeTable, pod: Json, node: str) -> None:
    """`pod` placed on `node` as the ledger's entry describes it (the resolver's meta of a bound pod)."""
    _ports, meta = compact.pod_meta(pod)
    table.place_pod(parse_placed(pod["metadata"]["uid"], node, meta))


PROFILE = Profile(name="default", filters=[VolumeRestrictions(), NodeVolumeLimits(), VolumeBinding()], scores=[])


def verdict(form: Json, table: NodeTable) -> tuple[list[str], str]:
    evaluation = evaluate(PROFILE, parse_pod(form), table)
    feasible = [table.names[row] for row in np.flatnonzero(evaluation.feasible)]
    return feasible, "" if feasible else evaluation.unschedulable().message


def test_a_pod_s_new_volumes_may_not_exceed_the_driver_s_limit_counting_the_pods_already_on_the_node() -> None:
    pvs = [csi_pv(f"pv{i}") for i in range(5)]
    claims = [bound_claim(f"c{i}", f"pv{i}") for i in range(5)]
    storage = catalog(csinodes=[csinode("a", (DRIVER, 2)), csinode("b", (DRIVER, 3)), csinode("c", (DRIVER, None))],
                      pvs=pvs, claims=claims)
    table = nodes_with("a", "b", "c")
    place(table, pod_using("old-a", "c0"), "a")
    place(table, pod_using("old-b", "c0", "c1"), "b")

    # two new volumes: a has room for one more, b for one more, c has no limit
    assert verdict(form_of(pod_using("new", "c2", "c3"), storage), table)[0] == ["c"]
    # one new volume fits a and b
    assert verdict(form_of(pod_using("new", "c2"), storage), table)[0] == ["a", "b", "c"]
    # a volume already on the node is counted once: c0 and c1 are on b, so only c2 is new there
    assert verdict(form_of(pod_using("new", "c0", "c1", "c2"), storage), table)[0] == ["b", "c"]

    full = nodes_with("a", "b")
    place(full, pod_using("old-a", "c0", "c1"), "a")
    place(full, pod_using("old-b", "c0", "c1", "c2"), "b")
    assert verdict(form_of(pod_using("new", "c4"), storage), full) == (
        [], f"0/2 nodes are available: 2 {MAX_VOLUME_COUNT}.")


def test_claims_without_a_volume_count_by_their_class_s_provisioner_and_other_drivers_not_at_all() -> None:
    classes = [{"metadata": {"name": "wffc"}, "provisioner": DRIVER, "volumeBindingMode": "WaitForFirstConsumer"}]
    storage = catalog(csinodes=[csinode("a", (DRIVER, 1), ("other.csi", 0))], classes=classes,
                      pvs=[csi_pv("pv0"), csi_pv("elsewhere", driver="other.csi")],
                      claims=[bound_claim("c0", "pv0"), waiting_claim("w1"), waiting_claim("w2"),
                              bound_claim("o1", "elsewhere")])
    table = nodes_with("a")
    # one claim waiting for its first consumer counts as a volume of the class's provisioner
    assert verdict(form_of(pod_using("new", "w1"), storage), table)[0] == ["a"]
    assert verdict(form_of(pod_using("new", "w1", "w2"), storage), table) == (
        [], f"0/1 nodes are available: 1 {MAX_VOLUME_COUNT}.")
    # an existing pod's waiting claim counts too
    place(table, pod_using("old", "w2"), "a")
    assert verdict(form_of(pod_using("new", "c0"), storage), table)[1].endswith(f"1 {MAX_VOLUME_COUNT}.")
    # a volume of a driver with limit 0 on the node, which the pod does not use, changes nothing for it; one it does
    # use is refused there
    assert verdict(form_of(pod_using("new", "o1"), storage), nodes_with("a"))[1].endswith(f"1 {MAX_VOLUME_COUNT}.")


def test_without_a_csinode_limit_the_pod_carries_no_attach_context() -> None:
    storage = catalog(csinodes=[csinode("a", (DRIVER, None))], pvs=[csi_pv("pv0")], claims=[bound_claim("c0", "pv0")])
    form = form_of(pod_using("new", "c0"), storage)
    assert "attach" not in form[STORAGE]
    limited = catalog(csinodes=[csinode("a", (DRIVER, 4))], pvs=[csi_pv("pv0")], claims=[bound_claim("c0", "pv0")])
    assert form_of(pod_using("new", "c0"), limited)[STORAGE]["attach"] == {
        "volumes": [[DRIVER, "h-pv0"]], "limits": {DRIVER: {"a": 4}}, "claims": {f"{NS}/c0": [DRIVER, "h-pv0"]}}


def test_an_in_tree_volume_counted_under_csi_migration_is_refused_naming_the_field() -> None:
    ebs = {"name": "disk", "awsElasticBlockStore": {"volumeID": "vol-1"}}
    limited = catalog(csinodes=[csinode("a", ("ebs.csi.aws.com", 25))])
    form = form_of(pod_using("new", volumes=[ebs]), limited)
    with pytest.raises(UnsupportedPodField, match=r"spec\.volumes\[0\]\.awsElasticBlockStore"):
        check_supported(form)
    # where no CSINode limits the driver it is migrated to, nothing is counted and the pod is not refused
    check_supported(form_of(pod_using("new", volumes=[ebs]), catalog(csinodes=[csinode("a", (DRIVER, 2))])))


def disk(kind: str, read_only: bool = False, **fields: object) -> Json:
    return {"name": kind, kind: {**fields, "readOnly": read_only}}


@pytest.mark.parametrize(("mine", "theirs", "conflict"), [
    (disk("gcePersistentDisk", pdName="d1"), disk("gcePersistentDisk", pdName="d1"), True),
    (disk("gcePersistentDisk", True, pdName="d1"), disk("gcePersistentDisk", True, pdName="d1"), False),
    (disk("gcePersistentDisk", True, pdName="d1"), disk("gcePersistentDisk", pdName="d1"), True),
    (disk("gcePersistentDisk", pdName="d1"), disk("gcePersistentDisk", pdName="d2"), False),
    (disk("awsElasticBlockStore", True, volumeID="v1"), disk("awsElasticBlockStore", True, volumeID="v1"), True),
    (disk("iscsi", True, iqn="q", targetPortal="p", lun=0), disk("iscsi", True, iqn="q", targetPortal="p", lun=0),
     False),
    (disk("iscsi", iqn="q", targetPortal="p", lun=0), disk("iscsi", True, iqn="q", targetPortal="p", lun=1), True),
    (disk("rbd", monitors=["m1", "m2"], image="i"), disk("rbd", monitors=["m2"], image="i"), True),
    (disk("rbd", monitors=["m1"], image="i"), disk("rbd", monitors=["m2"], image="i"), False),
    (disk("rbd", monitors=["m1"], image="i", pool="p1"), disk("rbd", monitors=["m1"], image="i", pool="p2"), False),
])
def test_an_in_tree_disk_used_on_the_node_already_conflicts_unless_both_mount_it_read_only(
        mine: Json, theirs: Json, conflict: bool) -> None:
    table = nodes_with("a", "b")
    place(table, pod_using("old", volumes=[theirs]), "a")
    form = compact.compact_pod(pod_using("new", volumes=[mine]))
    expected = (["b"], "") if conflict else (["a", "b"], "")
    assert verdict(form, table) == expected
    place(table, pod_using("older", volumes=[theirs]), "b")
    if conflict:
        assert verdict(form, table) == ([], f"0/2 nodes are available: 2 {DISK_CONFLICT}.")


def test_volume_attachments_on_the_node_count_besides_the_pods_volumes() -> None:
    """kube-scheduler 1.36 counts a node's VolumeAttachments too (once, when a pod there uses the volume); a new
    volume that is only attached, by no pod, still counts as the pod's own."""
    attachments = [{"metadata": {"name": f"va-{pv}"}, "spec": {"attacher": DRIVER, "nodeName": "a",
                                                              "source": {"persistentVolumeName": pv}}}
                   for pv in ("pv0", "pv1")]
    storage = catalog(csinodes=[csinode("a", (DRIVER, 3))], pvs=[csi_pv(f"pv{i}") for i in range(4)],
                      claims=[bound_claim(f"c{i}", f"pv{i}") for i in range(4)])
    storage.replace("attachments", attachments)
    table = nodes_with("a")
    place(table, pod_using("old", "c0"), "a")
    # counted: c0 (pod and attachment, once), pv1's attachment; c2 makes 3
    assert verdict(form_of(pod_using("new", "c2"), storage), table)[0] == ["a"]
    assert verdict(form_of(pod_using("new", "c2", "c3"), storage), table)[0] == []
    # c1 is attached but no pod uses it: counted as attached and as the pod's new volume
    assert verdict(form_of(pod_using("new", "c1", "c2"), storage), table)[0] == []
    assert verdict(form_of(pod_using("new", "c1"), storage), table)[0] == ["a"]
