"""The selector of kube-scheduler's cluster-default topology spread constraints, per pod. Pure, no I/O.

kube-scheduler's PodTopologySpread gives a pod without constraints of its own the profile's default constraints
(System defaulting: ScheduleAnyway on ``kubernetes.io/hostname`` with maxSkew 3 and on
``topology.kubernetes.io/zone`` with maxSkew 5), with the selector ``helper.DefaultSelector`` builds: the
selectors of the Services in the pod's namespace that select it (merged), plus the selector of its controller
when that is a ReplicationController, ReplicaSet or StatefulSet. Workers read neither Services nor controllers,
so the dispatcher keeps their selectors (`SelectorSources`, fed by its watches) and puts the pod's default
selector into its compact form (`hoss.model.compact.DEFAULT_SPREAD`); the worker's PodTopologySpread applies its
profile's defaults with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hoss.model.objects import Json, section

KINDS = {("v1", "ReplicationController"): "rc", ("apps/v1", "ReplicaSet"): "rs", ("apps/v1", "StatefulSet"): "ss"}
"""The controllers whose selector joins the default one (apiVersion, kind of the pod's controller reference)."""


def _string_map(value: object) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    return None


@dataclass
class SelectorSources:
    """Services' selectors by namespace and name, controllers' selectors by (kind, namespace, name)."""

    services: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    controllers: dict[tuple[str, str, str], Json] = field(default_factory=dict)
    """(``rc``/``rs``/``ss``, namespace, name) -> a metav1.LabelSelector (an RC's map becomes matchLabels)."""

    def apply(self, kind: str, event: str, raw: Json) -> None:
        """One watch event (``ADDED``/``MODIFIED``/``DELETED``) of a Service (kind ``service``) or controller."""
        metadata = section(raw, "metadata")
        namespace, name = metadata.get("namespace"), metadata.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        spec = section(raw, "spec")
        assert isinstance(spec, dict)
        if kind == "service":
            selector = _string_map(spec.get("selector"))
            if event == "DELETED" or not selector:
                self.services.get(namespace, {}).pop(name, None)
            else:
                self.services.setdefault(namespace, {})[name] = selector
            return
        key = (kind, namespace, name)
        raw_selector = spec.get("selector")
        if kind == "rc":
            labels = _string_map(raw_selector)
            raw_selector = {"matchLabels": labels} if labels else None
        if event == "DELETED" or not isinstance(raw_selector, dict):
            self.controllers.pop(key, None)
        else:
            self.controllers[key] = raw_selector

    def replace(self, kind: str, items: list[Json]) -> None:
        """A fresh list of every object of `kind`."""
        if kind == "service":
            self.services.clear()
        else:
            for key in [key for key in self.controllers if key[0] == kind]:
                del self.controllers[key]
        for raw in items:
            self.apply(kind, "ADDED", raw)

    def default_selector(self, pod: Mapping[str, Any]) -> Json | None:
        """kube-scheduler's ``DefaultSelector`` for `pod` as a metav1.LabelSelector; None when it is empty."""
        metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
        assert isinstance(metadata, Mapping)
        namespace = str(metadata.get("namespace") or "default")
        labels = _string_map(metadata.get("labels")) or {}
        merged: dict[str, str] = {}
        for wanted in self.services.get(namespace, {}).values():
            if all(labels.get(key) == value for key, value in wanted.items()):
                merged.update(wanted)
        expressions: list[Json] = []
        owner = controller_of(metadata)
        controller = None if owner is None else self.controllers.get((owner[0], namespace, owner[1]))
        if controller is not None:
            pairs = _string_map(controller.get("matchLabels")) or {}
            if owner is not None and owner[0] == "rc":
                merged.update(pairs)
            else:
                expressions.extend({"key": k, "operator": "In", "values": [v]} for k, v in sorted(pairs.items()))
                listed = controller.get("matchExpressions")
                expressions.extend(item for item in (listed if isinstance(listed, list) else [])
                                   if isinstance(item, dict))
        if not merged and not expressions:
            return None
        result: Json = {}
        if merged:
            result["matchLabels"] = merged
        if expressions:
            result["matchExpressions"] = expressions
        return result


def controller_of(metadata: Mapping[str, Any]) -> tuple[str, str] | None:
    """The (kind key, name) of the pod's controller when it is an RC, ReplicaSet or StatefulSet."""
    references = metadata.get("ownerReferences")
    for reference in references if isinstance(references, list) else []:
        if isinstance(reference, dict) and reference.get("controller") is True:
            kind = KINDS.get((str(reference.get("apiVersion")), str(reference.get("kind"))))
            name = reference.get("name")
            return (kind, name) if kind is not None and isinstance(name, str) else None
    return None
