"""HTTP scheduler extenders: kube-scheduler's extender protocol, consulted after the in-process plugins.

A profile's ``extenders`` (`hoss.framework.cycle.ExtenderConfig`) are called for each pod, in order, after the
profile's filters and scores have run:
- filter: ``POST <urlPrefix>/<filterVerb>`` with ``ExtenderArgs`` ``{"Pod": <raw pod>, "NodeNames": [...]}``
  (``nodeCacheCapable: true``) or ``{"Pod": ..., "Nodes": {"items": [{"metadata": {"name", "labels"}}]}}``
  (a minimal node list otherwise), over the nodes still feasible. The answer, ``ExtenderFilterResult``
  ``{"NodeNames" or "Nodes", "FailedNodes": {node: reason}, "FailedAndUnresolvableNodes": {...}, "Error"}``,
  narrows the feasible nodes; the failed nodes' reasons join the pod's FailedScheduling message.
- prioritize: ``POST <urlPrefix>/<prioritizeVerb>`` with the same args over the nodes left after every filter;
  the answer ``HostPriorityList`` ``[{"Host": node, "Score": 0..10}]`` adds ``score * weight * 100/10`` to each
  node's total. Prioritize calls of different extenders run concurrently.

An extender can only remove nodes, never add one the plugins rejected. A call that fails -- connection error,
timeout (``timeoutSeconds``), HTTP status other than 200, malformed body, or a non-empty ``Error`` -- is logged
once; an ``ignorable`` extender is then skipped for this pod, any other makes the pod unschedulable with a
message naming the extender and the error (unlike kube-scheduler, which ignores every prioritize error: a
non-ignorable extender is one the operator wants obeyed). There are no retries here: the worker retries the
pod with backoff.

`decide_with_extenders` is `hoss.framework.cycle.decide` with the extenders between its evaluate and choose
steps; for a profile without extenders it is exactly `decide` and makes no call. The payload builders and
parsers are pure functions; only `call_extender` does I/O.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from hoss.framework.cycle import (
    MAX_EXTENDER_PRIORITY,
    MAX_NODE_SCORE,
    BoolArray,
    Decision,
    Evaluation,
    ExtenderConfig,
    FloatArray,
    Profile,
    Unschedulable,
    choose,
    evaluate,
)
from hoss.framework.errors import WorkerError
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView
from hoss.model.objects import Json

log = logging.getLogger(__name__)



class ExtenderError(WorkerError):
    """One extender call failed; `extender` is its URL prefix, `verb` the call."""

    def __init__(self, *, extender: str, verb: str, reason: str) -> None:
        self.extender = extender
        self.verb = verb
        self.reason = reason
        super().__init__(f"extender {extender} failed on {verb}: {reason}")


class _Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str


class _Node(BaseModel):
    model_config = ConfigDict(extra="ignore")

    metadata: _Metadata


class _NodeList(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[_Node] | None = None


class FilterResult(BaseModel):
    """kube-scheduler's ``ExtenderFilterResult``."""

    model_config = ConfigDict(extra="ignore")

    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    nodes: _NodeList | None = Field(default=None, alias="Nodes")
    failed_nodes: dict[str, str] | None = Field(default=None, alias="FailedNodes")
    failed_and_unresolvable_nodes: dict[str, str] | None = Field(default=None, alias="FailedAndUnresolvableNodes")
    error: str | None = Field(default="", alias="Error")


class HostPriority(BaseModel):
    """One entry of kube-scheduler's ``HostPriorityList``."""

    model_config = ConfigDict(extra="ignore")

    host: str = Field(alias="Host")
    score: int = Field(alias="Score")


_HOST_PRIORITIES = TypeAdapter(list[HostPriority])


# --- Pure: payloads and answers --------------------------------------------------------------------------------


def extender_args(config: ExtenderConfig, raw_pod: Mapping[str, Any], nodes: NodeTable, candidates: BoolArray) -> Json:
    """The ``ExtenderArgs`` body for the `candidates` rows."""
    rows = np.flatnonzero(candidates).tolist()
    if config.node_cache_capable:
        return {"Pod": raw_pod, "NodeNames": [nodes.names[row] for row in rows]}
    items = [{"metadata": {"name": nodes.names[row], "labels": dict(nodes.labels[row])}} for row in rows]
    return {"Pod": raw_pod, "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": items}}


def filter_outcome(
    config: ExtenderConfig, body: object, nodes: NodeTable, candidates: BoolArray
) -> tuple[BoolArray, dict[str, int]]:
    """The rows the extender keeps (a subset of `candidates`), and per reason how many candidates it rejected."""
    try:
        result = FilterResult.model_validate(body)
    except ValidationError as error:
        raise ExtenderError(extender=config.name, verb=config.filter_verb, reason=_invalid(error)) from error
    if result.error:
        raise ExtenderError(extender=config.name, verb=config.filter_verb, reason=result.error)
    if result.node_names is not None:
        names = result.node_names
    elif result.nodes is not None:
        names = [item.metadata.name for item in result.nodes.items or []]
    else:
        names = []
    kept = np.zeros(len(nodes), dtype=np.bool_)
    kept[[nodes.index[name] for name in names if name in nodes.index]] = True
    kept &= candidates
    rejected = candidates & ~kept
    reasons: dict[str, int] = {}
    explained = np.zeros(len(nodes), dtype=np.bool_)
    for failed in (result.failed_nodes or {}, result.failed_and_unresolvable_nodes or {}):
        for name, reason in failed.items():
            row = nodes.index.get(name)
            if row is not None and rejected[row] and not explained[row]:
                explained[row] = True
                reasons[reason] = reasons.get(reason, 0) + 1
    silent = int(np.count_nonzero(rejected & ~explained))
    if silent:
        reasons[f"node(s) didn't pass extender {config.name}"] = silent
    return kept, reasons


def priority_scores(config: ExtenderConfig, body: object, nodes: NodeTable, candidates: BoolArray) -> FloatArray:
    """The extender's priorities as additions to the node totals: ``score * weight * 100/10`` on candidates."""
    try:
        priorities = _HOST_PRIORITIES.validate_python(body)
    except ValidationError as error:
        raise ExtenderError(extender=config.name, verb=config.prioritize_verb, reason=_invalid(error)) from error
    scores = np.zeros(len(nodes), dtype=np.float64)
    for priority in priorities:
        row = nodes.index.get(priority.host)
        if row is not None:
            scores[row] = min(max(priority.score, 0), MAX_EXTENDER_PRIORITY)
    scale = config.weight * MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY
    added: FloatArray = np.where(candidates, scores * scale, 0.0)
    return added


def _invalid(error: ValidationError) -> str:
    detail = error.errors()[0]
    where = ".".join(str(part) for part in detail["loc"]) or "body"
    return f"invalid response at {where}: {detail['msg']}"


# --- I/O -------------------------------------------------------------------------------------------------------


async def call_extender(session: aiohttp.ClientSession, config: ExtenderConfig, *, verb: str, body: Json) -> object:
    """POST `body` to ``<urlPrefix>/<verb>`` and return the decoded JSON answer; raises `ExtenderError`."""
    try:
        async with session.post(
            config.url(verb), json=body, timeout=aiohttp.ClientTimeout(total=config.timeout_seconds)
        ) as response:
            if response.status != 200:
                text = (await response.text())[:200]
                raise ExtenderError(extender=config.name, verb=verb, reason=f"HTTP {response.status}: {text}")
            answer: object = await response.json(content_type=None)
            return answer
    except TimeoutError as error:
        reason = f"no answer within {config.timeout_seconds:g}s"
        raise ExtenderError(extender=config.name, verb=verb, reason=reason) from error
    except (aiohttp.ClientError, ValueError) as error:
        raise ExtenderError(extender=config.name, verb=verb, reason=repr(error)) from error


async def decide_with_extenders(
    profile: Profile,
    pod: PodView,
    raw_pod: Mapping[str, Any],
    nodes: NodeTable,
    *,
    rng: np.random.Generator,
    top: int,
    session: aiohttp.ClientSession,
    tie_break: float = 1e-6,
) -> Decision:
    """`decide`, with the profile's extenders filtering and prioritising between evaluate and choose."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    evaluation = evaluate(profile, pod, nodes)
    if profile.extenders and evaluation.feasible.any():
        try:
            evaluation = await run_extenders(
                profile.extenders, pod=pod, raw_pod=raw_pod, nodes=nodes, evaluation=evaluation, session=session
            )
        except ExtenderError as error:
            return Unschedulable(message=str(error), reasons={})
    return choose(evaluation, nodes, rng=rng, tie_break=tie_break, top=top)


async def run_extenders(
    extenders: Sequence[ExtenderConfig],
    *,
    pod: PodView,
    raw_pod: Mapping[str, Any],
    nodes: NodeTable,
    evaluation: Evaluation,
    session: aiohttp.ClientSession,
) -> Evaluation:
    """`evaluation` narrowed by every filter extender, then with every prioritize extender's scores added."""
    for config in extenders:
        if not config.filter_verb or not evaluation.feasible.any():
            continue
        candidates = evaluation.feasible
        try:
            body = extender_args(config, raw_pod, nodes, candidates)
            answer = await call_extender(session, config, verb=config.filter_verb, body=body)
            kept, reasons = filter_outcome(config, answer, nodes, candidates)
        except ExtenderError as error:
            _skip_or_raise(config, error, pod=pod)
            continue
        evaluation = evaluation.restricted(kept, reasons)

    prioritizers = [config for config in extenders if config.prioritize_verb]
    if not prioritizers or not evaluation.feasible.any():
        return evaluation
    candidates = evaluation.feasible
    outcomes = await asyncio.gather(
        *(_prioritize(session, config, raw_pod=raw_pod, nodes=nodes, candidates=candidates) for config in prioritizers)
    )
    total = evaluation.scores.copy()
    for config, outcome in zip(prioritizers, outcomes, strict=True):
        if isinstance(outcome, ExtenderError):
            _skip_or_raise(config, outcome, pod=pod)
        else:
            total += outcome
    return replace(evaluation, scores=total)


async def _prioritize(
    session: aiohttp.ClientSession,
    config: ExtenderConfig,
    *,
    raw_pod: Mapping[str, Any],
    nodes: NodeTable,
    candidates: BoolArray,
) -> FloatArray | ExtenderError:
    # The error is returned, not raised, so that one failing extender does not abandon the others' calls.
    try:
        body = extender_args(config, raw_pod, nodes, candidates)
        answer = await call_extender(session, config, verb=config.prioritize_verb, body=body)
        return priority_scores(config, answer, nodes, candidates)
    except ExtenderError as error:
        return error


def _skip_or_raise(config: ExtenderConfig, error: ExtenderError, *, pod: PodView) -> None:
    if not config.ignorable:
        raise error
    log.warning("pod %s: %s; skipped (ignorable)", pod.key, error)
