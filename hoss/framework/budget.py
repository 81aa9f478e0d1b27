"""PodDisruptionBudgets as preemption and the rescheduler read them: what a budget protects and how many
disruptions it allows now. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hoss.errors import PodSpecError
from hoss.framework.podindex import PlacedPod
from hoss.framework.podterms import LabelSelector, label_selector
from hoss.model.objects import section


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption reads it."""

    namespace: str
    name: str
    selector: LabelSelector | None
    """None: the budget matches no pod (an empty or missing selector, as kube-scheduler's preemption reads it)."""
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()
    """status.disruptedPods: pods whose eviction the apiserver already counted."""

    def matches(self, pod: PlacedPod) -> bool:
        return (self.selector is not None and bool(pod.labels) and pod.namespace == self.namespace
                and self.selector.matches(pod.labels))


def parse_budget(raw: Mapping[str, object]) -> Budget:
    """A PodDisruptionBudget (policy/v1 JSON); raises `PodSpecError` naming a bad field."""
    metadata = section(raw, "metadata")
    spec = section(raw, "spec")
    status = section(raw, "status")
    namespace, name = str(metadata.get("namespace") or "default"), str(metadata.get("name") or "")
    selector_raw = spec.get("selector")
    selector = None
    if isinstance(selector_raw, dict) and (selector_raw.get("matchLabels") or selector_raw.get("matchExpressions")):
        selector = label_selector(selector_raw, field=f"poddisruptionbudget {namespace}/{name} spec.selector")
    allowed = status.get("disruptionsAllowed", 0)
    if isinstance(allowed, bool) or not isinstance(allowed, int):
        raise PodSpecError(field=f"poddisruptionbudget {namespace}/{name} status.disruptionsAllowed",
                           reason=f"expected an integer, got {allowed!r}")
    disrupted = status.get("disruptedPods")
    return Budget(namespace=namespace, name=name, selector=selector, disruptions_allowed=allowed,
                  disrupted=frozenset(disrupted) if isinstance(disrupted, dict) else frozenset())
