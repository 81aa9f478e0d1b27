"""What a pending pod's ResourceClaims need (the dispatcher's `device_context`) and the DynamicResources filter over
it (the worker's): kube-scheduler's PreFilter reasons, nodes by the devices their slices offer, devices other claims
hold left out, and the allocation written for the chosen node."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.devices import NOT_AVAILABLE, DynamicResources, allocation_on
from hoss.framework.plugins.gpu import GpuPacking
from hoss.framework.pod import parse_pod
from hoss.model import devices as dra
from hoss.model.compact import compact_pod
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
