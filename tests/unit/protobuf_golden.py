"""The golden protobuf bodies of tests/golden/protobuf: for each case, a core/v1 Binding or Event as JSON and the
bytes Kubernetes' own protobuf serializer (k8s.io/apimachinery, as client-go sends a body) writes for it, made by
the Go program beside them. Tests hold hoss.kube.protobuf's bytes to these."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from hoss.model.objects import Json

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden" / "protobuf"
GOLDEN_FILE = GOLDEN_DIR / "golden.json"
CASES_FILE = GOLDEN_DIR / "cases.json"
REGENERATE = "cd tests/golden/protobuf && go run . < cases.json > golden.json"


@dataclass(frozen=True)
class GoldenCase:
    name: str
    object: Json
    protobuf: bytes


@functools.cache
def golden_cases() -> tuple[GoldenCase, ...]:
    return tuple(GoldenCase(name=case["name"], object=case["object"], protobuf=bytes.fromhex(case["protobuf"]))
                 for case in json.loads(GOLDEN_FILE.read_text()))


def golden(name: str) -> GoldenCase:
    """The case named ``name``."""
    for case in golden_cases():
        if case.name == name:
            return case
    raise KeyError(f"no golden protobuf case named {name!r} in {GOLDEN_FILE}")
