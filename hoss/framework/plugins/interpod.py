"""InterPodAffinity (required terms): the pods already in a node's topology domains decide. Vectorised per domain.

As kube-scheduler's filter, over the workers' pod index (`NodeTable.pods`, every pod holding a ledger entry,
bound or reserved; see `hoss.framework.podterms` for how a term matches a pod):

- affinity: for every required podAffinity term, the node must carry the term's topologyKey and its domain
  (the nodes with the same value of that label) must hold a pod that matches *all* the pod's affinity terms.
  When no pod in the cluster matches and the pod matches all its own terms (the first pod of a group that is
  affine to itself), any node with every topology key passes. Else ``node(s) didn't match pod affinity rules``.
- anti-affinity: for every required podAntiAffinity term, no pod matching it may be in the node's domain of the
  term's topologyKey (a node without that label passes), else ``node(s) didn't match pod anti-affinity rules``.
  A pod that matches its own anti-affinity term therefore spreads one per domain.
- existing pods' anti-affinity: a pod already placed whose anti-affinity term matches the incoming pod keeps it
  out of that pod's domain: ``node(s) didn't satisfy existing pods anti-affinity rules``.

A node is reported under the first of these that rejects it, in this order, as kube-scheduler reports it.
Its figures (`hoss why`) name the term's topology domain and a pod that decides it: one matching the pod's
anti-affinity there, or a placed pod whose anti-affinity keeps the pod out.

As a score (kube-scheduler's default weight 2), per topology domain: + weight for each placed pod matching one of
the pod's preferred affinity terms, - weight for each matching a preferred anti-affinity term; and from the pods
already placed, + weight of their preferred affinity terms and - weight of their preferred anti-affinity terms
that match the incoming pod, + 1 for each of their required affinity terms that matches it (kube-scheduler's
hardPodAffinityWeight 1). A node scores the sum over the domains it is in; kube-scheduler's normalisation maps
the feasible nodes' scores linearly onto 0..100 (truncated), all 0 when they are equal. Existing pods' terms with
a non-empty namespaceSelector match the incoming pod by its namespace's labels, which the dispatcher sends
along (see `hoss.framework.podterms`).

The
cost is one numpy comparison per distinct (topologyKey, value) pair, plus a walk over the pods a selector can
match (narrowed through the index's labels); pods without inter-pod terms pay one check of the anti-affinity
holders. Races between workers are settled by the ledger: see `hoss/ledger/lua/common.lua` (inter-pod domains).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from hoss.framework.cycle import MAX_NODE_SCORE, BoolArray, FilterResult, FloatArray, TakesNoArgs
from hoss.framework.explain import Figures
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.framework.podindex import PlacedPod
from hoss.framework.podterms import PodAffinityTerm

HARD_POD_AFFINITY_WEIGHT = 1
"""kube-scheduler's default hardPodAffinityWeight: what an existing pod's required affinity term adds."""

AFFINITY_MISMATCH = "node(s) didn't match pod affinity rules"
ANTI_AFFINITY_MISMATCH = "node(s) didn't match pod anti-affinity rules"
EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"


def _in_domains(nodes: NodeTable, key: str, values: Iterable[str]) -> BoolArray:
    """Rows whose label `key` has one of `values`."""
    codes = [code for value in set(values) if (code := nodes.label_code(key, value)) is not None]
    if not codes:
        return np.zeros(len(nodes), dtype=np.bool_)
    found: BoolArray = np.isin(nodes.label_codes(key), codes)
    return found


def _domain_values(nodes: NodeTable, pods: Iterable[PlacedPod], key: str) -> set[str]:
    """The values of label `key` on the nodes of `pods` (pods on nodes not in the table, or without it, skipped)."""
    values = set()
    for pod in pods:
        row = nodes.index.get(pod.node)
        if row is not None and (value := nodes.labels[row].get(key)) is not None:
            values.add(value)
    return values


def _same_domain(nodes: NodeTable, node: str, key: str, value: str) -> bool:
    """Whether `node` (in the table) has label `key` = `value`."""
    row = nodes.index.get(node)
    return row is not None and nodes.labels[row].get(key) == value


class InterPodAffinity(TakesNoArgs):
    """Filter: required pod affinity and anti-affinity, the pod's own and the existing pods'. Score: preferred
    terms, the pod's own and the existing pods' (and their required affinity terms)."""

    name = "InterPodAffinity"

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        if not (pod.affinity_terms or pod.anti_affinity_terms or nodes.anti_holders):
            return FilterResult.from_reasons(rows, {})  # most pods: nothing to check
        affinity = self._affinity(pod, nodes) if pod.affinity_terms else np.ones(rows, dtype=np.bool_)
        anti = np.ones(rows, dtype=np.bool_)
        for term in pod.anti_affinity_terms:
            if term.selector is None:
                continue
            matching = [p for p in nodes.pods_matching(term.selector) if term.in_namespaces(p.namespace)]
            anti &= ~_in_domains(nodes, term.topology_key, _domain_values(nodes, matching, term.topology_key))
        existing = np.ones(rows, dtype=np.bool_)
        forbidden: dict[str, set[str]] = {}
        for holder in nodes.anti_holders.values():
            for term in holder.anti:
                if term.matches(pod.namespace, pod.labels, pod.namespace_labels):
                    forbidden.setdefault(term.topology_key, set()).update(
                        _domain_values(nodes, [holder], term.topology_key))
        for key, values in forbidden.items():
            existing &= ~_in_domains(nodes, key, values)
        reasons: dict[str, BoolArray] = {}
        if not affinity.all():
            reasons[AFFINITY_MISMATCH] = ~affinity
        if not anti.all():
            reasons[ANTI_AFFINITY_MISMATCH] = affinity & ~anti
        if not existing.all():
            reasons[EXISTING_ANTI_AFFINITY] = affinity & anti & ~existing
        return FilterResult.from_reasons(rows, reasons)

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, the rule that rejects it (as the filter's reasons say) with its domain and a deciding pod."""
        reasons = self.filter(pod, nodes).reasons
        anti = [(term, [p for p in nodes.pods_matching(term.selector) if term.in_namespaces(p.namespace)])
                for term in pod.anti_affinity_terms if term.selector is not None]
        holders = [(holder, term) for holder in nodes.anti_holders.values() for term in holder.anti
                   if term.matches(pod.namespace, pod.labels, pod.namespace_labels)]
        found = []
        for row in rows:
            labels = nodes.labels[row]
            text = ""
            if AFFINITY_MISMATCH in reasons and reasons[AFFINITY_MISMATCH][row]:
                lacking = [t.topology_key for t in pod.affinity_terms if t.topology_key not in labels]
                text = f"node has no label {', '.join(lacking)}" if lacking else \
                    "no pod matching the required affinity terms in the node's " + ", ".join(
                        f"{t.topology_key}={labels[t.topology_key]}" for t in pod.affinity_terms) + " domain"
            elif ANTI_AFFINITY_MISMATCH in reasons and reasons[ANTI_AFFINITY_MISMATCH][row]:
                text = next((f"{p.namespace}/{p.name or p.uid} (on {p.node}) in the node's {term.topology_key}="
                             f"{labels[term.topology_key]} domain matches the pod's anti-affinity"
                             for term, matching in anti if term.topology_key in labels for p in matching
                             if _same_domain(nodes, p.node, term.topology_key, labels[term.topology_key])), "")
            elif EXISTING_ANTI_AFFINITY in reasons and reasons[EXISTING_ANTI_AFFINITY][row]:
                text = next((f"{h.namespace}/{h.name or h.uid} (on {h.node}) keeps pods like this one out of "
                             f"{term.topology_key}={labels[term.topology_key]} (its anti-affinity)"
                             for h, term in holders if term.topology_key in labels
                             and _same_domain(nodes, h.node, term.topology_key, labels[term.topology_key])), "")
            found.append(Figures(text=text, group=text))
        return found

    @staticmethod
    def _affinity(pod: PodView, nodes: NodeTable) -> BoolArray:
        terms = pod.affinity_terms
        has_keys = np.ones(len(nodes), dtype=np.bool_)
        for term in terms:
            has_keys &= nodes.label_codes(term.topology_key) >= 0
        first = terms[0]
        candidates = nodes.pods_matching(first.selector) if first.selector is not None else []
        matching = [p for p in candidates if all(t.matches(p.namespace, p.labels) for t in terms)]
        if not matching:
            itself = all(t.matches(pod.namespace, pod.labels) for t in terms)
            return has_keys if itself else np.zeros(len(nodes), dtype=np.bool_)
        allowed = has_keys.copy()
        for term in terms:
            allowed &= _in_domains(nodes, term.topology_key, _domain_values(nodes, matching, term.topology_key))
        return allowed

    def skips(self, pod: PodView, nodes: NodeTable) -> bool:
        """No preferred term of the pod's and no placed pod whose terms score others: every node would get 0."""
        return not (pod.preferred_affinity_terms or pod.preferred_anti_affinity_terms or nodes.score_holders)

    def score(self, pod: PodView, nodes: NodeTable, feasible: BoolArray) -> FloatArray:
        rows = len(nodes)
        own = pod.preferred_affinity_terms or pod.preferred_anti_affinity_terms
        if not (own or nodes.score_holders):
            return np.zeros(rows, dtype=np.float64)  # most pods: nothing weighs in
        domains: dict[str, dict[str, int]] = {}

        def add(term: PodAffinityTerm, node: str, weight: int) -> None:
            row = nodes.index.get(node)
            value = None if row is None else nodes.labels[row].get(term.topology_key)
            if value is not None:
                values = domains.setdefault(term.topology_key, {})
                values[value] = values.get(value, 0) + weight

        for terms, sign in ((pod.preferred_affinity_terms, 1), (pod.preferred_anti_affinity_terms, -1)):
            for weighted in terms:
                term = weighted.term
                if term.selector is None:
                    continue
                for placed in nodes.pods_matching(term.selector):
                    if term.in_namespaces(placed.namespace):
                        add(term, placed.node, sign * weighted.weight)
        for holder in nodes.score_holders.values():
            for term in holder.affinity:
                if term.matches(pod.namespace, pod.labels, pod.namespace_labels):
                    add(term, holder.node, HARD_POD_AFFINITY_WEIGHT)
            for weighted in holder.preferred:
                if weighted.term.matches(pod.namespace, pod.labels, pod.namespace_labels):
                    add(weighted.term, holder.node, weighted.weight)
            for weighted in holder.preferred_anti:
                if weighted.term.matches(pod.namespace, pod.labels, pod.namespace_labels):
                    add(weighted.term, holder.node, -weighted.weight)
        total = np.zeros(rows, dtype=np.float64)
        for key, values in domains.items():
            # One entry per known value, plus a last one (0) for "label absent" that code -1 selects.
            table = np.zeros(len(nodes.label_values(key)) + 1, dtype=np.float64)
            for value, weight in values.items():
                code = nodes.label_code(key, value)
                if code is not None:
                    table[code] += weight
            total += table[nodes.label_codes(key)]
        return total

    def normalize(self, scores: FloatArray, feasible: BoolArray) -> FloatArray:
        """kube-scheduler's NormalizeScore: ``100 * (s - min) / (max - min)`` truncated, all 0 when max == min."""
        normalized = np.zeros(scores.shape, dtype=np.float64)
        if not scores.any():
            return normalized
        values = scores[feasible]
        if values.size == 0:
            return normalized
        low, high = float(values.min()), float(values.max())
        if high > low:
            normalized[feasible] = np.trunc(MAX_NODE_SCORE * (values - low) / (high - low))
        return normalized
