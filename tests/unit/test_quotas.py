"""ElasticQuota objects as the resolver reads them (quantities to the ledger's base units, bad fields named) and
status.used as it writes it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hoss.ledger.arguments import ElasticQuota
from hoss.ledger.replies import decode_batch_result
from hoss.ledger.results import QuotaExceeded, QuotaReport, QuotaUse
from resolver.metrics import QuotaCollector
from resolver.quotas import QuotaMirror, QuotaSpecError, parse_elastic_quota, used_status, write_used


def _eq(namespace: str, name: str, spec: object) -> dict[str, object]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec}


def test_quantities_become_base_units() -> None:
    name, quota = parse_elastic_quota(_eq("team-a", "q", {"min": {"nvidia.com/gpu": 4, "cpu": "1500m"},
                                                          "max": {"nvidia.com/gpu": "6", "memory": "2Gi"}}))
    assert name == "q"
    assert quota == ElasticQuota("team-a", {"nvidia.com/gpu": 4, "cpu": 1500}, {"nvidia.com/gpu": 6,
                                                                              "memory": 2 * 2**30})


@pytest.mark.parametrize(("spec", "named"), [
    ({"max": {"cpu": "lots"}}, "ElasticQuota t/q spec.max[cpu]"),
    ({"min": {"memory": "-1Gi"}}, "ElasticQuota t/q spec.min[memory]"),
    ({"min": ["cpu"]}, "ElasticQuota t/q: spec.min must be an object"),
])
def test_a_bad_quantity_names_the_object_and_field(spec: object, named: str) -> None:
    with pytest.raises(QuotaSpecError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_elastic_quota(_eq("t", "q", spec))


def test_used_status_lists_every_named_resource() -> None:
    quota = ElasticQuota("t", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 6, "memory": 2**30})
    assert used_status({"nvidia.com/gpu": 5, "cpu": 1500}, quota) == {
        "cpu": "1500m", "memory": "0", "nvidia.com/gpu": "5"}


def test_a_quota_refusal_decodes_as_its_own_kind() -> None:
    result = decode_batch_result([b"conflict", b"", b"quota t: nvidia.com/gpu 6 used + 2 requested > max 6", 2, 0])
    assert isinstance(result, QuotaExceeded)
    assert result.namespace == "t" and str(result) == "quota t: nvidia.com/gpu 6 used + 2 requested > max 6"
    assert not isinstance(decode_batch_result([b"conflict", b"n1", b"cpu", 2, 0]), QuotaExceeded)


async def test_status_is_written_only_when_use_changes() -> None:
    mirror = QuotaMirror(ledger=None)  # type: ignore[arg-type]  # only its mirror is read here
    quota = ElasticQuota("t", {"cpu": 1000}, {"cpu": 2000})
    mirror.by_namespace["t"] = ("q", quota)
    writes: list[tuple[str, str, dict[str, str]]] = []

    async def write(namespace: str, name: str, used: dict[str, str]) -> None:
        writes.append((namespace, name, used))

    written: dict[str, dict[str, str]] = {}
    report = QuotaReport([QuotaUse(quota, {"cpu": 500})], {"cpu": 1000}, {"cpu": 500})
    assert await write_used(report, mirror, written, write) == 1
    assert await write_used(report, mirror, written, write) == 0
    assert writes == [("t", "q", {"cpu": "500m"})]


def test_metrics_show_use_and_borrowing_per_tenant() -> None:
    class State:
        quota_report = QuotaReport([QuotaUse(ElasticQuota("a", {"nvidia.com/gpu": 4}, {"nvidia.com/gpu": 6}),
                                             {"nvidia.com/gpu": 6})], {"nvidia.com/gpu": 10}, {"nvidia.com/gpu": 6})

    registry = CollectorRegistry()
    registry.register(QuotaCollector(State()))  # type: ignore[arg-type]  # only quota_report is read
    text = generate_latest(registry).decode()
    assert 'hoss_quota_used{namespace="a",resource="nvidia.com/gpu"} 6.0' in text
    assert 'hoss_quota_borrowed{namespace="a",resource="nvidia.com/gpu"} 2.0' in text
    assert 'hoss_quota_max{namespace="a",resource="nvidia.com/gpu"} 6.0' in text
