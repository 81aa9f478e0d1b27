"""hoss.model.devices: ResourceSlices read into an inventory (and fields hoss does not honour refused by name), claims
read with their DeviceClasses (kube-scheduler's reasons for claims no node can take), the DRA CEL environment, and
the allocator's choices on one node, with what the ledger holds for them. The same allocator is held to Kubernetes'
own on shared cases in test_devices_golden.py."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from hoss.model.devices import (
    CANNOT_ALLOCATE,
    INVALID_POOLS,
    AllocationError,
    ClaimError,
    DeviceError,
    Inventory,
    allocate,
    allocated_devices,
    allocation_status,
    claim_needs,
    counters_consumed,
    counters_of,
    devices_of,
    node_failure_reason,
)
from hoss.model.devices.cel import CelDevice, CelError, device_matches, parse_semver
from hoss.model.devices.claims import ClaimNeed
from hoss.model.objects import Json

DRIVER = "gpu.example.com"
GI = 2**30


def gpu_slice(name: str, devices: list[Json], *, node: str | None = "node-1", pool: str = "node-1",
              generation: int = 1, count: int = 1, **spec: Any) -> Json:
    body: Json = {"driver": DRIVER, "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                  **({"nodeName": node} if node else {}), **({"devices": devices} if devices else {}), **spec}
    return {"metadata": {"name": name}, "spec": body}


def gpu(name: str, model: str = "a100", **extra: Any) -> Json:
    return {"name": name, "attributes": {"model": {"string": model}}, "capacity": {"memory": {"value": "80Gi"}},
            **extra}


CLASSES: dict[str, Json] = {"gpu": {"metadata": {"name": "gpu"}, "spec": {
    "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}}


def claim(name: str, *requests: Json, constraints: list[Json] | None = None, config: list[Json] | None = None) -> Json:
    devices: Json = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"metadata": {"name": name, "namespace": "team", "uid": f"u-{name}"}, "spec": {"devices": devices}}


def exactly(name: str, count: int = 1, *selectors: str, **extra: Any) -> Json:
    return {"name": name, "exactly": {"deviceClassName": "gpu", "count": count,
                                      "selectors": [{"cel": {"expression": e}} for e in selectors], **extra}}


def picked(needs: list[ClaimNeed], inventory: Inventory, *, allocated: frozenset[tuple[str, str, str]] = frozenset(),
           labels: dict[str, str] | None = None, **extra: Any) -> list[list[str]] | None:
    allocation = allocate(needs, node="node-1", node_labels=labels or {}, inventory=inventory, allocated=allocated,
                          **extra)
    if allocation is None:
        return None
    return [[result.device[2] for result in claim_.results] for claim_ in allocation.claims]


FOUR = Inventory.from_slices([gpu_slice("s", [gpu(f"gpu-{i}") for i in range(4)])])


# --- CEL ---

def cel_device(**attributes: Any) -> CelDevice:
    return CelDevice(driver=DRIVER, attributes={(DRIVER, k): v for k, v in attributes.items()},
                     capacity={(DRIVER, "memory"): Fraction(80 * GI)})


@pytest.mark.parametrize(("expression", "holds"), [
    (f"device.attributes['{DRIVER}'].model == 'h100'", True),
    (f"device.attributes['{DRIVER}'].model.startsWith('a')", False),
    (f"device.attributes['{DRIVER}'].cores > 100 && device.attributes['{DRIVER}'].ecc", True),
    (f"device.capacity['{DRIVER}'].memory.compareTo(quantity('80Gi')) == 0", True),
    (f"device.capacity['{DRIVER}'].memory == quantity('81920Mi')", True),
    (f"device.capacity['{DRIVER}'].memory.isLessThan(quantity('0.1Ti'))", True),
    (f"device.capacity['{DRIVER}'].memory.asInteger() == {80 * GI}", True),
    (f"device.capacity['{DRIVER}'].memory.add(quantity('1Gi')).isGreaterThan(quantity('80Gi'))", True),
    (f"device.attributes['{DRIVER}'].driver.isGreaterThan(semver('1.10.0'))", True),
    (f"device.attributes['{DRIVER}'].driver.isLessThan(semver('1.12.0-rc.1'))", True),
    (f"device.attributes['{DRIVER}'].driver.minor() == 11", True),
    ("isSemver('1.2') || isSemver('v1.2.0')", False),
    ("semver('v1.02', true) == semver('1.2.0')", True),
    ("isQuantity('12Mi') && !isQuantity('12 Mi')", True),
    ("quantity('-5').sign() == -1", True),
    ("device.allowMultipleAllocations", False),
    ("device.attributes['other.example.com'].size() == 0", True),
    (f"'numa' in device.attributes['{DRIVER}']", False),
    (f"!has(device.attributes['{DRIVER}'].numa)", True),
    (f"device.attributes['{DRIVER}'].numa == 1 && false", False),
])
def test_selectors_in_the_dra_cel_environment(expression: str, holds: bool) -> None:
    device = cel_device(model="h100", cores=132, ecc=True, driver=parse_semver("1.11.2"))
    assert device_matches(expression, device) is holds


@pytest.mark.parametrize(("expression", "says"), [
    (f"device.attributes['{DRIVER}'].numa == 1", "no such key: numa"),
    ("device.attributes['other.example.com'].numa == 1", "no such key: numa"),
    ("quantity('1.5').asInteger() == 1", "cannot convert value to integer"),
    ("quantity('x') == quantity('1')", "quantities must match"),
    ("semver('1.2') == semver('1.2.0')", "not valid SemVer"),
    (f"device.attributes['{DRIVER}'].model", "could not be converted to bool"),
    ("device.driver ==", "compilation failed"),
])
def test_selector_errors_say_what_kube_scheduler_says(expression: str, says: str) -> None:
    with pytest.raises(CelError, match=says):
        device_matches(expression, cel_device(model="h100"))


# --- the inventory ---

@pytest.mark.parametrize(("device", "field"), [
    ({"bindingConditions": ["ready"]}, "spec.devices[0].bindingConditions"),
    ({"bindsToNode": True}, "spec.devices[0].bindsToNode"),
    ({"allowMultipleAllocations": True}, "spec.devices[0].allowMultipleAllocations"),
    ({"capacity": {"memory": {"value": "1Gi", "requestPolicy": {"default": "1Gi"}}}},
     "spec.devices[0].capacity[memory].requestPolicy"),
    ({"attributes": {"cores": {"ints": [1, 2]}}}, "spec.devices[0].attributes[cores].ints"),
    ({"attributes": {"cores": {"int": "8"}}}, "spec.devices[0].attributes[cores].int"),
    ({"attributes": {"v": {"version": "1.2"}}}, "spec.devices[0].attributes[v].version"),
    ({"futureField": 1}, "spec.devices[0].futureField"),
    ({"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.uid", "operator": "In",
                                                                "values": ["x"]}]}]}},
     "spec.devices[0].nodeSelector.nodeSelectorTerms[0].matchFields[0].key"),
])
def test_a_device_field_hoss_does_not_honour_is_refused_by_name(device: Json, field: str) -> None:
    with pytest.raises(DeviceError) as raised:
        Inventory.from_slices([gpu_slice("s", [{"name": "d", **device}])])
    assert raised.value.field == f"ResourceSlice s: {field}"


def test_false_flags_and_known_fields_are_read() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [gpu("d", bindsToNode=False, allowMultipleAllocations=False,
                                                           taints=[{"key": "k", "effect": "NoSchedule"}])])])
    (device,) = inventory.slices[0].devices
    assert device.capacity == {"memory": Fraction(80 * GI)}
    assert device.attribute(f"{DRIVER}/model") == "a100", "the driver's domain reaches an unqualified name"
    assert device.attribute("other.example.com/model") is None


def test_a_slice_field_v1_does_not_have_is_refused() -> None:
    with pytest.raises(DeviceError, match=r"spec\.suitableNodes: not supported by hoss"):
        Inventory.from_slices([gpu_slice("s", [gpu("d")], suitableNodes=[])])


def test_pools_a_node_sees_and_their_order() -> None:
    inventory = Inventory.from_slices([
        gpu_slice("z", [gpu("z-0")], pool="z-pool"),
        gpu_slice("other-node", [gpu("o-0")], pool="o-pool", node="node-2"),
        gpu_slice("fabric", [gpu("f-0")], pool="a-fabric", node=None,
                  nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "rack", "operator": "Gt", "values": ["3"]}]}]}),
        gpu_slice("everywhere", [gpu("e-0")], pool="b-everywhere", node=None, allNodes=True),
    ])
    assert [p.name for p in inventory.pools_for(node="node-1", labels={"rack": "4"})] == [
        "a-fabric", "b-everywhere", "z-pool"]
    assert [p.name for p in inventory.pools_for(node="node-1", labels={"rack": "3"})] == ["b-everywhere", "z-pool"]
    assert [p.name for p in inventory.pools_for(node="node-2", labels={})] == ["b-everywhere", "o-pool"]


def test_only_complete_pools_of_the_newest_generation_allocate() -> None:
    two_of_two = [gpu_slice("a", [gpu("a-0")], count=2, generation=3), gpu_slice("b", [gpu("b-0")], count=2,
                                                                                    generation=3)]
    stale = gpu_slice("old", [gpu("old-0")], generation=2, count=2)
    inventory = Inventory.from_slices([stale, *two_of_two])
    (pool,) = inventory.pools_for(node="node-1", labels={})
    assert pool.usable and [s.name for s in pool.slices] == ["a", "b"]
    one_of_two = Inventory.from_slices([stale, two_of_two[0]])
    (pool,) = one_of_two.pools_for(node="node-1", labels={})
    assert pool.incomplete
    newer_elsewhere = Inventory.from_slices([two_of_two[0], gpu_slice("c", [gpu("c-0")], node="node-2", generation=4,
                                                                      count=2)])
    assert newer_elsewhere.pools_for(node="node-1", labels={}) == [], "the driver is replacing the pool"


def test_an_invalid_pool_allocates_nothing_and_the_node_says_why() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [gpu("d", consumesCounters=[
        {"counterSet": "missing", "counters": {"memory": {"value": "1Gi"}}}])])])
    (pool,) = inventory.pools_for(node="node-1", labels={})
    assert pool.invalid_reason == "counter set missing not found"
    needs = [claim_needs(claim("c", exactly("one")), CLASSES)]
    assert picked(needs, inventory) is None
    assert node_failure_reason(needs, node="node-1", node_labels={}, inventory=inventory) == INVALID_POOLS
    assert node_failure_reason(needs, node="node-1", node_labels={}, inventory=FOUR) == CANNOT_ALLOCATE


# --- claims ---

def test_a_missing_class_is_refused_with_kube_schedulers_words() -> None:
    with pytest.raises(ClaimError) as raised:
        claim_needs(claim("c", {"name": "gpus", "exactly": {"deviceClassName": "tpu"}}), CLASSES)
    assert raised.value.message == "request gpus: device class tpu does not exist"
    sub = {"name": "gpus", "firstAvailable": [{"name": "big", "deviceClassName": "gpu"},
                                              {"name": "small", "deviceClassName": "tpu"}]}
    with pytest.raises(ClaimError, match=r"^request gpus/small: device class tpu does not exist$"):
        claim_needs(claim("c", sub), CLASSES)


@pytest.mark.parametrize(("request_", "says"), [
    ({"name": "r"}, "resource claim team/c, request r: unknown request type"),
    ({"name": "r", "exactly": {"deviceClassName": ""}}, "request r: unsupported request type"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu", "allocationMode": "Some"}},
     "claim team/c, request r: unsupported count mode Some"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu", "selectors": [{}]}},
     "claim team/c, request r, selector #0: CEL expression empty (unsupported selector type?)"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu", "count": 33}},
     "claim team/c: number of requested devices 33 exceeds the claim limit of 32"),
])
def test_claims_no_node_can_take(request_: Json, says: str) -> None:
    with pytest.raises(ClaimError) as raised:
        claim_needs(claim("c", request_), CLASSES)
    assert raised.value.message == says


def test_an_empty_constraint_and_an_unknown_request_field() -> None:
    with pytest.raises(ClaimError, match=r"constraint #0: empty constraint"):
        claim_needs(claim("c", exactly("r"), constraints=[{"requests": ["r"]}]), CLASSES)
    with pytest.raises(DeviceError, match=r"exactly\.future: not supported by hoss"):
        claim_needs(claim("c", {"name": "r", "exactly": {"deviceClassName": "gpu", "future": 1}}), CLASSES)


def test_defaults_of_a_request() -> None:
    (need,) = claim_needs(claim("c", {"name": "r", "exactly": {"deviceClassName": "gpu"}}), CLASSES).requests
    (request,) = need.alternatives
    assert (request.count, request.all_devices, request.admin_access) == (1, False, False)


# --- allocating ---

def test_devices_in_order_skipping_allocated_ones() -> None:
    needs = [claim_needs(claim("c", exactly("r", 2)), CLASSES)]
    assert picked(needs, FOUR) == [["gpu-0", "gpu-1"]]
    assert picked(needs, FOUR, allocated=frozenset({(DRIVER, "node-1", "gpu-1")})) == [["gpu-0", "gpu-2"]]
    everything = frozenset((DRIVER, "node-1", f"gpu-{i}") for i in range(3))
    assert picked(needs, FOUR, allocated=everything) is None


def test_backtracking_finds_a_pair_sharing_an_attribute() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [
        gpu(f"gpu-{i}", attributes={"nvlink": {"string": domain}}) for i, domain in enumerate("abcb")])])
    needs = [claim_needs(claim("c", exactly("r", 2), constraints=[{"matchAttribute": f"{DRIVER}/nvlink"}]), CLASSES)]
    assert picked(needs, inventory) == [["gpu-1", "gpu-3"]]


def test_all_devices_with_a_constraint_that_cannot_hold_aborts() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [
        gpu(f"gpu-{i}", attributes={"nvlink": {"string": domain}}) for i, domain in enumerate("ab")])])
    needs = [claim_needs(claim("c", {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}},
                               constraints=[{"matchAttribute": f"{DRIVER}/nvlink"}]), CLASSES)]
    with pytest.raises(AllocationError, match=r"^claim team/c, request all: cannot add device "
                                              r"gpu\.example\.com/node-1/gpu-1 because a claim constraint"):
        picked(needs, inventory)


def test_a_cel_runtime_error_aborts_only_when_reached() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [gpu("gpu-0", attributes={"numa": {"int": 0}}), gpu("gpu-1")])])
    needs = [claim_needs(claim("c", exactly("r", 1, f"device.attributes['{DRIVER}'].numa == 0")), CLASSES)]
    assert picked(needs, inventory) == [["gpu-0"]], "gpu-1 is never looked at"
    taken = frozenset({(DRIVER, "node-1", "gpu-0")})
    with pytest.raises(AllocationError, match=r"^claim team/c: selector #0: CEL runtime error: no such key: numa$"):
        picked(needs, inventory, allocated=taken)


def test_a_class_selector_error_names_the_class() -> None:
    classes = {"gpu": {"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": "device.x.y"}}]}}}
    needs = [claim_needs(claim("c", exactly("r")), classes)]
    with pytest.raises(AllocationError, match=r"^class gpu: selector #0: CEL runtime error"):
        picked(needs, FOUR)


def test_admin_access_is_not_held_and_not_a_second_time_in_one_claim() -> None:
    everything = frozenset((DRIVER, "node-1", f"gpu-{i}") for i in range(4))
    needs = [claim_needs(claim("c", exactly("r", 4, adminAccess=True)), CLASSES)]
    allocation = allocate(needs, node="node-1", node_labels={}, inventory=FOUR, allocated=everything)
    assert allocation is not None and devices_of(allocation) == frozenset()
    assert allocated_devices({"status": {"allocation": allocation_status(allocation, 0)}}) == frozenset()
    assert allocation_status(allocation, 0)["devices"]["results"][0]["adminAccess"] is True
    needs = [claim_needs(claim("c", exactly("r", 5, adminAccess=True)), CLASSES)]
    assert picked(needs, FOUR, allocated=everything) is None


def test_shared_counters_from_the_inventory_or_from_the_ledger() -> None:
    inventory = Inventory.from_slices([
        gpu_slice("counters", [], node=None, count=2,
                  sharedCounters=[{"name": "mem", "counters": {"memory": {"value": "80Gi"}}}]),
        gpu_slice("parts", [{"name": f"half-{i}", "consumesCounters": [
            {"counterSet": "mem", "counters": {"memory": {"value": "40Gi"}}}]} for i in range(3)], count=2),
    ])
    needs = [claim_needs(claim("c", exactly("r")), CLASSES)]
    allocation = allocate(needs, node="node-1", node_labels={}, inventory=inventory, allocated=frozenset())
    assert allocation is not None and [r.device[2] for r in allocation.claims[0].results] == ["half-0"]
    assert counters_consumed(allocation) == {(DRIVER, "node-1", "mem", "memory"): Fraction(40 * GI)}
    assert devices_of(allocation) == {(DRIVER, "node-1", "half-0")}
    two = [claim_needs(claim("c", exactly("r", 2)), CLASSES)]
    assert picked(two, inventory) == [["half-0", "half-1"]]
    assert picked(two, inventory, allocated=frozenset({(DRIVER, "node-1", "half-2")})) is None, \
        "the allocated half draws on the same counters"
    written = {"status": {"allocation": allocation_status(allocation, 0)}}
    assert allocated_devices(written) == devices_of(allocation)
    assert counters_of(allocated_devices(written), inventory) == counters_consumed(allocation)
    assert counters_of({(DRIVER, "node-1", "gone")}, inventory) == {}
    held = {(DRIVER, "node-1", "mem", "memory"): Fraction(41 * GI)}
    assert picked(needs, inventory, counters_used=held) is None, "the ledger's count replaces the inventory's"
    assert picked(needs, inventory, counters_used={}) == [["half-0"]]


def test_taints_block_unless_tolerated() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [
        gpu("gpu-0", taints=[{"key": "ecc", "value": "bad", "effect": "NoExecute"}]), gpu("gpu-1")])])
    needs = [claim_needs(claim("c", exactly("r")), CLASSES)]
    assert picked(needs, inventory) == [["gpu-1"]]
    wrong_value = [claim_needs(claim("c", exactly("r", 2, tolerations=[{"key": "ecc", "value": "good"}])), CLASSES)]
    assert picked(wrong_value, inventory) is None
    tolerating = [claim_needs(claim("c", exactly("r", 2, tolerations=[{"key": "ecc", "operator": "Exists",
                                                                        "effect": "NoExecute"}])), CLASSES)]
    allocation = allocate(tolerating, node="node-1", node_labels={}, inventory=inventory, allocated=frozenset())
    assert allocation is not None
    assert allocation_status(allocation, 0)["devices"]["results"][0]["tolerations"] == [
        {"key": "ecc", "operator": "Exists", "effect": "NoExecute"}]


def test_first_available_tries_subrequests_in_order_across_claims() -> None:
    first_available = {"name": "gpus", "firstAvailable": [
        {"name": "three", "deviceClassName": "gpu", "count": 3}, {"name": "one", "deviceClassName": "gpu"}]}
    needs = [claim_needs(claim("a", exactly("r", 2)), CLASSES), claim_needs(claim("b", first_available), CLASSES)]
    allocation = allocate(needs, node="node-1", node_labels={}, inventory=FOUR, allocated=frozenset())
    assert allocation is not None
    assert [(r.request, r.device[2]) for r in allocation.claims[1].results] == [("gpus/one", "gpu-2")]


def test_the_status_body_pins_node_local_devices_to_the_node() -> None:
    config = [{"requests": ["r"], "opaque": {"driver": DRIVER, "parameters": {"a": 1}}}]
    needs = [claim_needs(claim("c", exactly("r"), config=config), CLASSES)]
    allocation = allocate(needs, node="node-1", node_labels={}, inventory=FOUR, allocated=frozenset())
    assert allocation is not None
    assert allocation_status(allocation, 0) == {
        "devices": {"results": [{"request": "r", "driver": DRIVER, "pool": "node-1", "device": "gpu-0"}],
                    "config": [{"source": "FromClaim", "requests": ["r"],
                                "opaque": {"driver": DRIVER, "parameters": {"a": 1}}}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]},
    }


def test_network_attached_devices_carry_their_selector_and_all_nodes_none() -> None:
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}
    inventory = Inventory.from_slices([
        gpu_slice("fabric", [gpu("f-0")], pool="fabric", node=None, nodeSelector=selector),
        gpu_slice("everywhere", [gpu("e-0")], pool="everywhere", node=None, allNodes=True)])
    for name, expected in (("f-0", selector), ("e-0", None)):
        selectors = [f"device.attributes['{DRIVER}'].model == 'a100'"]
        needs = [claim_needs(claim("c", exactly("r", 1, *selectors)), CLASSES)]
        # pools go by name: "everywhere" before "fabric"
        taken = frozenset({(DRIVER, "everywhere", "e-0")}) if name == "f-0" else frozenset()
        allocation = allocate(needs, node="node-1", node_labels={"zone": "a"}, inventory=inventory, allocated=taken)
        assert allocation is not None and allocation.claims[0].results[0].device[2] == name
        assert allocation_status(allocation, 0).get("nodeSelector") == expected
    needs = [claim_needs(claim("c", exactly("r")), CLASSES)]
    only_fabric = frozenset({(DRIVER, "everywhere", "e-0")})
    assert picked(needs, inventory, labels={"zone": "b"}, allocated=only_fabric) is None, "no fabric in zone b"


def test_more_than_32_devices_for_all_is_refused() -> None:
    inventory = Inventory.from_slices([gpu_slice("s", [gpu(f"gpu-{i}") for i in range(33)])])
    needs = [claim_needs(claim("c", {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}}),
                         CLASSES)]
    with pytest.raises(AllocationError, match=r"number of requested devices 33 exceeds the claim limit of 32"):
        picked(needs, inventory)
