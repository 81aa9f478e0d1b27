"""Kubernetes quantities, a pod's effective request and a node's allocatable, against hand-computed values."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from hoss.errors import NodeSpecError, PodSpecError, QuantityError
from hoss.model import resources
from hoss.model.resources import (
    MAX_UNITS,
    add,
    fits,
    format_quantity,
    node_allocatable,
    parse_quantity,
    pod_requests,
    subtract,
    to_base_units,
)

FIELD = "spec.containers[0].resources.requests.cpu"
Ki, Mi, Gi = 2**10, 2**20, 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("+3", Fraction(3)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("2.", Fraction(2)),
        ("100n", Fraction(100, 10**9)),
        ("250u", Fraction(250, 10**6)),
        ("500m", Fraction(1, 2)),
        ("2k", Fraction(2000)),
        ("3M", Fraction(3 * 10**6)),
        ("4G", Fraction(4 * 10**9)),
        ("5T", Fraction(5 * 10**12)),
        ("6P", Fraction(6 * 10**15)),
        ("7E", Fraction(7 * 10**18)),
        ("1Ki", Fraction(Ki)),
        ("1.5Mi", Fraction(3 * Mi, 2)),
        ("2Gi", Fraction(2 * Gi)),
        ("3Ti", Fraction(3 * 2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("1e3", Fraction(1000)),
        ("1E-3", Fraction(1, 1000)),
        ("12.5e2", Fraction(1250)),
        ("1e+3", Fraction(1000)),
        (4, Fraction(4)),
        (0.1, Fraction(1, 10)),
        (2.5, Fraction(5, 2)),
    ],
)
def test_quantity_is_parsed_exactly(text: str | int | float, expected: Fraction) -> None:
    assert parse_quantity(text, field=FIELD) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "empty"),
        ("abc", "expected a number"),
        ("12x", "unknown suffix 'x'"),
        ("1K", "unknown suffix 'K'"),
        ("1e", "unknown suffix 'e'"),
        ("1.2.3", "unknown suffix '.3'"),
        (" 1", "expected a number"),
        ("1 ", "unknown suffix ' '"),
        ("--1", "expected a number"),
        ("Mi", "expected a number"),
        (".", "expected a number"),
        ("0x10", "unknown suffix 'x10'"),
        ("1e999", "exponent 999 is out of range"),
        ("1" * 65, "longer than 64 characters"),
        (float("nan"), "not a finite number"),
        (float("inf"), "not a finite number"),
        (True, "expected a string or a number"),
        (None, "expected a string or a number"),
        (["1"], "expected a string or a number"),
    ],
)
def test_garbage_quantity_is_rejected_naming_field_and_value(value: Any, reason: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(value, field=FIELD)
    assert caught.value.field == FIELD
    assert caught.value.value is value
    assert str(caught.value).startswith(f"{FIELD}: invalid quantity {value!r}: ")
    assert reason in caught.value.reason


def test_quantity_error_message_names_field_value_and_reason() -> None:
    with pytest.raises(
        QuantityError,
        match=r"^spec\.containers\[0\]\.resources\.requests\.cpu: invalid quantity "
        r"'12x': unknown suffix 'x'$",
    ):
        parse_quantity("12x", field=FIELD)


@pytest.mark.parametrize("value", ["-1", "-500m", "-1Gi", "-1e3", -2, -0.5])
def test_negative_quantity_is_rejected(value: str | int | float) -> None:
    with pytest.raises(QuantityError, match="must not be negative") as caught:
        parse_quantity(value, field=FIELD)
    assert FIELD in str(caught.value)
    assert repr(value) in str(caught.value)


def test_quantity_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity("lots", field=FIELD)


@pytest.mark.parametrize(
    ("resource", "text", "units"),
    [
        ("cpu", "0.0001", 1),
        ("cpu", "100n", 1),
        ("cpu", "500m", 500),
        ("cpu", "1.0001", 1001),
        ("cpu", "2", 2000),
        ("memory", "1.5", 2),
        ("memory", "1Ki", 1024),
        ("memory", "1.5Gi", 3 * Gi // 2),
        ("memory", "1m", 1),
        ("nvidia.com/gpu", "2", 2),
        ("hugepages-2Mi", "4Mi", 4 * Mi),
        ("ephemeral-storage", "1e9", 10**9),
    ],
)
def test_base_units_round_up(resource: str, text: str, units: int) -> None:
    assert to_base_units(resource, parse_quantity(text, field="f")) == units


@pytest.mark.parametrize(
    ("resource", "units", "text"),
    [
        ("cpu", 1500, "1500m"),
        ("cpu", 2000, "2"),
        ("cpu", 0, "0"),
        ("memory", 512 * Mi, "512Mi"),
        ("memory", 3 * Gi, "3Gi"),
        ("memory", 1000, "1000"),
        ("memory", 0, "0"),
        ("hugepages-2Mi", 4 * Mi, "4Mi"),
        ("nvidia.com/gpu", 2048, "2048"),
        ("pods", 110, "110"),
    ],
)
def test_format_quantity_reads_like_kubernetes(resource: str, units: int, text: str) -> None:
    assert format_quantity(resource, units) == text


def test_vectors_add_and_subtract_per_resource() -> None:
    assert add({"cpu": 100, "memory": 5}, {"cpu": 50, "pods": 1}) == {"cpu": 150, "memory": 5, "pods": 1}
    assert subtract({"cpu": 100}, {"cpu": 150, "pods": 1}) == {"cpu": -50, "pods": -1}


@pytest.mark.parametrize(
    ("requested", "free", "misfit"),
    [
        ({"cpu": 500, "memory": 10}, {"cpu": 500, "memory": 10}, None),
        ({"cpu": 501, "memory": 10}, {"cpu": 500, "memory": 10}, "cpu"),
        ({"memory": 11, "cpu": 501}, {"cpu": 500, "memory": 10}, "memory"),
        ({"nvidia.com/gpu": 1}, {"cpu": 4000}, "nvidia.com/gpu"),
        ({"nvidia.com/gpu": 0, "cpu": 1}, {"cpu": 4000}, None),
        ({"cpu": 0}, {"cpu": -100}, None),
    ],
)
def test_fits_names_first_resource_without_room(
    requested: dict[str, int], free: dict[str, int], misfit: str | None
) -> None:
    assert fits(requested, free) == misfit


def _container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "image": "busybox", "resources": resources, **extra}


def _pod(containers: list[Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": containers, **spec}}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            _pod([_container({"cpu": "500m", "memory": "1Gi"})]),
            {"cpu": 500, "memory": Gi, "pods": 1},
            id="plain",
        ),
        pytest.param(
            _pod([_container({"cpu": "250m", "memory": "1Gi"}), _container({"cpu": "750m", "memory": "512Mi"})]),
            {"cpu": 1000, "memory": Gi + 512 * Mi, "pods": 1},
            id="multi-container",
        ),
        pytest.param(
            _pod([_container({"cpu": "0.0001"}), _container({"cpu": "0.0001"})]),
            {"cpu": 1, "pods": 1},
            id="rounds-the-sum-not-each-container",
        ),
        pytest.param(
            _pod(
                [_container({"cpu": "100m", "memory": "100Mi"})],
                initContainers=[_container({"cpu": "2", "memory": "50Mi"})],
            ),
            {"cpu": 2000, "memory": 100 * Mi, "pods": 1},
            id="init-bigger-than-app-per-resource",
        ),
        pytest.param(
            _pod(
                [_container({"cpu": "500m", "memory": "256Mi"})],
                initContainers=[
                    _container({"cpu": "100m", "memory": "64Mi"}, restartPolicy="Always"),
                    _container({"cpu": "1", "memory": "1Gi"}),
                    _container({"cpu": "200m", "memory": "32Mi"}, restartPolicy="Always"),
                ],
            ),
            # app + sidecars: 800m / 352Mi; the normal init step runs next to the first sidecar: 1100m / 1088Mi
            {"cpu": 1100, "memory": 1088 * Mi, "pods": 1},
            id="sidecar-before-normal-init",
        ),
        pytest.param(
            _pod(
                [_container({"cpu": "1", "memory": "1Gi"})],
                initContainers=[
                    _container({"cpu": "300m"}),
                    _container({"cpu": "500m", "memory": "2Gi"}, restartPolicy="Always"),
                ],
            ),
            # the sidecar runs for the pod's lifetime: 1500m and 3Gi with the app container
            {"cpu": 1500, "memory": 3 * Gi, "pods": 1},
            id="sidecar-adds-to-app",
        ),
        pytest.param(
            _pod([_container({"cpu": "1", "memory": "1Gi"})], overhead={"cpu": "250m", "memory": "120Mi"}),
            {"cpu": 1250, "memory": Gi + 120 * Mi, "pods": 1},
            id="overhead",
        ),
        pytest.param(
            _pod(
                [_container({"cpu": "1", "memory": "1Gi"})],
                resources={"requests": {"cpu": "2"}},
                overhead={"cpu": "100m"},
            ),
            {"cpu": 2100, "memory": Gi, "pods": 1},
            id="pod-level-resources-win-then-overhead",
        ),
        pytest.param(
            _pod(
                [
                    _container(
                        {"cpu": "1", "nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi"},
                        {"nvidia.com/gpu": "2", "hugepages-2Mi": "4Mi"},
                    )
                ]
            ),
            {"cpu": 1000, "nvidia.com/gpu": 2, "hugepages-2Mi": 4 * Mi, "pods": 1},
            id="gpu-and-hugepages",
        ),
        pytest.param(
            _pod([_container({"cpu": "1"}, {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"})]),
            {"cpu": 1000, "memory": Gi, "nvidia.com/gpu": 1, "pods": 1},
            id="limits-only-resources-are-requested-at-their-limit",
        ),
        pytest.param(
            _pod([_container({"ephemeral-storage": "10G", "cpu": "0"})]),
            {"ephemeral-storage": 10 * 10**9, "pods": 1},
            id="ephemeral-storage-and-zero-left-out",
        ),
        pytest.param(
            _pod([{"name": "c", "image": "busybox"}], initContainers=None),
            {"pods": 1},
            id="no-requests-at-all",
        ),
    ],
)
def test_pod_request_matches_kube_scheduler(pod: dict[str, Any], expected: dict[str, int]) -> None:
    assert pod_requests(pod) == expected


@pytest.mark.parametrize(
    ("pod", "error", "field"),
    [
        pytest.param({"metadata": {}}, PodSpecError, "spec", id="no-spec"),
        pytest.param({"spec": {"containers": {}}}, PodSpecError, "spec.containers", id="containers-not-a-list"),
        pytest.param({"spec": {"containers": []}}, PodSpecError, "spec.containers", id="no-containers"),
        pytest.param(
            _pod([_container({"cpu": "1"}), "c2"]), PodSpecError, "spec.containers[1]", id="container-not-an-object"
        ),
        pytest.param(
            _pod([{"name": "c", "resources": {"requests": ["cpu"]}}]),
            PodSpecError,
            "spec.containers[0].resources.requests",
            id="requests-not-an-object",
        ),
        pytest.param(
            _pod([_container({"cpu": "1"})], initContainers=[_container(), _container({"memory": "12x"})]),
            QuantityError,
            "spec.initContainers[1].resources.requests.memory",
            id="bad-init-quantity",
        ),
        pytest.param(
            _pod([_container(limits={"nvidia.com/gpu": "-1"})]),
            QuantityError,
            "spec.containers[0].resources.limits.nvidia.com/gpu",
            id="negative-limit",
        ),
        pytest.param(
            _pod([_container({"cpu": "1"})], overhead={"memory": "lots"}),
            QuantityError,
            "spec.overhead.memory",
            id="bad-overhead",
        ),
        pytest.param(
            _pod([_container({"cpu": "1"})], initContainers=[_container(restartPolicy=1)]),
            PodSpecError,
            "spec.initContainers[0].restartPolicy",
            id="restart-policy-not-a-string",
        ),
        pytest.param(
            _pod([_container({"memory": "9Ei"})]),
            QuantityError,
            "spec.containers[0].resources.requests.memory",
            id="beyond-what-the-ledger-counts-exactly",
        ),
    ],
)
def test_malformed_pod_is_rejected_naming_the_field(pod: dict[str, Any], error: type[Exception], field: str) -> None:
    with pytest.raises(error) as caught:
        pod_requests(pod)
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, ValueError)


def test_pod_total_beyond_exact_range_is_rejected() -> None:
    half = f"{MAX_UNITS // 2 + 1}"
    with pytest.raises(PodSpecError, match=r"^spec: the pod's memory request is more than"):
        pod_requests(_pod([_container({"memory": half}), _container({"memory": half})]))


def test_node_allocatable_is_read_from_status() -> None:
    node = {
        "status": {
            "allocatable": {"cpu": "3920m", "memory": "15Gi", "pods": "110", "nvidia.com/gpu": "4"},
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": "4"},
        }
    }
    assert node_allocatable(node) == {"cpu": 3920, "memory": 15 * Gi, "pods": 110, "nvidia.com/gpu": 4}


def test_node_allocatable_falls_back_to_capacity() -> None:
    assert node_allocatable({"status": {"capacity": {"cpu": "4", "pods": "110"}}}) == {"cpu": 4000, "pods": 110}


@pytest.mark.parametrize(
    ("node", "field"),
    [
        ({"metadata": {"name": "n"}}, "status"),
        ({"status": {}}, "status.allocatable"),
        ({"status": {"allocatable": {"cpu": "four"}}}, "status.allocatable.cpu"),
        ({"status": {"allocatable": "4"}}, "status.allocatable"),
    ],
)
def test_malformed_node_is_rejected_naming_the_field(node: dict[str, Any], field: str) -> None:
    with pytest.raises((NodeSpecError, QuantityError)) as caught:
        node_allocatable(node)
    assert str(caught.value).startswith(f"{field}: ")


def _fresh(pod: dict[str, Any]) -> dict[str, int]:
    resources._COMPUTED.clear()
    return pod_requests(pod)


def test_pods_of_one_template_share_a_computed_request_without_sharing_the_dict() -> None:
    template = _pod([_container({"cpu": "250m", "memory": "1Gi"})], overhead={"cpu": "10m"})
    first = _fresh(template)
    assert len(resources._COMPUTED) == 1
    first["cpu"] = 1  # a caller changing its vector changes no one else's
    again = pod_requests({**template, "metadata": {"name": "p2", "namespace": "ns"}})
    assert again == {"cpu": 260, "memory": Gi, "pods": 1}
    assert len(resources._COMPUTED) == 1


@pytest.mark.parametrize(
    ("one", "other"),
    [
        pytest.param(_container({"cpu": "1"}), _container({"cpu": 1.5}), id="string-and-number"),
        pytest.param(_container({"cpu": 1}), _container({"cpu": 1.5}), id="int-and-float"),
        pytest.param(_container({"cpu": "1"}), _container(limits={"cpu": "2"}), id="request-and-limit"),
        pytest.param(_container({"cpu": "1"}), _container({"cpu": "1", "memory": "1"}), id="another-resource"),
    ],
)
def test_specs_that_differ_in_any_field_the_request_reads_are_computed_apart(one: Any, other: Any) -> None:
    resources._COMPUTED.clear()
    assert pod_requests(_pod([one])) != pod_requests(_pod([other]))
    assert pod_requests(_pod([other])) == _fresh(_pod([other]))
    for spec in ({"initContainers": [_container({"cpu": "3"})]}, {"overhead": {"cpu": "1"}},
                 {"resources": {"requests": {"cpu": "5"}}}):
        resources._COMPUTED.clear()
        plain, with_field = pod_requests(_pod([one])), pod_requests(_pod([one], **spec))
        assert plain != with_field
        assert with_field == _fresh(_pod([one], **spec))


def test_a_pod_whose_status_reports_resources_is_computed_from_its_status_every_time() -> None:
    spec = _pod([{**_container({"cpu": "1"}), "name": "main"}])
    assert _fresh(spec)["cpu"] == 1000
    grown = {**spec, "status": {"containerStatuses": [
        {"name": "main", "resources": {"requests": {"cpu": "2"}}, "allocatedResources": {"cpu": "2"}}]}}
    assert pod_requests(grown)["cpu"] == 2000
    assert pod_requests(spec)["cpu"] == 1000


def test_a_malformed_spec_raises_every_time_and_is_not_remembered() -> None:
    bad = _pod([_container({"memory": "12x"})])
    resources._COMPUTED.clear()
    for _ in range(2):
        with pytest.raises(QuantityError, match=r"^spec.containers\[0\].resources.requests.memory: "):
            pod_requests(bad)
    assert not resources._COMPUTED
