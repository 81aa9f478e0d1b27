"""Inter-pod affinity terms, topology spread constraints and label selectors, parsed once. Pure, no I/O.

A term (``requiredDuringSchedulingIgnoredDuringExecution`` of podAffinity or podAntiAffinity) matches a pod when
the pod's namespace is in the term's namespaces and its labels satisfy the term's selector, as kube-scheduler's
``AffinityTerm.Matches`` decides. Namespaces resolve against the namespace of the pod that owns the term: an
empty ``namespaces`` list without a ``namespaceSelector`` means that namespace alone; an empty
``namespaceSelector`` (``{}``) means every namespace. A non-empty ``namespaceSelector`` adds the namespaces
whose labels it selects, as kube-scheduler merges them: for the incoming pod the dispatcher resolved it into a
namespace list carried in the compact pod (`hoss.model.compact.namespace_context`, passed here as ``resolve``;
`parse_terms` raises `UnsupportedPodField` when it was not resolved); a pod already placed (``lenient``) keeps
the selector, matched against the incoming pod's namespace labels (kube-scheduler's ``nsLabels``), read as
every namespace when those are unknown (which can only refuse more nodes).
``matchLabelKeys``/``mismatchLabelKeys`` need nothing here: the apiserver merges them into ``labelSelector``
when the pod is created. A missing ``labelSelector`` matches no pod; an empty one matches every pod.
Preferred terms (`WeightedPodTerm`) are the same terms with a weight 1..100.

A topology spread constraint (`SpreadConstraint`, ``spec.topologySpreadConstraints``) is read as kube-scheduler's
PodTopologySpread reads it: ``minDomains`` defaults to 1 (and is only allowed with DoNotSchedule),
``nodeAffinityPolicy`` to Honor and ``nodeTaintsPolicy`` to Ignore, and the pod's own values of the
``matchLabelKeys`` it carries are merged into the selector (kube-scheduler merges them itself; a selector the
apiserver already merged them into only gets the same requirement twice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hoss.errors import PodSpecError
from hoss.framework import payload
from hoss.framework.errors import UnsupportedPodField
from hoss.model.compact import requirement_holds

SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return requirement_holds(self.operator, self.values, labels.get(self.key))


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector: every matchLabels pair and matchExpressions requirement must hold."""

    requirements: tuple[LabelRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)


@dataclass(frozen=True)
class PodAffinityTerm:
    """One pod (anti-)affinity term with its namespaces resolved."""

    topology_key: str
    selector: LabelSelector | None
    """None: the term has no labelSelector and matches no pod."""
    namespaces: frozenset[str] | None
    """None: every namespace."""
    namespace_selector: LabelSelector | None = None
    """A placed pod's non-empty namespaceSelector: also the namespaces whose labels it selects."""

    def in_namespaces(self, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> bool:
        """Whether a pod of `namespace` (whose namespace has `namespace_labels`, None: unknown) is in the term's
        namespaces (for pods already known to match its selector)."""
        if self.namespaces is None or namespace in self.namespaces:
            return True
        if self.namespace_selector is None:
            return False
        return namespace_labels is None or self.namespace_selector.matches(namespace_labels)

    def matches(self, namespace: str, labels: Mapping[str, str],
                namespace_labels: Mapping[str, str] | None = None) -> bool:
        """kube-scheduler's ``AffinityTerm.Matches`` for a pod of `namespace` with `labels`."""
        if self.selector is None or not self.in_namespaces(namespace, namespace_labels):
            return False
        return self.selector.matches(labels)


Resolve = Callable[[Mapping[str, object]], "frozenset[str] | None"]
"""The namespaces a non-empty namespaceSelector selects, None when unknown (see `hoss.model.compact`)."""


def parse_terms(raw: object, *, field: str, owner_namespace: str, lenient: bool = False,
                single: bool = False, resolve: Resolve | None = None) -> tuple[PodAffinityTerm, ...]:
    """The required terms at `field` (a list); raises `PodSpecError` naming a bad field, `UnsupportedPodField` for
    a non-empty namespaceSelector `resolve` does not know, unless `lenient` (the selector is then kept).
    `single`: `raw` is ``[term]`` and `field` names the term."""
    terms = []
    for position, item in enumerate(payload.items(raw, field=field, error=PodSpecError)):
        term_field = field if single else f"{field}[{position}]"
        term = payload.mapping(item, field=term_field, error=PodSpecError, required=True)
        key = payload.string(term.get("topologyKey"), field=f"{term_field}.topologyKey", error=PodSpecError,
                             required=True)
        selector = None
        if term.get("labelSelector") is not None:
            selector = _selector(term.get("labelSelector"), field=f"{term_field}.labelSelector")
        listed = payload.items(term.get("namespaces"), field=f"{term_field}.namespaces", error=PodSpecError)
        names = {payload.string(n, field=f"{term_field}.namespaces[{i}]", error=PodSpecError)
                 for i, n in enumerate(listed)}
        raw_selector = term.get("namespaceSelector")
        namespaces: frozenset[str] | None
        namespace_selector = None
        if raw_selector is None:
            namespaces = frozenset(names or {owner_namespace})
        else:
            parsed = _selector(raw_selector, field=f"{term_field}.namespaceSelector")
            if not parsed.requirements:
                namespaces = None  # {} selects every namespace
            elif lenient:
                namespaces, namespace_selector = frozenset(names), parsed
            else:
                assert isinstance(raw_selector, Mapping)
                selected = resolve(raw_selector) if resolve is not None else None
                if selected is None:
                    raise UnsupportedPodField(f"{term_field}.namespaceSelector")  # not resolved by a dispatcher
                namespaces = frozenset(names) | selected
        terms.append(PodAffinityTerm(topology_key=key, selector=selector, namespaces=namespaces,
                                     namespace_selector=namespace_selector))
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


@dataclass(frozen=True)
class WeightedPodTerm:
    """One ``preferredDuringSchedulingIgnoredDuringExecution`` pod (anti-)affinity term and its weight (1..100)."""

    weight: int
    term: PodAffinityTerm


def parse_weighted_terms(raw: object, *, field: str, owner_namespace: str, lenient: bool = False,
                         resolve: Resolve | None = None) -> tuple[WeightedPodTerm, ...]:
    """The preferred terms at `field` (a list of ``{weight, podAffinityTerm}``); errors as `parse_terms`."""
    weighted = []
    for position, item in enumerate(payload.items(raw, field=field, error=PodSpecError)):
        entry_field = f"{field}[{position}]"
        entry = payload.mapping(item, field=entry_field, error=PodSpecError, required=True)
        weight = payload.integer(entry.get("weight"), field=f"{entry_field}.weight", error=PodSpecError)
        if not 1 <= weight <= MAX_TERM_WEIGHT:
            if lenient:
                continue
            raise PodSpecError(field=f"{entry_field}.weight", reason=f"must be in the range 1-100, got {weight}")
        [term] = parse_terms([entry.get("podAffinityTerm")], field=f"{entry_field}.podAffinityTerm",
                             owner_namespace=owner_namespace, lenient=lenient, single=True, resolve=resolve)
        weighted.append(WeightedPodTerm(weight=weight, term=term))
    return tuple(weighted)


MAX_TERM_WEIGHT = 100
DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"
HONOR = "Honor"
IGNORE = "Ignore"
_INCLUSION_POLICIES = (HONOR, IGNORE)


@dataclass(frozen=True)
class SpreadConstraint:
    """One topology spread constraint, defaults applied and matchLabelKeys merged into the selector."""

    max_skew: int
    topology_key: str
    hard: bool
    """whenUnsatisfiable DoNotSchedule (a filter); False: ScheduleAnyway (a score)."""
    selector: LabelSelector | None
    """None: no labelSelector, which matches no pod (and not the pod itself)."""
    min_domains: int = 1
    honor_node_affinity: bool = True
    """nodeAffinityPolicy Honor: only nodes matching the pod's nodeSelector and required node affinity count."""
    honor_node_taints: bool = False
    """nodeTaintsPolicy Honor: only nodes without a NoSchedule/NoExecute taint the pod does not tolerate count."""

    def counts(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether a placed pod of `namespace` with `labels` counts in the pod's (of `namespace`) domains: as
        kube-scheduler's ``countPodsMatchSelector``, an empty selector counts no pod."""
        return self.selector is not None and bool(self.selector.requirements) and self.selector.matches(labels)

    def matches_itself(self, labels: Mapping[str, str]) -> bool:
        """kube-scheduler's selfMatchNum: the incoming pod's own labels satisfy the selector (empty: yes)."""
        return self.selector is not None and self.selector.matches(labels)


def parse_spread(raw: object, *, pod_labels: Mapping[str, str],
                 field: str = "spec.topologySpreadConstraints") -> tuple[SpreadConstraint, ...]:
    """The constraints at `field`; raises `PodSpecError` naming a bad field or value."""
    constraints = []
    for position, item in enumerate(payload.items(raw, field=field, error=PodSpecError)):
        item_field = f"{field}[{position}]"
        entry = payload.mapping(item, field=item_field, error=PodSpecError, required=True)
        max_skew = payload.integer(entry.get("maxSkew"), field=f"{item_field}.maxSkew", error=PodSpecError)
        if max_skew < 1:
            raise PodSpecError(field=f"{item_field}.maxSkew", reason=f"must be greater than zero, got {max_skew}")
        key = payload.string(entry.get("topologyKey"), field=f"{item_field}.topologyKey", error=PodSpecError,
                             required=True)
        when = payload.string(entry.get("whenUnsatisfiable"), field=f"{item_field}.whenUnsatisfiable",
                              error=PodSpecError, required=True)
        if when not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
            raise PodSpecError(field=f"{item_field}.whenUnsatisfiable",
                               reason=f"unknown value {when!r}, expected {DO_NOT_SCHEDULE} or {SCHEDULE_ANYWAY}")
        min_domains = 1
        if entry.get("minDomains") is not None:
            min_domains = payload.integer(entry.get("minDomains"), field=f"{item_field}.minDomains",
                                          error=PodSpecError)
            if min_domains < 1:
                raise PodSpecError(field=f"{item_field}.minDomains",
                                   reason=f"must be greater than zero, got {min_domains}")
            if when != DO_NOT_SCHEDULE:
                raise PodSpecError(field=f"{item_field}.minDomains",
                                   reason=f"can only be set when whenUnsatisfiable is {DO_NOT_SCHEDULE}")
        policies = {}
        for name, default in (("nodeAffinityPolicy", HONOR), ("nodeTaintsPolicy", IGNORE)):
            value = payload.string(entry.get(name), field=f"{item_field}.{name}", error=PodSpecError) or default
            if value not in _INCLUSION_POLICIES:
                raise PodSpecError(field=f"{item_field}.{name}",
                                   reason=f"unknown value {value!r}, expected {HONOR} or {IGNORE}")
            policies[name] = value == HONOR
        selector = None
        if entry.get("labelSelector") is not None:
            selector = _selector(entry.get("labelSelector"), field=f"{item_field}.labelSelector")
        keys = payload.items(entry.get("matchLabelKeys"), field=f"{item_field}.matchLabelKeys", error=PodSpecError)
        merged = []
        for index, key_item in enumerate(keys):
            label = payload.string(key_item, field=f"{item_field}.matchLabelKeys[{index}]", error=PodSpecError,
                                   required=True)
            if label in pod_labels:
                merged.append(LabelRequirement(key=label, operator="In", values=frozenset({pod_labels[label]})))
        if merged and selector is not None:
            # kube-scheduler merges the pod's values into the selector; a nil selector stays "nothing".
            selector = LabelSelector((*merged, *selector.requirements))
        constraints.append(SpreadConstraint(
            max_skew=max_skew, topology_key=key, hard=when == DO_NOT_SCHEDULE, selector=selector,
            min_domains=min_domains, honor_node_affinity=policies["nodeAffinityPolicy"],
            honor_node_taints=policies["nodeTaintsPolicy"]))
    return tuple(constraints)
