"""PodGroups of the three APIs that define gangs -- scheduler-plugins (scheduling.x-k8s.io/v1alpha1), Kubernetes
1.36 (scheduling.k8s.io/v1alpha2) and Volcano (scheduling.volcano.sh/v1beta1): mirror them (dispatcher/gangs.py,
dispatcher/podgroup_specs.py; scheduler-plugins' phase also serves pods that depend on them, see
dispatcher/dependencies.py); as leader, count gang members and write each PodGroup's status, with an event on the
group when it changes (dispatcher/podgroup_status.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from dispatcher import dependencies
from dispatcher.core import Dispatcher
from dispatcher.gangs import PLUGINS_API, VOLCANO_API, WORKLOAD_API, GangKey, PodGroupSpec, parse_podgroup
from dispatcher.notices import COMPONENT, STATUS_TIMEOUT_SECONDS
from dispatcher.podgroup_specs import (
    VOLCANO_PODGROUP_API,
    WORKLOAD_PODGROUP_API,
    parse_volcano_podgroup,
    parse_workload_podgroup,
)
from dispatcher.podgroup_status import StatusChange
from hoss.kube.client import InformerHandlers, request_json, run_crd_informer
from hoss.kube.events import podgroup_event, post_event
from hoss.model.objects import Json

log = logging.getLogger(__name__)

GANG_REFRESH_SECONDS = 2.0
GANG_FOLLOWER_MEMORY_SECONDS = 600.0
"""A follower forgets a changed gang with no pending member after this long (it counts what it knows on takeover)."""

PODGROUP_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
APIS: dict[str, tuple[str, str, str]] = {PLUGINS_API: PODGROUP_API, WORKLOAD_API: WORKLOAD_PODGROUP_API,
                                         VOLCANO_API: VOLCANO_PODGROUP_API}
Parser = Callable[[Json], "tuple[GangKey, PodGroupSpec] | None"]


def _where(group: Json) -> tuple[str, str]:
    metadata = group.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _mirror(dispatcher: Dispatcher, api: str, parsed: list[tuple[GangKey, PodGroupSpec]]) -> None:
    """Replace the mirrored PodGroups of one API with ``parsed`` (a fresh list)."""
    for key in [k for k in dispatcher.podgroups if k.api == api]:
        dispatcher.podgroups.pop(key)
    dispatcher.podgroups.update(parsed)


def _note_refusal(key: GangKey, spec: PodGroupSpec) -> None:
    if spec.refusal:
        log.warning("PodGroup %s (%s) refused: %s", key, key.api, spec.refusal)


async def _watch_gang_objects(api: client.ApiClient, dispatcher: Dispatcher, *, group_api: str, parse: Parser,
                              recheck_seconds: float, found: str) -> None:
    """Mirror the PodGroups of one API (Kubernetes' and Volcano's) when it is served."""
    custom: Any = client.CustomObjectsApi(api)
    call = functools.partial(custom.list_cluster_custom_object, *APIS[group_api])

    async def on_list(items: list[Json]) -> None:
        parsed = [p for p in map(parse, items) if p is not None]
        for key, spec in parsed:
            _note_refusal(key, spec)
        _mirror(dispatcher, group_api, parsed)
        dispatcher.wake()

    async def on_event(kind: str, obj: Json) -> None:
        parsed = parse(obj)
        if parsed is None:
            return
        if kind == "DELETED":
            dispatcher.podgroups.pop(parsed[0], None)
            dispatcher.gangs.forget(parsed[0])
        else:
            before = dispatcher.podgroups.get(parsed[0])
            if before is None or before.refusal != parsed[1].refusal:
                _note_refusal(*parsed)
            dispatcher.podgroups[parsed[0]] = parsed[1]
        dispatcher.wake()

    group, version, _plural = APIS[group_api]
    await run_crd_informer(f"podgroups-{group}", call, InformerHandlers(on_list=on_list, on_event=on_event),
                           kind=f"PodGroups ({group}/{version})", recheck_seconds=recheck_seconds, found=found)


async def watch_workload_podgroups(api: client.ApiClient, dispatcher: Dispatcher, *,
                                   recheck_seconds: float = 60.0) -> None:
    """Kubernetes' own PodGroups (served by an apiserver with the GenericWorkload feature and the
    scheduling.k8s.io/v1alpha2 API on), named by pods' spec.schedulingGroup."""
    await _watch_gang_objects(api, dispatcher, group_api=WORKLOAD_API, parse=parse_workload_podgroup,
                              recheck_seconds=recheck_seconds,
                              found="scheduling.k8s.io/v1alpha2 PodGroups served: gangs may name one by "
                                    "spec.schedulingGroup")


async def watch_volcano_podgroups(api: client.ApiClient, dispatcher: Dispatcher, *,
                                  recheck_seconds: float = 60.0) -> None:
    """Volcano's PodGroups, named by the annotation scheduling.k8s.io/group-name."""
    await _watch_gang_objects(api, dispatcher, group_api=VOLCANO_API, parse=parse_volcano_podgroup,
                              recheck_seconds=recheck_seconds,
                              found="Volcano PodGroup CRD found: gangs may name one (scheduling.k8s.io/group-name)")


async def watch_podgroups(api: client.ApiClient, dispatcher: Dispatcher, *, recheck_seconds: float = 60.0) -> None:
    """Mirror scheduler-plugins PodGroups (minMember, scheduleTimeoutSeconds) when the CRD is installed; check
    again now and then when it is not, so installing it later works without a restart."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = PODGROUP_API
    call = functools.partial(custom.list_cluster_custom_object, group, version, plural)

    async def on_list(items: list[Json]) -> None:
        parsed = [p for p in map(parse_podgroup, items) if p is not None]
        for key, spec in parsed:
            _note_refusal(key, spec)
        _mirror(dispatcher, PLUGINS_API, parsed)
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
            dispatcher.gangs.forget(parsed[0])
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

    async def list_members(namespace: str, selector: str) -> list[Json]:
        body = await request_json(core.list_namespaced_pod, namespace, label_selector=selector,
                                  _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
        return list(body.get("items") or [])

    async def write_status(key: GangKey, group: PodGroupSpec, change: StatusChange) -> None:
        api_group, version, plural = APIS[key.api]
        await request_json(custom.patch_namespaced_custom_object_status, api_group, version, key.namespace, plural,
                           key.name, {"status": change.status}, _content_type="application/merge-patch+json",
                           _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
        log.info("%s", change.message)
        await post_event(core, podgroup_event(key.namespace, key.name, group.uid, api_version=f"{api_group}/{version}",
                                              reason=change.reason, message=change.message, component=COMPONENT))

    while True:
        await asyncio.sleep(interval)
        if not is_leader():
            dispatcher.prune_gangs(older_than=GANG_FOLLOWER_MEMORY_SECONDS)
        elif dispatcher.gangs.dirty or dispatcher.podgroups:
            await dispatcher.refresh_gangs(list_members, write_status)
