"""Inter-pod affinity terms and label selectors, parsed once. Pure, no I/O.

A term (``requiredDuringSchedulingIgnoredDuringExecution`` of podAffinity or podAntiAffinity) matches a pod when
the pod's namespace is in the term's namespaces and its labels satisfy the term's selector, as kube-scheduler's
``AffinityTerm.Matches`` decides. Namespaces resolve against the namespace of the pod that owns the term: an
empty ``namespaces`` list without a ``namespaceSelector`` means that namespace alone; an empty
``namespaceSelector`` (``{}``) means every namespace. A non-empty ``namespaceSelector`` needs namespace labels,
which workers do not have: `parse_terms` raises `UnsupportedPodField` for it on an incoming pod, and
``lenient`` (existing pods) reads it as every namespace, which can only refuse more nodes, never fewer.
``matchLabelKeys``/``mismatchLabelKeys`` need nothing here: the apiserver merges them into ``labelSelector``
when the pod is created. A missing ``labelSelector`` matches no pod; an empty one matches every pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from resolver.errors import PodSpecError
from workers import payload
from workers.errors import UnsupportedPodField

SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        return value is None


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector: every matchLabels pair and matchExpressions requirement must hold."""

    requirements: tuple[LabelRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)


@dataclass(frozen=True)
class PodAffinityTerm:
    """One required pod (anti-)affinity term with its namespaces resolved."""

    topology_key: str
    selector: LabelSelector | None
    """None: the term has no labelSelector and matches no pod."""
    namespaces: frozenset[str] | None
    """None: every namespace."""

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """kube-scheduler's ``AffinityTerm.Matches`` for a pod of `namespace` with `labels`."""
        if self.selector is None or (self.namespaces is not None and namespace not in self.namespaces):
            return False
        return self.selector.matches(labels)


def parse_terms(raw: object, *, field: str, owner_namespace: str, lenient: bool = False) -> tuple[PodAffinityTerm, ...]:
    """The required terms at `field` (a list); raises `PodSpecError` naming a bad field, `UnsupportedPodField` for
    a non-empty namespaceSelector unless `lenient`."""
    terms = []
    for position, item in enumerate(payload.items(raw, field=field, error=PodSpecError)):
        term_field = f"{field}[{position}]"
        term = payload.mapping(item, field=term_field, error=PodSpecError, required=True)
        key = payload.string(term.get("topologyKey"), field=f"{term_field}.topologyKey", error=PodSpecError,
                             required=True)
        selector = None
        if term.get("labelSelector") is not None:
            selector = _selector(term.get("labelSelector"), field=f"{term_field}.labelSelector")
        listed = payload.items(term.get("namespaces"), field=f"{term_field}.namespaces", error=PodSpecError)
        names = {payload.string(n, field=f"{term_field}.namespaces[{i}]", error=PodSpecError)
                 for i, n in enumerate(listed)}
        namespace_selector = term.get("namespaceSelector")
        namespaces: frozenset[str] | None
        if namespace_selector is None:
            namespaces = frozenset(names or {owner_namespace})
        elif isinstance(namespace_selector, Mapping) and not namespace_selector.get("matchLabels") \
                and not namespace_selector.get("matchExpressions"):
            namespaces = None  # {} selects every namespace
        elif lenient:
            namespaces = None
        else:
            raise UnsupportedPodField(f"{term_field}.namespaceSelector")
        terms.append(PodAffinityTerm(topology_key=key, selector=selector, namespaces=namespaces))
    return tuple(terms)


def label_selector(raw: object, *, field: str) -> LabelSelector:
    """A metav1.LabelSelector at `field` (e.g. a PodDisruptionBudget's); raises `PodSpecError` naming a bad field."""
    return _selector(raw, field=field)


def _selector(raw: object, *, field: str) -> LabelSelector:
    selector = payload.mapping(raw, field=field, error=PodSpecError, required=True)
    requirements = [
        LabelRequirement(key=key, operator="In", values=frozenset({value}))
        for key, value in payload.string_map(selector.get("matchLabels"), field=f"{field}.matchLabels",
                                             error=PodSpecError).items()
    ]
    expressions = payload.items(selector.get("matchExpressions"), field=f"{field}.matchExpressions",
                                error=PodSpecError)
    for position, item in enumerate(expressions):
        expression_field = f"{field}.matchExpressions[{position}]"
        expression = payload.mapping(item, field=expression_field, error=PodSpecError, required=True)
        key = payload.string(expression.get("key"), field=f"{expression_field}.key", error=PodSpecError,
                             required=True)
        operator = payload.string(expression.get("operator"), field=f"{expression_field}.operator",
                                  error=PodSpecError, required=True)
        if operator not in SELECTOR_OPERATORS:
            raise PodSpecError(field=f"{expression_field}.operator",
                               reason=f"unknown operator {operator!r}, expected one of {sorted(SELECTOR_OPERATORS)}")
        values = payload.items(expression.get("values"), field=f"{expression_field}.values", error=PodSpecError)
        texts = frozenset(payload.string(v, field=f"{expression_field}.values[{i}]", error=PodSpecError)
                          for i, v in enumerate(values))
        if operator in ("In", "NotIn") and not texts:
            raise PodSpecError(field=f"{expression_field}.values", reason=f"must be non-empty for operator {operator}")
        if operator in ("Exists", "DoesNotExist") and texts:
            raise PodSpecError(field=f"{expression_field}.values", reason=f"must be empty for operator {operator}")
        requirements.append(LabelRequirement(key=key, operator=operator, values=texts))
    return LabelSelector(tuple(requirements))
