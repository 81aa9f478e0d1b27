"""Nodes and pods for tests: raw, shaped as the apiserver returns them; parsed, as the worker framework reads them;
as the ledger is rebuilt with them (`node_row`) and as a worker reserves them (`batch_pod`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView, parse_pod
from hoss.ledger.arguments import BatchPod, NodeRow
from hoss.model import compact

Json = dict[str, Any]

CPU_NODE = {"cpu": "32", "memory": "128Gi", "pods": "110"}
GPU_NODE = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
LEDGER_ROOM = {"cpu": 4000, "memory": 8 << 30, "pods": 110}
"""A node's allocatable in the ledger's base units (milli-CPU, bytes, counts): 4 cpu, 8 GiB, 110 pods."""


def raw_node(
    name: str,
    allocatable: Mapping[str, str] = CPU_NODE,
    *,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    unschedulable: bool = False,
    ready: bool = True,
) -> Json:
    node: Json = {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
        "status": {
            "allocatable": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if taints:
        node["spec"]["taints"] = [dict(taint) for taint in taints]
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def raw_pod(
    name: str = "web-0",
    requests: Mapping[str, str] | None = None,
    *,
    labels: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    terms: Sequence[Json] | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    namespace: str = "team",
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    generation: int | None = None,
) -> Json:
    """A pod for hoss, one container ``app`` with ``requests`` (1 cpu, 1 GiB unless given); uid ``uid-<name>``
    unless given; bound to ``node`` when given (spec.nodeName)."""
    spec: Json = {
        "schedulerName": "hoss",
        "containers": [{"name": "app", "resources": {"requests": dict(requests or {"cpu": "1", "memory": "1Gi"})}}],
    }
    if node is not None:
        spec["nodeName"] = node
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
        }
    if tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in tolerations]
    metadata: Json = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}" if uid is None else uid,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if generation is not None:
        metadata["generation"] = generation
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def pod_view(name: str = "web-0", requests: Mapping[str, str] | None = None, **fields: Any) -> PodView:
    return parse_pod(raw_pod(name, requests, **fields))


def table(*nodes: Json) -> NodeTable:
    result = NodeTable()
    for node in nodes:
        result.upsert_node(node)
    return result


def batch_pod(uid: str, *candidates: str, cpu: int = 1000, namespace: str = "ns", **fields: Any) -> BatchPod:
    """One pod of a reservation batch (`Ledger.reserve_batch`): ``cpu`` milli-CPU and one pod, on the first of
    ``candidates`` with room; ``fields`` are BatchPod's others (digest, meta, ports, position, reservation...)."""
    return BatchPod(uid=uid, pod=f"{namespace}/{uid}", digest=str(fields.pop("digest", "")), candidates=candidates,
                    request={"cpu": cpu, "pods": 1}, **fields)


def node_row(
    name: str,
    allocatable: Mapping[str, int] = LEDGER_ROOM,
    *,
    labels: Mapping[str, str] | None = None,
    described: bool = True,
) -> NodeRow:
    """A node for `Ledger.rebuild` as the sync writes it: allocatable in base units, labels, and its compact
    description. ``described=False``: none, as for a node a binding registered before the sync described it
    (a worker's feed leaves such a node out)."""
    quantities = {resource: f"{amount}m" if resource == "cpu" else str(amount)
                  for resource, amount in allocatable.items()}
    description = compact.encode(compact.compact_node(raw_node(name, quantities, labels=labels))).decode()
    return name, dict(allocatable), dict(labels or {}), description if described else ""
