"""NodeAffinity: the pod's nodeSelector and required node affinity. Pure, vectorised.

nodeSelector entries must all match. Required affinity terms are ORed; inside a term every matchExpressions and
matchFields requirement must hold; a term with no requirement matches no node (Kubernetes' rule). Operators follow
Kubernetes: ``NotIn`` and ``DoesNotExist`` match a node without the label, ``Gt``/``Lt`` need the label to be an
integer, matchFields only knows ``metadata.name``.

Each label requirement becomes a lookup table over the label's known values (one Python step per distinct value,
never per node; ``In``/``NotIn`` only touch the values they name) indexed by the per-row value codes of the
`NodeTable`.

As a score (kube-scheduler's default weight 2), NodeAffinity sums per node the weights of the pod's preferred
terms (``preferredDuringSchedulingIgnoredDuringExecution``) the node matches, and normalises them as
kube-scheduler does: ``100 * sum // max`` over the feasible nodes (all 0 when no node matches any term).

Its figures (`hoss why`): the nodeSelector entries a node does not match, else, per required term, the first
requirement the node does not meet, each with the node's own value of the label.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hoss.framework.cycle import BoolArray, FilterResult, FloatArray, TakesNoArgs, default_normalize
from hoss.framework.explain import Figures, JsonValue
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, SelectorRequirement, SelectorTerm, parse_integer

AFFINITY_MISMATCH = "node(s) didn't match Pod's node affinity/selector"


class NodeAffinity(TakesNoArgs):
    """Filter: rejects nodes that do not match the pod's nodeSelector or required node affinity."""

    name = "NodeAffinity"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        matched = np.ones(rows, dtype=np.bool_)
        for key, value in pod.node_selector.items():
            matched &= label_matches(nodes, SelectorRequirement(key=key, operator="In", values=(value,)))
        if pod.required_affinity is not None:
            any_term = np.zeros(rows, dtype=np.bool_)
            for term in pod.required_affinity:
                any_term |= term_matches(nodes, term)
            matched &= any_term
        return FilterResult.from_reasons(rows, {AFFINITY_MISMATCH: ~matched} if not matched.all() else {})

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, the nodeSelector entries it does not match, else the first unmet requirement of each term."""
        selector = [(key, value, label_matches(nodes, SelectorRequirement(key=key, operator="In", values=(value,))))
                    for key, value in pod.node_selector.items()]
        terms = [[(requirement, False, label_matches(nodes, requirement)) for requirement in term.match_expressions]
                 + [(requirement, True, name_matches(nodes, requirement)) for requirement in term.match_fields]
                 for term in pod.required_affinity or ()]
        found = []
        for row in rows:
            labels = nodes.labels[row]
            unmatched = [(key, value) for key, value, matched in selector if not matched[row]]
            if unmatched:
                text = "; ".join(f"nodeSelector {key}={value}: node has {_label_text(labels, key)}"
                                 for key, value in unmatched)
                values: dict[str, JsonValue] = {"nodeSelector": {key: {"wanted": value, "node": labels.get(key)}
                                                                 for key, value in unmatched}}
                found.append(Figures(text=text, group=text, values=values))
                continue
            misses: list[str] = []
            for position, requirements in enumerate(terms):
                miss = next(((r, by_name) for r, by_name, matched in requirements if not matched[row]), None)
                if miss is None:
                    misses.append(f"term {position}: no requirement (matches no node)")
                    continue
                requirement, by_name = miss
                has = f"name {nodes.names[row]}" if by_name else _label_text(labels, requirement.key)
                misses.append(f"term {position}: {_requirement_text(requirement)}: node has {has}")
            text = "no required node-affinity term matches: " + "; ".join(misses)
            found.append(Figures(text=text, group=text, values={"terms": list(misses)}))
        return found

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        """The sum of the weights of the preferred terms each node matches."""
        total = np.zeros(len(nodes), dtype=np.float64)
        for preferred in pod.preferred_affinity:
            total += preferred.weight * term_matches(nodes, preferred.term)
        return total

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        return default_normalize(scores, feasible)


def term_matches(nodes: NodeTable, term: SelectorTerm) -> BoolArray:
    """Rows that satisfy every requirement of `term`; none when the term is empty."""
    if not term.match_expressions and not term.match_fields:
        return np.zeros(len(nodes), dtype=np.bool_)
    matched = np.ones(len(nodes), dtype=np.bool_)
    for requirement in term.match_expressions:
        matched &= label_matches(nodes, requirement)
    for requirement in term.match_fields:
        matched &= name_matches(nodes, requirement)
    return matched


def label_matches(nodes: NodeTable, requirement: SelectorRequirement) -> BoolArray:
    """Rows whose labels satisfy one matchExpressions requirement."""
    values = nodes.label_values(requirement.key)
    # One entry per known value, plus a last entry for "label absent" that code -1 selects.
    table = np.zeros(len(values) + 1, dtype=np.bool_)
    operator = requirement.operator
    if operator in ("In", "NotIn"):
        codes = [nodes.label_code(requirement.key, value) for value in requirement.values]
        table[[code for code in codes if code is not None]] = True
        if operator == "NotIn":
            table = ~table
    elif operator == "Exists":
        table[:-1] = True
    elif operator == "DoesNotExist":
        table[-1] = True
    else:
        bound = parse_integer(requirement.values[0])
        if bound is None:
            raise ValueError(f"{operator} requirement on {requirement.key} without an integer value")
        for code, value in enumerate(values):
            number = parse_integer(value)
            table[code] = number is not None and (number > bound if operator == "Gt" else number < bound)
    matched: BoolArray = table[nodes.label_codes(requirement.key)]
    return matched


def name_matches(nodes: NodeTable, requirement: SelectorRequirement) -> BoolArray:
    """Rows whose node name satisfies one matchFields requirement on ``metadata.name`` (In or NotIn)."""
    matched = np.zeros(len(nodes), dtype=np.bool_)
    rows = [nodes.index[name] for name in requirement.values if name in nodes.index]
    matched[rows] = True
    return ~matched if requirement.operator == "NotIn" else matched


def _label_text(labels: dict[str, str], key: str) -> str:
    return f"{key}={labels[key]}" if key in labels else f"no label {key}"


def _requirement_text(requirement: SelectorRequirement) -> str:
    if requirement.operator in ("Exists", "DoesNotExist"):
        return f"{requirement.key} {requirement.operator}"
    return f"{requirement.key} {requirement.operator} [{', '.join(requirement.values)}]"
