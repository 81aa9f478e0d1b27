"""hoss.model.devices against Kubernetes' own DRA allocator: for every case of tests/golden/dra (ResourceSlices,
DeviceClasses, a pod's ResourceClaims, a node, the devices allocated elsewhere), hoss allocates the same devices
and writes the same ``status.allocation`` as k8s.io/dynamic-resource-allocation/structured v0.36.3 with kube-scheduler
v1.36's default features, or fails as it does (no allocation, the node's reason, or the error that aborts the
attempt); and the golden file is what the Go program beside the cases writes today."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hoss.model.devices import (
    CANNOT_ALLOCATE,
    AllocationError,
    ClaimError,
    Inventory,
    allocate,
    allocation_status,
    claim_needs,
    node_failure_reason,
)
from hoss.model.objects import Json

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "dra"
CASES_FILE = GOLDEN_DIR / "cases.json"
GOLDEN_FILE = GOLDEN_DIR / "golden.json"
REGENERATE = "cd tests/golden/dra && go run . < cases.json > golden.json"

CASES: list[Json] = json.loads(CASES_FILE.read_text())
GOLDEN: dict[str, Json] = {outcome["name"]: outcome for outcome in json.loads(GOLDEN_FILE.read_text())}


def hoss_outcome(case: Json) -> Json:
    """What hoss decides for the case, in the Go program's shape: the allocation (one status.allocation per claim),
    or none with the node's reason when it is not kube-scheduler's plain "cannot allocate all claims", or the error
    that aborts the attempt."""
    classes = {item["metadata"]["name"]: item for item in case["classes"]}
    inventory = Inventory.from_slices(case["slices"])
    node, labels = case["node"]["name"], case["node"]["labels"]
    outcome: Json = {"name": case["name"], "allocation": None}
    try:
        needs = [claim_needs(claim, classes) for claim in case["claims"]]
        allocation = allocate(needs, node=node, node_labels=labels, inventory=inventory,
                              allocated={(d[0], d[1], d[2]) for d in case["allocated"]})
    except (AllocationError, ClaimError) as error:
        return {**outcome, "error": error.message}
    if allocation is None:
        reason = node_failure_reason(needs, node=node, node_labels=labels, inventory=inventory)
        return outcome if reason == CANNOT_ALLOCATE else {**outcome, "error": reason, "failedOnNode": True}
    return {**outcome, "allocation": [allocation_status(allocation, i) for i in range(len(needs))]}


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_hoss_allocates_what_kubernetes_allocator_allocates(case: Json) -> None:
    assert case["name"] in GOLDEN, f"no golden outcome for this case: {REGENERATE}"
    assert hoss_outcome(case) == GOLDEN[case["name"]]


def _devices(case: Json) -> list[Json]:
    return [device for item in case["slices"] for device in item["spec"].get("devices", [])]


def _requests(case: Json) -> list[Json]:
    requests = [request for claim in case["claims"] for request in claim["spec"]["devices"]["requests"]]
    return [request.get("exactly") or {} for request in requests] + [
        sub for request in requests for sub in request.get("firstAvailable", [])]


def _selectors(case: Json) -> str:
    return " ".join(json.dumps(part) for part in (case["classes"], _requests(case)))


COVERAGE: dict[str, Any] = {
    "one device": lambda c: [r.get("count") for r in _requests(c)] == [1],
    "a count of several": lambda c: any(r.get("count", 1) > 1 for r in _requests(c)),
    "CEL on a string attribute": lambda c: ".model ==" in _selectors(c),
    "CEL on an int attribute": lambda c: ".index >=" in _selectors(c),
    "CEL on a version attribute": lambda c: "semver(" in _selectors(c),
    "CEL on a capacity": lambda c: "quantity(" in _selectors(c),
    "matchAttribute across two requests": lambda c: any(len(k.get("requests", [])) == 2 and "matchAttribute" in k
                                                        for cl in c["claims"]
                                                        for k in cl["spec"]["devices"].get("constraints", [])),
    "firstAvailable": lambda c: any("firstAvailable" in r for cl in c["claims"]
                                    for r in cl["spec"]["devices"]["requests"]),
    "All mode": lambda c: any(r.get("allocationMode") == "All" for r in _requests(c)),
    "admin access": lambda c: any(r.get("adminAccess") for r in _requests(c)),
    "shared counters": lambda c: any("sharedCounters" in s["spec"] for s in c["slices"]),
    "a network-attached slice": lambda c: any("nodeSelector" in s["spec"] for s in c["slices"]),
    "devices allocated elsewhere": lambda c: bool(c["allocated"]),
    "taints": lambda c: any("taints" in d for d in _devices(c)),
    "tolerations": lambda c: any("tolerations" in r for r in _requests(c)),
}


@pytest.mark.parametrize("topic", list(COVERAGE))
def test_the_golden_cases_cover_the_allocators_features(topic: str) -> None:
    assert any(COVERAGE[topic](case) for case in CASES), f"add a case with {topic} to {CASES_FILE.name}"


def test_the_golden_cases_include_failures_of_each_kind() -> None:
    outcomes = list(GOLDEN.values())
    assert sum(o["allocation"] is None and "error" not in o for o in outcomes) >= 5, "cannot allocate all claims"
    assert any(o.get("failedOnNode") for o in outcomes), "the node's own reason (an invalid pool)"
    assert any("CEL runtime error" in o.get("error", "") for o in outcomes), "an aborting CEL error"
    assert len(CASES) >= 30


def test_the_golden_file_is_what_kubernetes_allocator_writes_today(tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        if os.environ.get("HOSS_NO_GO") == "1":
            pytest.skip("HOSS_NO_GO=1: the golden DRA outcomes are not rebuilt with Go")
        pytest.fail("go is not on PATH: the golden DRA outcomes cannot be rebuilt to check them against Kubernetes' "
                    "allocator; install the Go toolchain, or set HOSS_NO_GO=1 to leave this check out")
    nice = shutil.which("nice")
    command = [nice, "-n", "10", go, "run", "."] if nice else [go, "run", "."]
    # The program's own go.mod and go.sum, read-only; a go.work above the checkout must not take over.
    environment = {**os.environ, "GOWORK": "off", "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -mod=readonly"}
    rebuilt = tmp_path / "golden.json"
    with CASES_FILE.open("rb") as cases, rebuilt.open("wb") as out:
        done = subprocess.run(command, cwd=GOLDEN_DIR, stdin=cases, stdout=out, stderr=subprocess.PIPE,
                              env=environment, timeout=540, check=False)
    assert done.returncode == 0, f"go run failed in {GOLDEN_DIR}:\n{done.stderr.decode(errors='replace')}"
    assert rebuilt.read_text() == GOLDEN_FILE.read_text(), f"the golden file is out of date: {REGENERATE}"
