"""scheduler-plugins PodGroups: mirror them (gangs' minMember; their phase for pods that depend on them, see
dispatcher/dependencies.py); as leader, count gang members and write PodGroup status."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from dispatcher import dependencies
from dispatcher.core import Dispatcher
from dispatcher.gangs import GangKey, parse_podgroup
from dispatcher.notices import STATUS_TIMEOUT_SECONDS
from hoss.kube.client import InformerHandlers, request_json, run_crd_informer
from hoss.model.objects import Json

log = logging.getLogger(__name__)

GANG_REFRESH_SECONDS = 2.0
GANG_FOLLOWER_MEMORY_SECONDS = 600.0
"""A follower forgets a changed gang with no pending member after this long (it counts what it knows on takeover)."""

PODGROUP_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")


def _where(group: Json) -> tuple[str, str]:
    metadata = group.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


async def watch_podgroups(api: client.ApiClient, dispatcher: Dispatcher, *, recheck_seconds: float = 60.0) -> None:
    """Mirror scheduler-plugins PodGroups (minMember, scheduleTimeoutSeconds) when the CRD is installed; check
    again now and then when it is not, so installing it later works without a restart."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = PODGROUP_API
    call = functools.partial(custom.list_cluster_custom_object, group, version, plural)

    async def on_list(items: list[Json]) -> None:
        dispatcher.podgroups = dict(p for p in map(parse_podgroup, items) if p is not None)
        listed = {_where(group) for group in items}
        for namespace, groups in list(dispatcher.podgroup_states.items()):
            for name in [n for n in groups if (namespace, n) not in listed]:
                dispatcher.on_job(namespace, name, None, kind="podgroup")
        for group in items:
            dispatcher.on_job(*_where(group), dependencies.podgroup_state(group), kind="podgroup")
        dispatcher.wake()

    async def on_event(kind: str, obj: Json) -> None:
        dispatcher.on_job(*_where(obj), None if kind == "DELETED" else dependencies.podgroup_state(obj),
                          kind="podgroup")
        parsed = parse_podgroup(obj)
        if parsed is None:
            return
        if kind == "DELETED":
            dispatcher.podgroups.pop(parsed[0], None)
        else:
            dispatcher.podgroups[parsed[0]] = parsed[1]
        dispatcher.wake()

    await run_crd_informer("podgroups", call, InformerHandlers(on_list=on_list, on_event=on_event),
                           kind="PodGroups", recheck_seconds=recheck_seconds,
                           found="PodGroup CRD found: gangs may name a PodGroup (scheduling.x-k8s.io/pod-group)")


async def track_gangs(api: client.ApiClient, dispatcher: Dispatcher, is_leader: Callable[[], bool], *,
                      interval: float = GANG_REFRESH_SECONDS) -> None:
    """As leader, count the members of gangs that changed and write their PodGroups' status (`refresh_gangs`)."""
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = PODGROUP_API

    async def list_members(namespace: str, selector: str) -> list[Json]:
        body = await request_json(core.list_namespaced_pod, namespace, label_selector=selector,
                                  _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
        return list(body.get("items") or [])

    async def write_status(key: GangKey, status: Json) -> None:
        await request_json(custom.patch_namespaced_custom_object_status, group, version, key.namespace, plural,
                           key.name, {"status": status}, _content_type="application/merge-patch+json",
                           _request_timeout=STATUS_TIMEOUT_SECONDS * 2)

    while True:
        await asyncio.sleep(interval)
        if not is_leader():
            dispatcher.prune_gangs(older_than=GANG_FOLLOWER_MEMORY_SECONDS)
        elif dispatcher.gangs.dirty:
            await dispatcher.refresh_gangs(list_members, write_status)
