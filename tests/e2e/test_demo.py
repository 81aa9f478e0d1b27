"""`hoss demo` tells each of its stories on a plane of its own, and each story's figure says what the story claims:
gangs start all or nothing, GPU packing leaves whole nodes where spreading strands GPUs, a tenant's pods stay in
their pool, and a racing kube-scheduler oversells nothing. The report keeps every field it had before the stories."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

THROUGHPUT_FIELDS = {"pods_total", "pods_bound", "pods_pending", "seconds", "pods_per_second", "ledger_conflicts",
                     "webhook_denials", "oversold_nodes", "per_worker", "nodes", "workers", "status_url",
                     "pending_reasons"}


def _hoss(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dev", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("demo-plane")
    try:
        result = _hoss("demo", "--dir", str(directory), "--nodes", "10", "--pods", "60", "--workers", "2", "--json",
                       timeout=840)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])
    finally:
        _hoss("local", "down", "--dir", str(directory), timeout=120)


@pytest.mark.timeout(900)
def test_throughput_fields_are_all_there_and_nothing_is_oversold(report: Any) -> None:
    assert report.keys() >= THROUGHPUT_FIELDS
    assert report["pods_total"] == 60 and report["nodes"] == 10 and report["workers"] == 2
    assert 0 < report["pods_bound"] <= 60 and report["pods_bound"] + report["pods_pending"] == 60
    assert report["pods_per_second"] > 0 and report["seconds"] > 0
    assert report["oversold_nodes"] == 0
    assert report["dashboard_url"] + "status" == report["status_url"]


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
def test_a_racing_kube_scheduler_oversells_nothing(report: Any) -> None:
    race = report["race"]
    assert race["kube_pods"] + race["hoss_pods"] > race["cpu_capacity"], "demand must exceed the room"
    assert race["oversold_nodes"] == 0
    # Every core was taken by one scheduler or the other, and no more.
    assert race["kube_bound"] + race["hoss_bound"] == race["cpu_capacity"], race
    assert race["hoss_bound"] > 0
    if race["denials"]:
        assert "hoss:" in race["denial_message"] and "denied" in race["denial_message"], race
    assert report["webhook_denials"] >= race["denials"]
