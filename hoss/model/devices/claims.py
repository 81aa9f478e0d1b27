"""What a ResourceClaim (resource.k8s.io/v1) asks for, with its DeviceClasses resolved: the allocator's input.
Pure, no I/O.

A request asks ``exactly`` (a class, CEL selectors, ``ExactCount`` with a ``count`` or ``All``, admin access,
tolerations, capacity minimums) or lists ``firstAvailable`` subrequests, tried in order. Constraints
(``matchAttribute``, ``distinctAttribute``) apply to the requests they name, or to all. Configuration from the classes
and the claim is carried into the allocation as kube-scheduler carries it.

A claim kube-scheduler could never allocate (a missing DeviceClass, an unknown request or constraint type, too many
devices) raises `ClaimError` whose `message` is kube-scheduler's text for it; a field hoss cannot read raises
`DeviceError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hoss.errors import HossError
from hoss.model.devices.inventory import DeviceError, Taint
from hoss.model.objects import Json, section
from hoss.model.resources import parse_quantity

ALLOCATION_RESULTS_MAX_SIZE = 32
"""resourceapi.AllocationResultsMaxSize: the most devices one claim may be allocated."""

_EXACT_FIELDS = frozenset({"deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations",
                           "capacity"})
_SUBREQUEST_FIELDS = _EXACT_FIELDS - {"adminAccess"} | {"name"}


class ClaimError(HossError, ValueError):
    """A claim that cannot be allocated on any node as it stands; `message` is kube-scheduler's reason."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Json, ...]
    """each ``spec.config`` entry's DeviceConfiguration (``{"opaque": ...}``)"""


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """ToleratesTaint (k8s.io/dynamic-resource-allocation/resourceclaim)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        return self.operator == "Exists"


@dataclass(frozen=True)
class Request:
    """A request asking ``exactly``, or one subrequest of a ``firstAvailable`` list (`parent` names its request)."""

    name: str
    parent: str | None
    device_class: DeviceClass
    selectors: tuple[str, ...]
    all_devices: bool
    count: int
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    raw_tolerations: tuple[Json, ...]
    capacity: Mapping[str, Fraction] | None

    @property
    def full_name(self) -> str:
        """``request`` or ``request/subrequest``, as results and configs name it."""
        return self.name if self.parent is None else f"{self.parent}/{self.name}"

    def tolerates(self, taint: Taint) -> bool:
        return any(toleration.tolerates(taint) for toleration in self.tolerations)


@dataclass(frozen=True)
class RequestNeed:
    """One entry of ``spec.devices.requests``: a single alternative for ``exactly``, several for ``firstAvailable``."""

    name: str
    alternatives: tuple[Request, ...]
    first_available: bool


@dataclass(frozen=True)
class Constraint:
    attribute: str
    requests: frozenset[str]
    distinct: bool = False
    per_driver: bool = False
    """`attribute` is a bare name, looked up under each device's own driver (hoss's alignment, never a claim's)."""

    def qualified(self, driver: str) -> str:
        """The attribute's full name for a device of `driver`."""
        return f"{driver}/{self.attribute}" if self.per_driver else self.attribute

    def applies_to(self, request: Request) -> bool:
        if not self.requests:
            return True
        base = request.parent or request.name
        return base in self.requests or (request.parent is not None and request.full_name in self.requests)


@dataclass(frozen=True)
class ClaimNeed:
    """What one ResourceClaim needs allocated."""

    namespace: str
    name: str
    uid: str
    requests: tuple[RequestNeed, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Json, ...]
    """``spec.devices.config`` as written (requests and the DeviceConfiguration)"""

    @property
    def key(self) -> str:
        """``namespace/name``, as kube-scheduler's messages name a claim."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def parse_device_class(device_class: Mapping[str, Any]) -> DeviceClass:
    metadata = section(device_class, "metadata")
    name = str(metadata.get("name", ""))
    spec = section(device_class, "spec")
    where = f"DeviceClass {name}: spec"
    selectors = []
    for i, selector in enumerate(spec.get("selectors") or []):
        expression = section(selector, "cel").get("expression") if isinstance(selector, dict) else None
        if not isinstance(expression, str):
            raise ClaimError(f"class {name}: selector #{i}: CEL expression empty (unsupported selector type?)")
        selectors.append(expression)
    config = []
    for i, entry in enumerate(spec.get("config") or []):
        if not isinstance(entry, dict):
            raise DeviceError(field=f"{where}.config[{i}]", reason="expected an object")
        config.append(dict(entry))
    return DeviceClass(name=name, selectors=tuple(selectors), config=tuple(config))


def claim_needs(claim: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]) -> ClaimNeed:
    """The claim's needs with its classes (`classes`: DeviceClass objects by name). Raises ClaimError with
    kube-scheduler's reason for a claim no node can take, DeviceError for a field hoss cannot read."""
    metadata = section(claim, "metadata")
    namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
    key = f"{namespace}/{name}" if namespace else name
    devices = section(section(claim, "spec"), "devices")
    where = f"ResourceClaim {key}: spec.devices"
    requests = []
    for i, request in enumerate(devices.get("requests") or []):
        if not isinstance(request, dict) or not isinstance(request.get("name"), str):
            raise DeviceError(field=f"{where}.requests[{i}]", reason="expected an object with a name")
        request_name = request["name"]
        exactly, first_available = request.get("exactly"), request.get("firstAvailable")
        alternatives: tuple[Request, ...]
        if exactly is not None:
            alternatives = (_request(exactly, name=request_name, parent=None, claim=key, classes=classes,
                                     field=f"{where}.requests[{i}].exactly", known=_EXACT_FIELDS),)
        elif first_available:
            alternatives = tuple(
                _request(sub, name=str(sub.get("name")) if isinstance(sub, dict) else "", parent=request_name,
                         claim=key, classes=classes, field=f"{where}.requests[{i}].firstAvailable[{j}]",
                         known=_SUBREQUEST_FIELDS)
                for j, sub in enumerate(first_available))
        else:
            raise ClaimError(f"resource claim {key}, request {request_name}: unknown request type")
        requests.append(RequestNeed(name=request_name, alternatives=alternatives,
                                    first_available=exactly is None))
    constraints = []
    for i, item in enumerate(devices.get("constraints") or []):
        constraint: Mapping[str, Any] = item if isinstance(item, dict) else {}
        names = frozenset(str(n) for n in constraint.get("requests") or [])
        if constraint.get("matchAttribute"):
            constraints.append(Constraint(attribute=str(constraint["matchAttribute"]), requests=names))
        elif constraint.get("distinctAttribute"):
            constraints.append(Constraint(attribute=str(constraint["distinctAttribute"]), requests=names,
                                          distinct=True))
        else:
            raise ClaimError(f"claim {key}, constraint #{i}: empty constraint (unsupported constraint type?)")
    minimum = sum(min(_least_devices(a) for a in need.alternatives) for need in requests)
    if minimum > ALLOCATION_RESULTS_MAX_SIZE:
        raise ClaimError(f"claim {key}: number of requested devices {minimum} exceeds the claim limit of "
                         f"{ALLOCATION_RESULTS_MAX_SIZE}")
    config = []
    for i, entry in enumerate(devices.get("config") or []):
        if not isinstance(entry, dict):
            raise DeviceError(field=f"{where}.config[{i}]", reason="expected an object")
        config.append(dict(entry))
    return ClaimNeed(namespace=namespace, name=name, uid=str(metadata.get("uid", "")), requests=tuple(requests),
                     constraints=tuple(constraints), config=tuple(config))


def _least_devices(request: Request) -> int:
    # "All" is known only per node; the allocator checks it there.
    return 0 if request.all_devices else request.count


def _request(item: object, *, name: str, parent: str | None, claim: str, classes: Mapping[str, Mapping[str, Any]],
             field: str, known: frozenset[str]) -> Request:
    if not isinstance(item, dict):
        raise DeviceError(field=field, reason="expected an object")
    for key in item:
        if key not in known:
            raise DeviceError(field=f"{field}.{key}", reason="not supported by hoss")
    full_name = name if parent is None else f"{parent}/{name}"
    class_name = item.get("deviceClassName")
    if not isinstance(class_name, str) or not class_name:
        raise ClaimError(f"request {full_name}: unsupported request type")
    if class_name not in classes:
        raise ClaimError(f"request {full_name}: device class {class_name} does not exist")
    selectors = []
    for i, selector in enumerate(item.get("selectors") or []):
        expression = section(selector, "cel").get("expression") if isinstance(selector, dict) else None
        if not isinstance(expression, str):
            raise ClaimError(f"claim {claim}, request {name}, selector #{i}: CEL expression empty "
                             "(unsupported selector type?)")
        selectors.append(expression)
    mode = item.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"claim {claim}, request {name}: unsupported count mode {mode}")
    count = item.get("count", 1 if mode == "ExactCount" else 0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise DeviceError(field=f"{field}.count", reason="expected a non-negative integer")
    raw_tolerations = tuple(dict(t) for t in item.get("tolerations") or [] if isinstance(t, dict))
    tolerations = tuple(Toleration(key=str(t.get("key", "")), operator=str(t.get("operator", "")),
                                   value=str(t.get("value", "")), effect=str(t.get("effect", "")))
                        for t in raw_tolerations)
    capacity = None
    if item.get("capacity") is not None:
        requested = section(item, "capacity").get("requests") or {}
        capacity = {str(k): parse_quantity(v, field=f"{field}.capacity.requests[{k}]") for k, v in requested.items()}
    return Request(name=name, parent=parent, device_class=parse_device_class(classes[class_name]),
                   selectors=tuple(selectors), all_devices=mode == "All", count=count,
                   admin_access=item.get("adminAccess") is True, tolerations=tolerations,
                   raw_tolerations=raw_tolerations, capacity=capacity)
