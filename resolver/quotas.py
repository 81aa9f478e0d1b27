"""Elastic quotas: mirror scheduler-plugins' ElasticQuota objects into the ledger, and write their status.used.

Run by the syncing resolver replica (the Lease holder) beside the node and pod informers. Each namespace's
ElasticQuota (`scheduling.x-k8s.io/v1alpha1`, spec.min / spec.max) becomes the ledger's quota of that namespace,
which every script that creates an entry checks atomically with the node's room (see 'Elastic quotas' in
hoss/ledger/lua/common.lua). The mirror is written whole before every rebuild, so a Redis that lost its data enforces
the quotas from its first call again. Like kube-scheduler with CapacityScheduling, one ElasticQuota per namespace
counts: a second one in a namespace is ignored (with a warning) while the first exists.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from hoss.errors import HossError
from hoss.kube.client import InformerHandlers, KubeError, request_json, run_crd_informer
from hoss.ledger.arguments import ElasticQuota
from hoss.ledger.client import Ledger
from hoss.ledger.results import QuotaReport
from hoss.model.objects import Json
from hoss.model.resources import ResourceVector, format_quantity, parse_quantity, to_base_units

log = logging.getLogger(__name__)

ELASTIC_QUOTA_API = ("scheduling.x-k8s.io", "v1alpha1", "elasticquotas")
STATUS_INTERVAL_SECONDS = 2.0
"""How often the syncing replica compares the ledger's use with each ElasticQuota's status.used."""
CRD_RECHECK_SECONDS = 30.0
"""How often a resolver whose cluster lacks the ElasticQuota CRD looks for it again."""


class QuotaSpecError(HossError):
    """An ElasticQuota the ledger cannot enforce; the message names the object, the field and the value."""


def parse_elastic_quota(obj: Json) -> tuple[str, ElasticQuota]:
    """(name, quota) of an ElasticQuota object; raises QuotaSpecError naming the field of a bad quantity."""
    metadata = obj.get("metadata") or {}
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise QuotaSpecError(f"ElasticQuota {namespace}/{name}: spec must be an object, got {spec!r}")
    vectors: dict[str, ResourceVector] = {}
    for part in ("min", "max"):
        block = spec.get(part) or {}
        if not isinstance(block, Mapping):
            raise QuotaSpecError(f"ElasticQuota {namespace}/{name}: spec.{part} must be an object, got {block!r}")
        vector: ResourceVector = {}
        for resource, value in block.items():
            field = f"ElasticQuota {namespace}/{name} spec.{part}[{resource}]"
            try:
                vector[str(resource)] = to_base_units(str(resource), parse_quantity(value, field=field))
            except HossError as error:
                raise QuotaSpecError(str(error)) from error
        vectors[part] = vector
    return name, ElasticQuota(namespace=namespace, min=vectors["min"], max=vectors["max"])


def used_status(used: Mapping[str, int], quota: ElasticQuota) -> dict[str, str]:
    """status.used as scheduler-plugins writes it: every resource the quota names (0 when unused), as quantities."""
    names = sorted(quota.min.keys() | quota.max.keys() | {r for r, a in used.items() if a})
    return {r: format_quantity(r, used.get(r, 0)) for r in names}


class QuotaMirror:
    """The ElasticQuotas of the cluster, one per namespace, and the ledger writes that follow them."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.by_namespace: dict[str, tuple[str, ElasticQuota]] = {}
        """namespace -> (object name, quota)"""
        self.listed = asyncio.Event()
        """set once the first list was applied, or once the CRD was found missing"""

    def quotas(self) -> list[ElasticQuota]:
        return [quota for _name, quota in self.by_namespace.values()]

    def _parse(self, obj: Json) -> tuple[str, ElasticQuota] | None:
        try:
            return parse_elastic_quota(obj)
        except QuotaSpecError as error:
            log.warning("ignoring %s", error)
            return None

    async def on_list(self, items: list[Json]) -> None:
        self.by_namespace.clear()
        for obj in sorted(items, key=lambda o: str((o.get("metadata") or {}).get("creationTimestamp") or "")):
            parsed = self._parse(obj)
            if parsed is not None:
                self._put(*parsed)
        await self.ledger.set_quotas(self.quotas(), replace=True)
        self.listed.set()

    def _put(self, name: str, quota: ElasticQuota) -> bool:
        held = self.by_namespace.get(quota.namespace)
        if held is not None and held[0] != name:
            log.warning("namespace %s has ElasticQuota %s already; ignoring ElasticQuota %s", quota.namespace,
                        held[0], name)
            return False
        self.by_namespace[quota.namespace] = (name, quota)
        return True

    async def on_event(self, kind: str, obj: Json) -> None:
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        if kind == "DELETED":
            held = self.by_namespace.get(namespace)
            if held is not None and held[0] == name:
                del self.by_namespace[namespace]
                await self.ledger.set_quotas([], deleted=[namespace])
                log.info("ElasticQuota %s/%s deleted: namespace %s is no longer limited", namespace, name, namespace)
            return
        parsed = self._parse(obj)
        if parsed is not None and self._put(*parsed):
            await self.ledger.set_quotas([parsed[1]])
            log.info("ElasticQuota %s/%s: min %s, max %s", namespace, name, parsed[1].min, parsed[1].max)


async def watch_quotas(api: client.ApiClient, mirror: QuotaMirror, *,
                       recheck_seconds: float = CRD_RECHECK_SECONDS) -> None:
    """Mirror the ElasticQuotas into the ledger while the CRD is installed; look for it again now and then while it
    is not (installing it later works without a restart)."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = ELASTIC_QUOTA_API
    call = functools.partial(custom.list_cluster_custom_object, group, version, plural)

    async def missing(crd_absent: bool) -> None:
        if crd_absent and mirror.by_namespace:
            mirror.by_namespace.clear()  # the CRD (and with it every ElasticQuota) was deleted
            await mirror.ledger.set_quotas([], replace=True)
        mirror.listed.set()

    await run_crd_informer("elasticquotas", call, InformerHandlers(on_list=mirror.on_list, on_event=mirror.on_event),
                           kind="ElasticQuotas", recheck_seconds=recheck_seconds, on_missing=missing,
                           found="ElasticQuota CRD found: namespaces' elastic quotas are enforced")


StatusWriter = Callable[[str, str, dict[str, str]], Awaitable[None]]


async def write_used(report: QuotaReport, mirror: QuotaMirror, written: dict[str, dict[str, str]],
                     write: StatusWriter) -> int:
    """Patch status.used of each ElasticQuota whose use changed since it was last written; returns how many."""
    count = 0
    for use in report.quotas:
        held = mirror.by_namespace.get(use.quota.namespace)
        if held is None:
            continue
        status = used_status(use.used, held[1])
        key = f"{use.quota.namespace}/{held[0]}"
        if written.get(key) == status:
            continue
        try:
            await write(use.quota.namespace, held[0], status)
        except KubeError as error:
            log.warning("cannot write status.used of ElasticQuota %s: %s", key, error)
            continue
        written[key] = status
        count += 1
    return count


async def keep_status(api: client.ApiClient, mirror: QuotaMirror, *,
                      interval: float = STATUS_INTERVAL_SECONDS) -> None:
    """Keep every ElasticQuota's status.used equal to the ledger's use of its namespace (assumed, admitted and
    bound entries, as kube-scheduler's CapacityScheduling counts assumed pods)."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = ELASTIC_QUOTA_API
    written: dict[str, dict[str, str]] = {}

    async def write(namespace: str, name: str, used: dict[str, str]) -> None:
        await request_json(custom.patch_namespaced_custom_object_status, group, version, namespace, plural, name,
                           {"status": {"used": used}}, _content_type="application/merge-patch+json",
                           _request_timeout=10)

    while True:
        await asyncio.sleep(interval)
        if not mirror.by_namespace:
            continue
        try:
            report = await mirror.ledger.quotas()
        except HossError as error:
            log.warning("cannot read quota use from the ledger: %s", error)
            continue
        await write_used(report, mirror, written, write)
