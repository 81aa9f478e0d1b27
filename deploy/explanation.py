"""What `hoss why` answers about one pod, computed and rendered. Pure: the shell (deploy/why.py) reads the cluster.

The answer is the worker's own decision, step by step, over the node table the worker would hold (loaded from the
ledger) and the pod in the compact form the dispatcher would send it (namespace labels and default spread selector
included):

1. the profile: the pod's ``hoss.io/policy`` label, else the policy file's default (`Decider.profile_of`);
2. pods the worker does not decide (bound, malformed, unsupported fields) are said to be so, and stop there;
3. every node's verdict: the first filter of the profile that rejects the pod there, with its reasons and figures
   (`hoss.framework.explain`), grouped into classes of nodes with the same verdict;
4. the restrictions the worker adds: the rescheduler's hold (only its nodes), the namespace's elastic quota (the
   ledger refuses the pod on every node), a gang's all-or-nothing placement (`workers.gang.place_gang`, with the
   dispatcher's min-available rule first);
5. where it would go: the best feasible nodes by the profile's scores, with each plugin's part; the worker breaks
   ties at random, so among nodes with the same best score it may pick another than the one named.

Not shown: HTTP extenders are not called (the worker calls them between steps 3 and 5, and they may reject more
nodes; the answer says so when the profile has any); preemption is not tried (the answer says when the worker
would look for victims); the room of Koordinator Reservations that own the pod is not given back to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dispatcher.gangs import GangState
from dispatcher.routing import policy_of
from hoss.errors import HossError
from hoss.framework.cycle import Placement, Profile, choose, evaluate
from hoss.framework.errors import UnsupportedPodField
from hoss.framework.explain import JsonValue, NodeVerdict, VerdictClass, classes, explain_filters, score_parts
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, check_supported, parse_pod
from hoss.ledger.results import QuotaReport
from hoss.model.objects import Json
from hoss.model.resources import format_quantity
from workers.deciding import not_held_reason
from workers.gang import GangPlacement, place_gang
from workers.victims import eligible

HOLD_FILTER = "hoss-rescheduler"
"""How a verdict names the rescheduler's hold (not a filter plugin, a restriction the worker applies after them)."""
TIE_BREAK = 1e-6
"""The worker's tie-breaking jitter (`hoss.framework.cycle.choose`): scores closer than this are a tie."""
SCHEDULER_NAME = "hoss"


@dataclass(frozen=True)
class GangFacts:
    """A gang the pod belongs to, as the dispatcher counts it: its pending members (the pod included, each in the
    compact form the dispatcher sends) and how many are bound already."""

    state: GangState
    members: Sequence[Json]


@dataclass(frozen=True)
class Facts:
    """What the shell read besides the pod: the worker's node table, and the ledger's and registry's figures."""

    table: NodeTable
    held: Sequence[str] = ()
    """Nodes where the rescheduler holds room for the pod (`NodeFeed.held_nodes`)."""
    quotas: QuotaReport | None = None
    workers: Sequence[str] | None = None
    """Live workers serving the pod's policy; None: not read."""
    gang: GangFacts | None = None
    condition: tuple[str, str] | None = None
    """The pod's PodScheduled=False reason and message, as the apiserver has them."""
    nominated: str = ""
    """status.nominatedNodeName (a preemptor's node)."""
    phase: str = ""
    what_if: bool = False


@dataclass(frozen=True)
class Candidate:
    """A feasible node among the best, with its total score and each score plugin's weighted part."""

    node: str
    score: float
    parts: Mapping[str, float]


@dataclass
class Report:
    """The answer for one pod."""

    pod: str
    uid: str
    policy: str
    profile: str
    summary: str
    """One line: where the pod would go, or why it goes nowhere."""
    facts: Facts
    scheduler_name: str = ""
    node: str = ""
    """The node the pod is bound to ("" while pending)."""
    message: str = ""
    """The FailedScheduling message the worker would write now ("" when it would place the pod)."""
    verdicts: list[NodeVerdict] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    """Total score per feasible node."""
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str = ""
    notes: list[str] = field(default_factory=list)
    gang: dict[str, JsonValue] | None = None

    @property
    def feasible(self) -> int:
        return sum(1 for verdict in self.verdicts if verdict.feasible)

    @property
    def classes(self) -> list[VerdictClass]:
        return classes(self.verdicts)


def explain(form: Json, *, profiles: Mapping[str, Profile], default_profile: str, facts: Facts,
            top: int = 5, seed: int | None = None) -> Report:
    """The answer for the pod in compact `form`, as a worker serving its policy would decide it now."""
    metadata = form.get("metadata") or {}
    spec = form.get("spec") or {}
    key = f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"
    policy = policy_of(form, default=default_profile)
    profile = profiles.get(policy) or profiles[default_profile]
    report = Report(pod=key, uid=str(metadata.get("uid") or ""), policy=policy, profile=profile.name, summary="",
                    facts=facts, scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
                    node=str(spec.get("nodeName") or ""))
    if report.node:
        report.summary = f"bound to {report.node}: nothing to explain"
        return report
    if policy not in profiles:
        report.notes.append(f"the policies file has no profile {policy}: no worker serves this policy, so the "
                            f"pod waits; explained with the default profile {default_profile}")
    if report.scheduler_name != SCHEDULER_NAME:
        report.notes.append(f"schedulerName is {report.scheduler_name}: hoss does not schedule this pod (explained "
                            "as if it did)")
    if facts.workers is not None and not facts.workers:
        report.notes.append(f"no live worker serves policy {policy}: the dispatcher holds the pod until one does")
    try:
        pod = parse_pod(form)
        check_supported(form)
    except UnsupportedPodField as error:
        report.summary = f"{error}: the worker leaves it pending"
        return report
    except HossError as error:
        report.summary = f"hoss cannot schedule this pod: {error}"
        return report
    if pod.scheduling_gates:
        report.notes.append(f"scheduling gates {', '.join(pod.scheduling_gates)}: hoss does not place the pod until "
                            "they are removed (explained as if they were)")
    if profile.extenders:
        report.notes.append(f"profile {profile.name} calls extenders ({', '.join(e.name for e in profile.extenders)}):"
                            " not asked here; they may reject more nodes")
    table = facts.table
    if pod.uid in table.pods:
        report.notes.append(f"the ledger holds an entry for this pod on {table.pods[pod.uid].node} (reserved and not "
                            "yet bound): its request counts there")
    if facts.nominated:
        report.notes.append(f"nominated to {facts.nominated} (a preemption made room there)")
    _decide(report, profile, pod, table, facts=facts, top=top, rng=np.random.default_rng(seed))
    return report


def _decide(report: Report, profile: Profile, pod: PodView, table: NodeTable, *, facts: Facts, top: int,
            rng: np.random.Generator) -> None:
    """Steps 3 to 5 of the module docstring, into `report`."""
    explained = explain_filters(profile.filters, pod, table)
    evaluation = evaluate(profile, pod, table)
    verdicts = explained.verdicts
    if facts.held:
        allowed = np.array([name in facts.held for name in table.names], dtype=np.bool_)
        outside = np.flatnonzero(evaluation.feasible & ~allowed).tolist()
        reason = not_held_reason(facts.held)
        for row in outside:
            verdicts[row] = NodeVerdict(node=table.names[row], filter=HOLD_FILTER, reasons=(reason,))
        evaluation = evaluation.restricted(allowed, {reason: len(outside)} if outside else None)
    report.verdicts = verdicts
    feasible_rows = np.flatnonzero(evaluation.feasible)
    report.scores = {table.names[row]: float(evaluation.scores[row]) for row in feasible_rows.tolist()}
    refusal = quota_refusal(pod.namespace, pod.request, facts.quotas) if facts.quotas is not None else None
    gang = facts.gang
    if gang is not None and not gang.state.started:
        _gang(report, profile, pod, table, gang, rng=rng)
        if refusal is not None:
            report.summary = f"its namespace's elastic quota refuses it on every node: {refusal}"
        return
    decision = choose(evaluation, table, rng=rng, tie_break=TIE_BREAK, top=top)
    if not isinstance(decision, Placement):
        report.message = decision.message
        report.summary = f"fits no node now: {decision.message}"
        if eligible(pod, table):
            report.notes.append("the worker also looks for lower-priority pods to preempt for it (not shown here)")
        return
    if refusal is not None:
        report.message = f"{refusal}."
        report.summary = f"its namespace's elastic quota refuses it on every node: {refusal}"
        return
    parts = score_parts(profile, pod, table, evaluation.feasible)
    report.candidates = [
        Candidate(node=node, score=round(float(evaluation.scores[table.index[node]]), 3),
                  parts={name: round(float(values[table.index[node]]), 3) for name, values in parts.items()})
        for node in decision.candidates]
    report.chosen = decision.candidates[0]
    best = float(evaluation.scores[feasible_rows].max())
    tied = int(np.count_nonzero(evaluation.scores[feasible_rows] >= best - TIE_BREAK))
    report.summary = f"fits {len(feasible_rows)} of {len(table)} nodes; the worker would choose {report.chosen}"
    if tied > 1:
        report.summary += f" ({tied} nodes share the best score: the worker picks one of them at random)"


def _gang(report: Report, profile: Profile, pod: PodView, table: NodeTable, gang: GangFacts, *,
          rng: np.random.Generator) -> None:
    """A gang that has not started: the dispatcher's wait, else the worker's all-or-nothing placement."""
    state = gang.state
    facts: dict[str, JsonValue] = {"name": str(state.key), "minAvailable": state.min_available,
                                   "pending": state.pending, "bound": state.bound}
    report.gang = facts
    if not state.ready:
        report.summary = state.waiting_message()
        report.message = report.summary
        return
    members = [parse_pod(member) for member in gang.members]
    need = max(1, min(len(members), state.still_needed))
    placement = place_gang(profile, members, table, rng=rng, min_available=need,
                           topology_key=profile.topology_key, gang=str(state.key))
    if not isinstance(placement, GangPlacement):
        report.message = placement.message
        report.summary = f"its gang does not fit: {placement.message}"
        return
    names = {member.uid: member.name for member in members}
    facts["placement"] = {names[uid]: node for uid, node in sorted(placement.assignments.items())}
    report.chosen = placement.assignments.get(pod.uid, "")
    where = f"this pod on {report.chosen}" if report.chosen else "this pod left out (more members than needed fit)"
    report.summary = (f"its gang {state.key} fits: {len(placement.assignments)} members placed all together, "
                      f"{where}")


def quota_refusal(namespace: str, request: Mapping[str, int], quotas: QuotaReport) -> str | None:
    """Why the namespace's elastic quota refuses `request`, as the ledger's reserve scripts judge it (the rule in
    hoss/ledger/lua/common.lua, quota_conflict): the namespace's use plus the request above its max, or the quota
    namespaces' use plus the request above the sum of their min; None when it fits."""
    use = next((q for q in quotas.quotas if q.quota.namespace == namespace), None)
    if use is None:
        return None
    for resource, wanted in request.items():
        if wanted <= 0:
            continue
        used = use.used.get(resource, 0)
        ceiling = use.quota.max.get(resource)
        if ceiling is not None and used + wanted > ceiling:
            return (f"quota {namespace}: {resource} {format_quantity(resource, used)} used + "
                    f"{format_quantity(resource, wanted)} requested > max {format_quantity(resource, ceiling)}")
        guaranteed = quotas.sum_min.get(resource)
        total = quotas.sum_used.get(resource, 0)
        if guaranteed is not None and total + wanted > guaranteed:
            return (f"quota {namespace}: {resource} {format_quantity(resource, total)} used by all quotas + "
                    f"{format_quantity(resource, wanted)} requested > {format_quantity(resource, guaranteed)} "
                    "guaranteed (sum of min)")
    return None


# --- rendering ---------------------------------------------------------------------------------------------------


def to_json(report: Report) -> dict[str, JsonValue]:
    """The report as one JSON object: every node's verdict, the classes, the candidates."""
    facts = report.facts
    return {
        "pod": report.pod,
        "uid": report.uid,
        "whatIf": facts.what_if,
        "phase": facts.phase,
        "node": report.node or None,
        "schedulerName": report.scheduler_name,
        "policy": report.policy,
        "profile": report.profile,
        "condition": {"reason": facts.condition[0], "message": facts.condition[1]} if facts.condition else None,
        "workers": list(facts.workers) if facts.workers is not None else None,
        "summary": report.summary,
        "message": report.message or None,
        "nodes": len(report.verdicts),
        "feasible": report.feasible,
        "chosen": report.chosen or None,
        "candidates": [{"node": c.node, "score": c.score, "parts": dict(c.parts)} for c in report.candidates],
        "classes": [{
            "filter": c.filter, "reasons": list(c.reasons), "group": c.group, "count": len(c.nodes),
            "nodes": list(c.nodes),
            "closest": {"node": c.closest.node, "figures": c.closest.figures.text if c.closest.figures else ""},
        } for c in report.classes],
        "verdicts": [_verdict_json(verdict, report.scores) for verdict in report.verdicts],
        "gang": report.gang,
        "notes": list(report.notes),
    }


def _verdict_json(verdict: NodeVerdict, scores: Mapping[str, float]) -> dict[str, JsonValue]:
    if verdict.feasible:
        return {"node": verdict.node, "fits": True, "score": round(scores.get(verdict.node, 0.0), 3)}
    figures = verdict.figures
    return {"node": verdict.node, "fits": False, "filter": verdict.filter, "reasons": list(verdict.reasons),
            "figures": dict(figures.values) if figures is not None else {},
            "text": figures.text if figures is not None else ""}


def render_table(report: Report, *, each_node: bool = False) -> str:
    """The report for people: the pod, the summary, one line per class of nodes (or per node), the best nodes."""
    facts = report.facts
    head = "what if" if facts.what_if else "pod"
    lines = [f"{head} {report.pod}" + (f" ({facts.phase})" if facts.phase else "")
             + f", scheduler {report.scheduler_name}, policy {report.policy}: profile {report.profile}"]
    if facts.condition is not None:
        lines.append(f"hoss said: {facts.condition[0]}: {facts.condition[1]}")
    if facts.workers:
        lines.append(f"live workers serving {report.policy}: {', '.join(facts.workers)}")
    if report.gang is not None:
        gang = report.gang
        lines.append(f"gang {gang['name']}: {gang['pending']} pending, {gang['bound']} bound, min-available "
                     f"{gang['minAvailable'] if gang['minAvailable'] is not None else 'unknown'}")
    lines += [f"note: {note}" for note in report.notes]
    lines += ["", f"verdict: {report.summary}"]
    if report.verdicts:
        rejected = len(report.verdicts) - report.feasible
        lines += ["", f"{report.feasible} of {len(report.verdicts)} nodes pass every filter; {rejected} do not:"]
        rows = _node_rows(report) if each_node else _class_rows(report)
        if rows:
            lines += _columns(["NODES" if not each_node else "NODE", "FILTER", "REASON",
                                 "FIGURES (of the node named)" if not each_node else "FIGURES"], rows)
    if report.candidates:
        lines += ["", "best nodes (the worker's scores; parts are each plugin's weighted score):"]
        lines += _columns(["RANK", "NODE", "SCORE", "PARTS"], [
            [str(rank), c.node, f"{c.score:g}", ", ".join(f"{name} {value:g}" for name, value in c.parts.items()
                                                         if value) or "-"]
            for rank, c in enumerate(report.candidates, start=1)])
    return "\n".join(lines)


def _class_rows(report: Report) -> list[list[str]]:
    rows = []
    for found in report.classes:
        closest = found.closest
        others = len(found.nodes) - 1
        nodes = f"{len(found.nodes)}: {closest.node}" + (f", +{others}" if others else "")
        rows.append([nodes, found.filter, "; ".join(found.reasons),
                     closest.figures.text if closest.figures is not None else ""])
    return rows


def _node_rows(report: Report) -> list[list[str]]:
    return [[v.node, v.filter, "; ".join(v.reasons), v.figures.text if v.figures is not None else ""]
            for v in sorted(report.verdicts, key=lambda v: v.node) if not v.feasible]


def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]
