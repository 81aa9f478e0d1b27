"""`python -m dev demo` tells each of its stories on a plane of its own, and each story's figure says what the story
claims: gangs start all or nothing, GPU packing leaves whole nodes where spreading strands GPUs, a tenant's pods stay
in their pool, a racing kube-scheduler has bindings denied and oversells nothing, and pods with ResourceClaims get
the fake DRA driver's GPUs as their claims ask, no device in two claims. The report's figures are checked against
what the apiserver and the resolver saw, read after the demo from the plane it leaves running: the denials it reports
are the apiserver's and the resolver's, its example is one the resolver recorded, and a worker that placed few pods
is told why."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from dev.local.plane import LocalPlane

pytestmark = pytest.mark.e2e

THROUGHPUT_FIELDS = {"pods_total", "pods_bound", "pods_pending", "seconds", "pods_per_second", "ledger_conflicts",
                     "webhook_denials", "oversold_nodes", "per_worker", "nodes", "workers", "status_url",
                     "pending_reasons", "per_worker_why", "pods_by_policy"}
RACE_NAMESPACE = "hoss-demo-race"
RESOLVER_RECORDS = 50
"""How many denials the resolver remembers."""
REJECTIONS = re.compile(r'^apiserver_admission_webhook_rejection_count\{(?P<labels>[^}]*)\} (?P<value>\S+)$', re.M)


def _dev(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dev", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def _seen(plane: LocalPlane) -> dict[str, Any]:
    """What the apiserver and the resolver saw, read from them directly."""
    metrics = plane.kubectl("get", "--raw", "/metrics")
    rejected = sum(float(m["value"]) for m in REJECTIONS.finditer(metrics)
                   if 'type="validating"' in m["labels"] and 'error_type="no_error"' in m["labels"])
    resolver = plane.state().process("hoss-resolver")
    assert resolver is not None
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{resolver.port}/status", timeout=10, context=context) as answer:
        status = json.loads(answer.read())
    return {"apiserver_denials": int(rejected), "resolver_denials": list(status.get("recent_denials") or [])}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    """The demo's JSON report, and what the apiserver and the resolver saw, from a fresh plane: the apiserver's
    counters cover the demo and nothing else."""
    directory = tmp_path_factory.mktemp("demo-plane")
    try:
        result = _dev("demo", "--dir", str(directory), "--nodes", "10", "--pods", "60", "--workers", "3", "--json",
                      timeout=840)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1]), _seen(LocalPlane(directory))
    finally:
        _dev("local", "down", "--dir", str(directory), timeout=120)


@pytest.fixture(scope="module")
def report(demo: tuple[Any, dict[str, Any]]) -> Any:
    return demo[0]


@pytest.mark.timeout(900)
def test_throughput_fields_are_all_there_and_nothing_is_oversold(report: Any) -> None:
    assert report.keys() >= THROUGHPUT_FIELDS
    assert report["pods_total"] == 60 and report["nodes"] == 10 and report["workers"] == 3
    assert 0 < report["pods_bound"] <= 60 and report["pods_bound"] + report["pods_pending"] == 60
    assert report["pods_per_second"] > 0 and report["seconds"] > 0
    assert report["oversold_nodes"] == 0
    assert report["dashboard_url"] + "status" == report["status_url"]
    assert sum(report["pods_by_policy"].values()) == 60


@pytest.mark.timeout(900)
def test_pods_per_worker_add_up_and_a_worker_that_placed_few_is_told_why(report: Any) -> None:
    per_worker, why = report["per_worker"], report["per_worker_why"]
    assert set(per_worker) == {"w1", "w2", "w3"}
    assert sum(per_worker.values()) == report["pods_bound"], report
    fair = report["pods_bound"] / len(per_worker)
    few = {worker for worker, placed in per_worker.items() if placed < fair / 2}
    assert set(why) == few, report
    # The demo's workers run and are routed, and each serves a policy the pods ask for: a worker placed few because
    # the dispatcher kept the load on another worker serving the same policies.
    for worker in few:
        assert "keeps a load that one worker keeps up with on that worker" in why[worker], why
        assert "--pack-depth" in why[worker], why


@pytest.mark.timeout(900)
def test_gangs_start_all_or_nothing(report: Any) -> None:
    gangs = report["gangs"]
    assert gangs["held_reason"] == "GangIncomplete", gangs
    assert gangs["held_with"] < gangs["first_min_available"]
    assert f"{gangs['held_with']} of {gangs['first_min_available']} required members" in gangs["held_message"]
    assert gangs["first_bound_when_complete"] == gangs["first_min_available"]
    # The second gang: one member would fit on its own, yet none is bound until the whole gang fits.
    assert gangs["second_fit_alone"] == 1 and gangs["second_bound_while_blocked"] == 0, gangs
    assert f"only 1 of {gangs['second_members']} members fit" in gangs["second_message"], gangs
    assert gangs["second_bound_after_room"] == gangs["second_members"]


@pytest.mark.timeout(900)
def test_gpu_packing_leaves_whole_nodes_where_spreading_strands_gpus(report: Any) -> None:
    gpu = report["gpu"]
    packed, spread = gpu["packed"], gpu["spread"]
    assert packed["policy"] == "gpu" and spread["policy"] == "default"
    assert packed["placed"] == packed["pods"] and spread["placed"] == spread["pods"]
    # Half the GPUs are asked for: packing fills about half the nodes and leaves the rest whole. Several workers
    # serve the gpu policy and decide at the same instant, so on a loaded machine a pod or two can land beside
    # another worker's choice (seen once in a full run: 2 of 8 whole instead of 3 or 4); spreading leaves fewer.
    assert packed["fully_free_nodes"] >= gpu["gpu_nodes"] // 2 - 2, packed
    assert packed["fully_free_nodes"] > spread["fully_free_nodes"], gpu
    assert packed["stranded_gpus"] < spread["stranded_gpus"], gpu
    assert packed["whole_node_job_bound"] is True
    assert spread["whole_node_job_bound"] is (spread["fully_free_nodes"] > 0)


@pytest.mark.timeout(900)
def test_tenant_pods_stay_in_their_pool(report: Any) -> None:
    pools = report["pools"]
    assert pools["pods"] > 0 and pools["pool_nodes"] > 0
    assert pools["in_pool"] == pools["pods"] and pools["elsewhere"] == 0, pools


@pytest.mark.timeout(900)
def test_a_racing_kube_scheduler_has_bindings_denied_and_oversells_nothing(report: Any) -> None:
    race = report["race"]
    assert race["kube_pods"] + race["hoss_pods"] > race["cpu_capacity"], "demand must exceed the room"
    assert race["oversold_nodes"] == 0
    # Every core was taken by one scheduler or the other, and no more.
    assert race["kube_bound"] + race["hoss_bound"] == race["cpu_capacity"], race
    assert race["denials"] > 0, race


@pytest.mark.timeout(900)
def test_the_denials_reported_are_those_the_apiserver_and_the_resolver_saw(demo: tuple[Any, dict[str, Any]]) -> None:
    report, seen = demo
    race = report["race"]
    assert report["webhook_denials"] == seen["apiserver_denials"], (report["webhook_denials"], seen)
    assert race["denials"] <= report["webhook_denials"]
    records = seen["resolver_denials"]
    mine = [r for r in records if r["pod"].startswith(f"{RACE_NAMESPACE}/")]
    if len(records) < RESOLVER_RECORDS:  # the resolver still remembers every denial of the demo
        assert race["denials"] == len(mine), (race, mine)
        assert report["webhook_denials"] == len(records), (report["webhook_denials"], records)
    # The example is one the resolver recorded for a pod of the story, and there is one exactly when there were
    # denials.
    assert bool(race["denial_example"]) is (race["denials"] > 0), race
    if race["denials"]:
        assert any(f"binding of {r['pod']} to {r['node']} was denied: {r['message']}" in race["denial_example"]
                   for r in mine), (race["denial_example"], mine)


@pytest.mark.timeout(900)
def test_pods_with_resource_claims_get_the_fake_drivers_gpus_as_asked_and_no_device_twice(report: Any) -> None:
    devices = report["devices"]
    assert devices["bound"] == devices["pods"] == len(devices["placements"]) == 5, devices
    assert devices["devices_in_two_claims"] == 0, devices
    placed = devices["placements"]
    for pod, gpus in {"dra-pair": 2, "dra-single": 1, "dra-nvlink": 2, "dra-a100": 1, "dra-extended": 2}.items():
        assert len(placed[pod]["devices"]) == gpus, placed
    # Each pod's devices are its own (pool: the node, as the fake driver publishes it).
    held = [(p["node"], device) for p in placed.values() for device in p["devices"]]
    assert len(held) == len(set(held)), placed
    # The pinned pods took three GPUs of the h100 node's first NVLink domain: the constraint keeps dra-nvlink's two
    # in the second, where an allocation without it would span both.
    h100 = placed["dra-pair"]["node"]
    for pod in ("dra-pair", "dra-single", "dra-nvlink"):
        assert placed[pod]["node"] == h100 and set(placed[pod]["models"]) == {"h100"}, placed
    first = [domain for pod in ("dra-pair", "dra-single") for domain in placed[pod]["nvlink_domains"]]
    assert first == [0, 0, 0], placed
    assert placed["dra-nvlink"]["nvlink_domains"] == [1, 1], placed
    # The CEL selector's model, on the one node that has it.
    assert placed["dra-a100"]["models"] == ["a100"] and placed["dra-a100"]["node"] != h100, placed
    # The extended resource the class serves: its claim made by hoss, packed onto the fuller node (GpuPacking over
    # devices), both GPUs in one NVLink domain (the gpu policy's alignBy; first fit would take gpu-3 and gpu-6).
    assert placed["dra-extended"]["node"] == h100 and placed["dra-extended"]["nvlink_domains"] == [1, 1], placed
