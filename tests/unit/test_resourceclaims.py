"""What a pending pod's ResourceClaims need (the dispatcher's `device_context`) and the DynamicResources filter over
it (the worker's): kube-scheduler's PreFilter reasons, nodes by the devices their slices offer, devices other claims
hold left out, and the allocation written for the chosen node."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from pydantic import ValidationError

from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.devices import NOT_AVAILABLE, DynamicResources, allocation_at, allocation_on
from hoss.framework.plugins.fit import NodeResourcesFit
from hoss.framework.plugins.gpu import GpuPacking
from hoss.framework.pod import parse_pod
from hoss.model import devices as dra
from hoss.model.compact import compact_pod
from hoss.model.dra import class_for, extended_requests
from hoss.model.objects import Json
from hoss.model.resourceclaims import DEVICES, DeviceCatalog, device_context
from tests.kube_objects import GPU_NODE, pod_view, raw_node, table

DRIVER = "gpu.example.com"


def pod(*entries: Json, statuses: list[Json] | None = None) -> Json:
    raw: Json = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
                 "spec": {"schedulerName": "hoss", "resourceClaims": list(entries),
                          "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    if statuses is not None:
        raw["status"] = {"resourceClaimStatuses": statuses}
    return raw


def claim(name: str, *, count: int = 1, expression: str | None = None, allocation: Json | None = None,
          owner: str | None = None) -> Json:
    exactly: Json = {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": count}
    if expression:
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    raw: Json = {"metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid", "resourceVersion": "7"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if owner:
        raw["metadata"]["ownerReferences"] = [{"uid": owner, "controller": True, "kind": "Pod", "name": "p",
                                               "apiVersion": "v1"}]
    if allocation is not None:
        raw["status"] = {"allocation": allocation}
    return raw


def node_slice(node: str, *models: str) -> Json:
    return {"metadata": {"name": f"{node}-slice"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"model": {"string": model}}}
                                 for i, model in enumerate(models)]}}


def catalog(*claims: Json, slices: tuple[Json, ...] = ()) -> DeviceCatalog:
    made = DeviceCatalog()
    made.replace("claims", list(claims))
    made.replace("slices", list(slices))
    made.replace("classes", [{"metadata": {"name": "gpu"},
                              "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}])
    return made


def by_name(name: str) -> Json:
    return {"name": "gpus", "resourceClaimName": name}


def by_template(template: str) -> Json:
    return {"name": "gpus", "resourceClaimTemplateName": template}


def view_of(raw: Json, devices: DeviceCatalog) -> tuple[Json | None, object]:
    form = compact_pod(raw)
    context = device_context(form, devices)
    if context is not None:
        form[DEVICES] = context
    return context, parse_pod(form)


def table_of(*names: str) -> NodeTable:
    nodes = NodeTable()
    for name in names:
        nodes.upsert_node(raw_node(name))
    return nodes


def test_claims_not_ready_wait_with_kube_scheduler_s_prefilter_reasons() -> None:
    devices = catalog(claim("other-pods", owner="someone-else"))
    assert device_context(compact_pod(pod(by_template("t"))), devices) == {
        "problem": 'pod "ns/p": ResourceClaim not created yet'}
    assert device_context(compact_pod(pod(by_name("absent"))), devices) == {
        "problem": 'resourceclaim.resource.k8s.io "absent" not found'}
    made_for_another = pod(by_template("t"), statuses=[{"name": "gpus", "resourceClaimName": "other-pods"}])
    assert device_context(compact_pod(made_for_another), devices) == {
        "problem": "ResourceClaim ns/other-pods was not created for Pod ns/p (Pod is not owner)"}
    missing_class = claim("c")
    missing_class["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "fpga"
    assert device_context(compact_pod(pod(by_name("c"))), catalog(missing_class)) == {
        "problem": "request gpu: device class fpga does not exist"}


def test_a_template_s_claim_is_found_through_the_pod_status_and_other_claims_devices_are_held() -> None:
    taken = claim("taken", allocation={"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]}})
    mine = claim("p-gpus-x", owner="pod-uid")
    raw = pod(by_template("t"), statuses=[{"name": "gpus", "resourceClaimName": "p-gpus-x"}])
    context, _ = view_of(raw, catalog(taken, mine, slices=(node_slice("n1", "a100", "a100"),)))
    assert context is not None
    assert [entry["claim"] for entry in context["claims"]] == ["p-gpus-x"]
    assert context["allocated"] == [[DRIVER, "n1", "gpu-0"]]
    assert [item["name"] for item in context["slices"]] == ["n1-slice"]


def test_the_filter_offers_only_nodes_whose_free_devices_match_and_allocates_them() -> None:
    taken = claim("taken", allocation={"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]}})
    wanted = claim("two-h100", count=2, expression=f'device.attributes["{DRIVER}"].model == "h100"')
    slices = (node_slice("n0", "a100", "a100"), node_slice("n1", "h100", "h100"), node_slice("n2", "h100", "h100"))
    _, parsed = view_of(pod(by_name("two-h100")), catalog(taken, wanted, slices=slices))
    nodes = table_of("n0", "n1", "n2", "n3")
    plugin = DynamicResources()
    result = plugin.filter(parsed, nodes)  # type: ignore[arg-type]
    assert result.mask.tolist() == [False, True, False, False]
    assert set(result.reasons) == {dra.CANNOT_ALLOCATE}
    allocation = allocation_on(parsed.devices, "n1", {})  # type: ignore[attr-defined]
    assert allocation is not None
    status = dra.allocation_status(allocation, 0)
    assert sorted(r["device"] for r in status["devices"]["results"]) == ["gpu-0", "gpu-1"]
    assert status["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}


def test_an_allocated_claim_keeps_its_pod_on_the_nodes_its_allocation_selects() -> None:
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": ["n1"]}]}]}
    shared = claim("shared", allocation={"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]}, "nodeSelector": selector})
    context, parsed = view_of(pod(by_name("shared")), catalog(shared))
    assert context is not None and "slices" not in context
    result = DynamicResources().filter(parsed, table_of("n0", "n1"))  # type: ignore[arg-type]
    assert result.mask.tolist() == [False, True]
    assert np.array_equal(result.reasons[NOT_AVAILABLE], np.array([True, False]))


def test_a_pod_without_claims_has_no_device_context() -> None:
    raw = pod()
    del raw["spec"]["resourceClaims"]
    assert device_context(compact_pod(raw), catalog()) is None


def _place(sizes: list[int], choose: Callable[[int, set[tuple[str, str, str]], list[int]], str | None],
           gpus: dict[str, int]) -> list[int]:
    """Place pods asking `sizes` GPUs one by one with `choose`; each node's GPUs in use afterwards."""
    used = dict.fromkeys(gpus, 0)
    held: set[tuple[str, str, str]] = set()
    for size in sizes:
        node = choose(size, held, [used[name] for name in gpus])
        if node is None:
            continue
        held.update((DRIVER, node, f"gpu-{used[node] + i}") for i in range(size))
        used[node] += size
    return list(used.values())


def test_gpu_packing_over_devices_leaves_as_many_whole_gpu_nodes_as_over_counted_gpus() -> None:
    """The gpu profile's GpuPacking, once with pods asking nvidia.com/gpu on nodes advertising 8, once with pods
    whose claims ask that many devices of nodes publishing 8: the same nodes, hence the same whole nodes left."""
    names = ["n0", "n1", "n2", "n3"]
    gpus = dict.fromkeys(names, 8)
    sizes = [3, 6, 2, 8, 5]  # first fit would leave no whole node; packing leaves n3
    packing = GpuPacking()
    counted_nodes = table(*(raw_node(name, GPU_NODE) for name in names))
    device_nodes = table(*(raw_node(name) for name in names))
    slices = tuple(node_slice(name, *(["h100"] * 8)) for name in names)

    def by_count(size: int, _held: set[tuple[str, str, str]], used: list[int]) -> str | None:
        for name, amount in zip(names, used, strict=True):
            counted_nodes.set_used(name, {"nvidia.com/gpu": amount})
        view = pod_view("p", {"nvidia.com/gpu": str(size)})
        feasible = counted_nodes.free_column("nvidia.com/gpu") >= size
        if not feasible.any():
            return None
        scores = packing.score(view, counted_nodes, feasible)
        return names[int(np.argmax(np.where(feasible, scores, -1)))]

    def by_devices(size: int, held: set[tuple[str, str, str]], _used: list[int]) -> str | None:
        taken = [claim(f"held-{i}", allocation={"devices": {"results": [
            {"request": "gpu", "driver": d, "pool": p, "device": n}]}}) for i, (d, p, n) in enumerate(sorted(held))]
        _, view = view_of(pod(by_name("want")), catalog(*taken, claim("want", count=size), slices=slices))
        result = DynamicResources().filter(view, device_nodes)  # type: ignore[arg-type]
        if not result.mask.any():
            return None
        scores = packing.score(view, device_nodes, result.mask)  # type: ignore[arg-type]
        return names[int(np.argmax(np.where(result.mask, scores, -1)))]

    counted = _place(sizes, by_count, gpus)
    devices = _place(sizes, by_devices, gpus)
    assert devices == counted
    assert devices == [8, 8, 8, 0], devices


EXTENDED = "example.com/gpu"


def extended_pod(containers: list[Json], inits: list[Json] | None = None) -> Json:
    raw: Json = {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
                 "spec": {"schedulerName": "hoss", "containers": containers}}
    if inits is not None:
        raw["spec"]["initContainers"] = inits
    return raw


def asks(name: str, amount: int, *, resource: str = EXTENDED, always: bool = False) -> Json:
    container: Json = {"name": name, "resources": {"requests": {"cpu": "1", resource: str(amount)},
                                                   "limits": {resource: str(amount)}}}
    if always:
        container["restartPolicy"] = "Always"
    return container


def serving(*, created: str = "2026-01-01T00:00:00Z", name: str = "gpu") -> Json:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"extendedResourceName": EXTENDED,
                     "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}


def requests_of(raw: Json) -> list[tuple[str, str, int]]:
    requests, _ = extended_requests(raw, EXTENDED, "gpu")
    return [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests]


def test_an_explicit_extended_resource_name_maps_to_the_oldest_class_that_sets_it() -> None:
    classes = {"newer": serving(created="2026-02-01T00:00:00Z", name="newer"), "older": serving(name="older"),
               "tie": serving(name="tie")}
    assert class_for(EXTENDED, classes) == "older", "the oldest wins; among equals the first by name"
    assert class_for("deviceclass.resource.kubernetes.io/newer", classes) == "newer"
    assert class_for("deviceclass.resource.kubernetes.io/absent", classes) is None
    assert class_for("example.com/fpga", classes) is None


def test_each_container_asks_its_own_request_named_as_kube_scheduler_names_it() -> None:
    # the cases of kube-scheduler's Test_createRequestsAndMappings_requests, for one resource
    assert requests_of(extended_pod([asks("a", 1)])) == [("container-0-request-1", "gpu", 1)], \
        "the index is the resource's among the container's sorted requests (cpu comes first)"
    assert requests_of(extended_pod([asks("a", 1), asks("b", 2)])) == [
        ("container-0-request-1", "gpu", 1), ("container-1-request-1", "gpu", 2)]
    # an init container asking more than the regular containers after it: its own request for what they lack
    assert requests_of(extended_pod([asks("main", 1)], inits=[asks("init", 2)])) == [
        ("container-0-request-1", "gpu", 1), ("container-1-request-1", "gpu", 1)]
    # two init containers: only the largest of their own requests is made, and both map to it
    raw = extended_pod([asks("main", 1)], inits=[asks("i0", 2), asks("i1", 3)])
    requests, mappings = extended_requests(raw, EXTENDED, "gpu")
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [
        ("container-1-request-1", 2), ("container-2-request-1", 1)]
    assert [(m["containerName"], m["requestName"]) for m in mappings] == [
        ("main", "container-2-request-1"), ("i0", "container-2-request-1"), ("i0", "container-1-request-1"),
        ("i1", "container-2-request-1"), ("i1", "container-1-request-1")]
    # an init container the long-lived ones after it cover asks nothing of its own (i0: the sidecar after it);
    # one they cover in part asks the rest (i2: main covers 1 of 2)
    raw = extended_pod([asks("main", 1)], inits=[asks("i0", 1), asks("side", 1, always=True), asks("i2", 2)])
    assert requests_of(raw) == [("container-1-request-1", "gpu", 1), ("container-2-request-1", "gpu", 1),
                                ("container-3-request-1", "gpu", 1)]


def extended_catalog(*claims: Json, slices: tuple[Json, ...] = ()) -> DeviceCatalog:
    made = catalog(*claims, slices=slices)
    made.replace("classes", [serving()])
    return made


def test_a_pod_asking_a_served_extended_resource_gets_devices_where_no_device_plugin_serves_it() -> None:
    slices = (node_slice("n0", "a100"), node_slice("n1", "a100", "a100"))
    context, parsed = view_of(extended_pod([asks("main", 2)]), extended_catalog(slices=slices))
    assert context is not None and [e["class"] for e in context["extended"]] == ["gpu"]
    nodes = table(raw_node("n0"), raw_node("n1"), raw_node("plugin", {"cpu": "8", "pods": "110", EXTENDED: "4"}),
                  raw_node("plugin-full", {"cpu": "8", "pods": "110", EXTENDED: "1"}))
    fit = NodeResourcesFit().filter(parsed, nodes)  # type: ignore[arg-type]
    assert fit.mask.tolist() == [True, True, True, False], "fit counts it only where a device plugin serves it"
    assert set(fit.reasons) == {f"Insufficient {EXTENDED}"}
    result = DynamicResources().filter(parsed, nodes)  # type: ignore[arg-type]
    assert result.mask.tolist() == [False, True, True, True], "DRA allocates it where no device plugin serves it"
    assert set(result.reasons) == {dra.CANNOT_ALLOCATE}
    assert nodes.request_on("n1", parsed) == {"cpu": 1000, "pods": 1}  # type: ignore[arg-type]
    assert nodes.request_on("plugin", parsed)[EXTENDED] == 2  # type: ignore[arg-type]
    allocation = allocation_at(parsed.devices, nodes, nodes.row("n1"))  # type: ignore[attr-defined]
    assert allocation is not None
    assert [r["request"] for r in dra.allocation_status(allocation, 0)["devices"]["results"]] == [
        "container-0-request-1", "container-0-request-1"]


def test_the_claim_an_earlier_attempt_made_is_named_and_its_devices_are_free_for_the_pod() -> None:
    earlier = claim("p-extended-resources-abcde", owner="pod-uid", allocation={"devices": {"results": [
        {"request": "container-0-request-1", "driver": DRIVER, "pool": "n0", "device": "gpu-0"}]}})
    earlier["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    context, _ = view_of(extended_pod([asks("main", 1)]),
                         extended_catalog(earlier, slices=(node_slice("n0", "a100"),)))
    assert context is not None
    assert context["stale"] == {"claim": "p-extended-resources-abcde", "uid": "p-extended-resources-abcde-uid"}
    assert context["allocated"] == []


def test_a_pod_asking_an_extended_resource_no_class_serves_has_no_device_context() -> None:
    assert device_context(compact_pod(extended_pod([asks("main", 1, resource="example.com/fpga")])),
                          extended_catalog()) is None


def linked_slice(node: str, domains: list[int]) -> Json:
    return {"metadata": {"name": f"{node}-slice"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"nvlink": {"int": domain}}}
                                 for i, domain in enumerate(domains)]}}


def test_a_profile_aligning_by_nvlink_gives_a_claim_devices_of_one_domain_where_first_fit_would_split_it() -> None:
    taken = claim("taken", allocation={"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "n0", "device": "gpu-0"}]}})
    slices = (linked_slice("n0", [0, 0, 1, 1]),)
    chosen = {}
    for align in ((), ("nvlinkDomain", "nvlink")):
        _, parsed = view_of(pod(by_name("two")), catalog(taken, claim("two", count=2), slices=slices))
        nodes = table_of("n0")
        assert DynamicResources(align_by=align).filter(parsed, nodes).mask.tolist() == [True]  # type: ignore[arg-type]
        allocation = allocation_at(parsed.devices, nodes, 0)  # type: ignore[attr-defined]
        assert allocation is not None
        chosen[align] = sorted(r["device"] for r in dra.allocation_status(allocation, 0)["devices"]["results"])
    assert chosen[()] == ["gpu-1", "gpu-2"], "kube-scheduler's first fit splits the pair over two domains"
    assert chosen[("nvlinkDomain", "nvlink")] == ["gpu-2", "gpu-3"], "one domain, left whole by the taken device"
    # no domain with two free: the same devices as first fit, never a refusal
    _, parsed = view_of(pod(by_name("three")), catalog(taken, claim("three", count=3), slices=slices))
    nodes = table_of("n0")
    assert DynamicResources(align_by=("nvlink",)).filter(parsed, nodes).mask.tolist() == [True]  # type: ignore[arg-type]
    allocation = allocation_at(parsed.devices, nodes, 0)  # type: ignore[attr-defined]
    assert allocation is not None
    assert sorted(r["device"] for r in dra.allocation_status(allocation, 0)["devices"]["results"]) == [
        "gpu-1", "gpu-2", "gpu-3"]


def test_align_by_is_refused_unless_a_list_of_names() -> None:
    assert DynamicResources.from_args({"alignBy": ["nvlink"]}).align_by == ("nvlink",)
    with pytest.raises(ValidationError, match="alignBy"):
        DynamicResources.from_args({"alignBy": "nvlink"})
    with pytest.raises(ValidationError, match="align"):
        DynamicResources.from_args({"align": ["nvlink"]})


def test_a_pod_carries_only_the_slices_of_the_drivers_its_classes_name() -> None:
    nic_slice = node_slice("n1", "nic")
    nic_slice["metadata"]["name"] = "n1-nics"
    nic_slice["spec"]["driver"] = "nic.example.com"
    devices = catalog(claim("c"), slices=(node_slice("n1", "a100"), nic_slice))
    context = device_context(compact_pod(pod(by_name("c"))), devices)
    assert context is not None and [item["name"] for item in context["slices"]] == ["n1-slice"]
    # a class whose selectors do not name its driver may select any device: every slice comes
    devices.replace("classes", [{"metadata": {"name": "gpu"}, "spec": {"selectors": [
        {"cel": {"expression": 'device.attributes["gpu.example.com"].model == "a100"'}}]}}])
    context = device_context(compact_pod(pod(by_name("c"))), devices)
    assert context is not None and [item["name"] for item in context["slices"]] == ["n1-nics", "n1-slice"]
