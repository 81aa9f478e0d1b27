"""NodePool: confine pods to node pools, and tenants (namespaces) to their pools. Pure, vectorised.

A node belongs to pool ``P`` when it carries the label ``hoss.io/pool=P``; a node without the label is in no pool.
Which pool a pod must run in (its *pool*):
- the pool its namespace is mapped to in ``namespacePools`` (a tenant confined to its pool), else
- the pool its ``hoss.io/pool`` label names, else
- none: any node will do -- except, with ``exclusive: true``, nodes of mapped (tenant-exclusive) pools.

Conflicts fit nowhere, with a reason that says why: a pod in a mapped namespace that names another pool, and,
with ``exclusive: true``, a pod from another namespace that names a tenant's exclusive pool.

Args: ``namespacePools: {namespace: pool}`` (default: the policy file's top-level ``namespacePools``) and
``exclusive`` (default false). `pool_usage` sums allocatable and usage per pool for the status page.

Its figures (`hoss why`): the pod's pool and where it comes from (its namespace's mapping or its label) against the
node's own pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self, TypedDict

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from hoss.framework.cycle import BoolArray, FilterResult
from hoss.framework.explain import Figures
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import POOL_LABEL, PodView

NAMESPACE_POOLS_ARG = "namespacePools"
"""The NodePool arg that the policy file's top-level ``namespacePools`` provides when a profile leaves it out."""

EXCLUSIVE_POOL = "node(s) were in a tenant-exclusive pool"


def not_in_pool_reason(pool: str) -> str:
    """The reason for nodes outside the pod's pool."""
    return f"node(s) were not in pool {pool}"


def namespace_conflict_reason(*, pool: str, namespace: str, confined: str) -> str:
    """The reason for every node when the pod names a pool its namespace is not confined to."""
    return f"pod asks for pool {pool} but namespace {namespace} is confined to pool {confined}"


def exclusive_conflict_reason(*, pool: str, owners: list[str]) -> str:
    """The reason for every node when the pod names another tenant's exclusive pool."""
    return f"pool {pool} is exclusive to namespace(s) {', '.join(owners)}"


class NodePoolArgs(BaseModel):
    """Args of NodePool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace_pools: dict[str, str] = Field(default_factory=dict, alias=NAMESPACE_POOLS_ARG)
    """Namespace -> the pool its pods are confined to."""
    exclusive: StrictBool = False
    """True: the mapped pools serve only their namespaces; pods without a pool stay off them."""


class NodePool:
    """Filter: rejects nodes outside the pod's pool (and, if exclusive, other tenants' pools)."""

    name = "NodePool"

    def __init__(self, *, namespace_pools: Mapping[str, str] | None = None, exclusive: bool = False) -> None:
        self.namespace_pools = dict(namespace_pools or {})
        self.exclusive = exclusive
        self.owners: dict[str, list[str]] = {}
        """Mapped pool -> the namespaces confined to it, sorted."""
        for namespace, pool in sorted(self.namespace_pools.items()):
            self.owners.setdefault(pool, []).append(namespace)

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        parsed = NodePoolArgs.model_validate(args)
        return cls(namespace_pools=parsed.namespace_pools, exclusive=parsed.exclusive)

    def filter(self, pod: PodView, nodes: NodeTable) -> FilterResult:
        rows = len(nodes)
        everywhere = np.ones(rows, dtype=np.bool_)
        confined = self.namespace_pools.get(pod.namespace)
        if confined is not None and pod.pool is not None and pod.pool != confined:
            reason = namespace_conflict_reason(pool=pod.pool, namespace=pod.namespace, confined=confined)
            return FilterResult.from_reasons(rows, {reason: everywhere})
        pool = confined if confined is not None else pod.pool
        if pool is None:
            if not self.exclusive or not self.owners:
                return FilterResult.from_reasons(rows, {})
            exclusive = in_pools(nodes, self.owners)
            return FilterResult.from_reasons(rows, {EXCLUSIVE_POOL: exclusive} if exclusive.any() else {})
        if self.exclusive and confined is None and pool in self.owners:
            reason = exclusive_conflict_reason(pool=pool, owners=self.owners[pool])
            return FilterResult.from_reasons(rows, {reason: everywhere})
        outside = ~in_pools(nodes, [pool])
        return FilterResult.from_reasons(rows, {not_in_pool_reason(pool): outside} if outside.any() else {})

    def figures(self, pod: PodView, nodes: NodeTable, rows: Sequence[int]) -> list[Figures]:
        """Per node, the pod's pool (and why it has that pool) against the node's pool."""
        confined = self.namespace_pools.get(pod.namespace)
        pool = confined if confined is not None else pod.pool
        source = f"namespacePools maps namespace {pod.namespace} to it" if confined is not None \
            else f"pod label {POOL_LABEL}"
        found = []
        for row in rows:
            own = nodes.labels[row].get(POOL_LABEL)
            where = f"node in pool {own}" if own else "node in no pool"
            if confined is not None and pod.pool is not None and pod.pool != confined:
                text = namespace_conflict_reason(pool=pod.pool, namespace=pod.namespace, confined=confined)
            elif pool is None:
                text = f"{where}, exclusive to namespace(s) {', '.join(self.owners.get(own or '', []))}"
            elif self.exclusive and confined is None and pool in self.owners:
                text = exclusive_conflict_reason(pool=pool, owners=self.owners[pool])
            else:
                text = f"pod's pool {pool} ({source}); {where}"
            found.append(Figures(text=text, group=text, values={"pod_pool": pool, "node_pool": own}))
        return found


def in_pools(nodes: NodeTable, pools: Iterable[str]) -> BoolArray:
    """Rows labelled ``hoss.io/pool`` with one of `pools`."""
    table = np.zeros(len(nodes.label_values(POOL_LABEL)) + 1, dtype=np.bool_)  # last entry: label absent (-1)
    codes = [nodes.label_code(POOL_LABEL, pool) for pool in pools]
    table[[code for code in codes if code is not None]] = True
    matched: BoolArray = table[nodes.label_codes(POOL_LABEL)]
    return matched


class PoolUsage(TypedDict):
    """One pool's size and resources."""

    nodes: int
    alloc: dict[str, int]
    """Allocatable per resource, summed over the pool's nodes (resources at 0 left out)."""
    used: dict[str, int]
    """Ledger usage (bound + assumed) per resource, summed over the pool's nodes (resources at 0 left out)."""


def pool_usage(nodes: NodeTable) -> dict[str, PoolUsage]:
    """Per pool (nodes without a pool label are left out), its node count, allocatable and usage."""
    codes = nodes.label_codes(POOL_LABEL)
    pooled = codes >= 0
    values = nodes.label_values(POOL_LABEL)
    count = np.bincount(codes[pooled], minlength=len(values))
    alloc = np.zeros((len(values), len(nodes.resources)), dtype=np.int64)
    used = np.zeros_like(alloc)
    np.add.at(alloc, codes[pooled], nodes.alloc[pooled])
    np.add.at(used, codes[pooled], nodes.used[pooled])
    return {
        values[code]: PoolUsage(
            nodes=int(count[code]),
            alloc=_vector(nodes.resources, alloc[code]),
            used=_vector(nodes.resources, used[code]),
        )
        for code in np.flatnonzero(count).tolist()
    }


def _vector(resources: list[str], amounts: NDArray[np.int64]) -> dict[str, int]:
    return {resource: int(amount) for resource, amount in zip(resources, amounts, strict=True) if amount}
