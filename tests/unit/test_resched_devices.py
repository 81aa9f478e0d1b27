"""GPUs that are DRA devices as the rescheduler counts them (rescheduler/devices.py): the devices the class serving
the GPU resource selects, per node, per claim and per pod; which pods with claims may move; the room held for them."""

from __future__ import annotations

from hoss.model.objects import Json
from rescheduler.devices import claims_movable, device_gpus
from rescheduler.execute import plan_holds
from rescheduler.plan import GPU, Node, Pod, plan_for_pending

DRIVER = "gpu.example.com"


def node_slice(node: str, gpus: int, *, nics: int = 0) -> Json:
    devices = [{"name": f"gpu-{i}", "attributes": {"kind": {"string": "gpu"}}} for i in range(gpus)]
    devices += [{"name": f"nic-{i}", "attributes": {"kind": {"string": "nic"}}} for i in range(nics)]
    return {"metadata": {"name": f"{node}-slice"},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1}, "devices": devices}}


def device_class(name: str, *, serves: str | None = GPU, created: str = "2026-01-01T00:00:00Z") -> Json:
    spec: Json = {"selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].kind == "gpu"'}}]}
    if serves is not None:
        spec["extendedResourceName"] = serves
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def claim(name: str, node: str, *devices: str) -> Json:
    return {"metadata": {"name": name, "namespace": "ns"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": node, "device": device} for device in devices]}}}}


def pod(name: str, *entries: Json, made: dict[str, str] | None = None) -> Json:
    raw: Json = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"resourceClaims": list(entries)}}
    if made:
        raw["status"] = {"resourceClaimStatuses": [{"name": k, "resourceClaimName": v} for k, v in made.items()]}
    return raw


def test_gpus_are_the_devices_the_class_serving_the_gpu_resource_selects() -> None:
    found = device_gpus(slices=[node_slice("n1", 8, nics=2), node_slice("n2", 8)],
                        claims=[claim("a-gpus", "n1", "gpu-0", "gpu-1", "gpu-2", "gpu-3"),
                                claim("nic", "n1", "nic-0"), claim("b", "n2", "gpu-0")],
                        classes=[device_class("gpus"), device_class("nics", serves=None)], resource=GPU)
    assert found.served
    assert found.nodes == {"n1": 8, "n2": 8}, "the NICs are no GPUs"
    assert found.used == {"n1": 4, "n2": 1}
    assert found.pod_gpus(pod("a", {"name": "gpus", "resourceClaimTemplateName": "t"},
                              made={"gpus": "a-gpus"})) == 4
    assert found.pod_gpus(pod("b", {"name": "gpus", "resourceClaimName": "b"})) == 1


def test_without_a_class_serving_the_gpu_resource_no_device_is_a_gpu() -> None:
    found = device_gpus(slices=[node_slice("n1", 8)], claims=[], classes=[device_class("gpus", serves=None)],
                        resource=GPU)
    assert not found.served and found.nodes == {}


def test_a_pod_moves_only_when_each_of_its_claims_is_a_template_s() -> None:
    assert claims_movable(pod("a", {"name": "gpus", "resourceClaimTemplateName": "t"}, made={"gpus": "a-x"})) == ""
    assert "not the pod's own" in claims_movable(pod("b", {"name": "gpus", "resourceClaimName": "shared"}))


def test_the_room_held_for_a_pod_whose_gpus_are_devices_leaves_them_to_its_new_claim() -> None:
    # the example over device GPUs: the ledger holds the CPU only, the planner counts the GPUs
    nodes = [Node(name="n1", alloc={GPU: 8, "cpu": 32_000}, used={GPU: 7, "cpu": 7000}),
             Node(name="n2", alloc={GPU: 8, "cpu": 32_000}, used={})]
    a = Pod(key="ns/a", uid="a", node="n1", request={GPU: 4, "cpu": 4000}, owner="rs-a", held={"cpu": 4000})
    b = Pod(key="ns/b", uid="b", node="n1", request={GPU: 3, "cpu": 3000}, owner="rs-b", held={"cpu": 3000})
    c = Pod(key="ns/c", uid="c", node="", request={GPU: 4, "cpu": 4000}, held={"cpu": 4000})
    plan = plan_for_pending(c, nodes, [a, b])
    assert plan is not None and [(m.pod.key, m.target) for m in plan.moves] == [("ns/b", "n2")]
    holds = {hold.key: (hold.node, hold.request, hold.freeing) for hold in plan_holds(plan)}
    assert holds == {"move/b": ("n2", {"cpu": 3000}, {}), "c": ("n1", {"cpu": 4000}, {"cpu": 3000})}
