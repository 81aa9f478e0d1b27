"""The sync's pod view: a status-only change reuses the computed request; a spec change recomputes it."""

from __future__ import annotations

from resolver.mirror import parse_pod
from tests.kube_objects import Json, raw_pod


def pod(cpu: str, *, generation: int, node: str | None = None) -> Json:
    """One pod, at ``generation`` of its spec."""
    return raw_pod("p", {"cpu": cpu}, uid="u1", namespace="ns", node=node, generation=generation)


def test_request_is_reused_while_the_generation_is_unchanged() -> None:
    first = parse_pod(pod("1", generation=1))
    # Same generation: the spec cannot have changed, so the earlier request stands (the cpu here is a marker).
    later = parse_pod(pod("7", generation=1, node="n1"), known=first)
    assert later.request["cpu"] == 1000
    assert later.node == "n1"


def test_request_is_recomputed_after_a_spec_change() -> None:
    first = parse_pod(pod("1", generation=1))
    resized = parse_pod(pod("2", generation=2), known=first)
    assert resized.request["cpu"] == 2000
