"""hoss.kube.protobuf against Kubernetes' own protobuf serializer: for every case of tests/golden/protobuf, hoss
writes byte for byte what k8s.io/apimachinery writes (what client-go sends and the apiserver decodes); every event
shape hoss.kube.events builds has a case; and the golden file is what the Go program beside it writes today."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hoss.kube import protobuf
from hoss.kube.events import node_event, pod_event, reservation_event, scheduled_event
from hoss.model.admission import LANE_LABEL
from hoss.model.objects import Json
from tests.unit.protobuf_golden import CASES_FILE, GOLDEN_DIR, GOLDEN_FILE, REGENERATE, GoldenCase, golden_cases

CASES = golden_cases()


def hoss_bytes(object_: Json) -> bytes:
    """What hoss.kube.protobuf writes for the case's object: an Event as it is, a Binding from the arguments
    hoss.kube.rest's create_binding passes (the case must be a Binding it can write: its target a node)."""
    if object_["kind"] == "Event":
        return protobuf.event(object_)
    metadata, target = object_["metadata"], object_["target"]
    labels, version = metadata.get("labels"), metadata.get("resourceVersion", "")
    written: Json = {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"], "uid": metadata["uid"],
                     **({"resourceVersion": version} if version else {}),
                     **({} if labels is None else {"labels": labels})},
        "target": {"apiVersion": "v1", "kind": "Node", "name": target["name"]},
    }
    assert object_ == written, "a golden Binding is one hoss.kube.protobuf.binding writes"
    return protobuf.binding(metadata["namespace"], metadata["name"], metadata["uid"], target["name"], labels,
                            resource_version=version)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hoss_writes_the_bytes_kubernetes_serializer_writes(case: GoldenCase) -> None:
    # hex, so that a difference shows where it starts
    assert hoss_bytes(case.object).hex() == case.protobuf.hex()


def test_the_golden_cases_cover_both_binding_shapes_and_the_trouble_spots() -> None:
    bindings = [case.object for case in CASES if case.object["kind"] == "Binding"]
    assert any("labels" not in binding["metadata"] for binding in bindings)
    assert any(LANE_LABEL in binding["metadata"].get("labels", {}) for binding in bindings), \
        "a binding on a webhook lane, as create_binding writes it"
    assert any(binding["metadata"].get("resourceVersion") for binding in bindings), \
        "a binding pinned to the pod's version, as a worker posts it"
    assert any(len(case.protobuf) > 300 for case in CASES), "lengths of two-byte varints"
    assert any(case.object.get("firstTimestamp") == "1970-01-01T00:00:00Z" for case in CASES), \
        "the epoch, which is not the zero Time"


def shape(value: Any) -> Any:
    """The keys of a JSON object, nested: two events of one shape differ only in their values."""
    if isinstance(value, dict):
        return frozenset((key, shape(item)) for key, item in value.items())
    return type(value).__name__


def test_every_event_shape_hoss_writes_has_a_golden_case() -> None:
    written = {
        "scheduled": scheduled_event(namespace="team", name="web-0", uid="u", node="n1", component="hoss-worker-0"),
        "pod": pod_event(namespace="team", name="web-0", uid="u", reason="FailedScheduling", message="m",
                         component="hoss-worker-0"),
        "node": node_event(name="n1", uid="n1", reason="Defragmenting", message="m", component="hoss-rescheduler"),
        "reservation": reservation_event("r", "u", reason="Scheduled", message="m", component="hoss-worker-0",
                                         warning=False),
    }
    golden_shapes = {shape(case.object) for case in CASES}
    missing = [what for what, event in written.items() if shape(event) not in golden_shapes]
    assert missing == [], f"add a case of each shape to {CASES_FILE.name}, then: {REGENERATE}"


def test_the_golden_file_is_what_kubernetes_serializer_writes_today(tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        if os.environ.get("HOSS_NO_GO") == "1":
            pytest.skip("HOSS_NO_GO=1: the golden protobuf file is not rebuilt with Go")
        pytest.fail("go is not on PATH: the golden protobuf file cannot be rebuilt to check it against Kubernetes' "
                    "serializer; install the Go toolchain, or set HOSS_NO_GO=1 to leave this check out")
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
