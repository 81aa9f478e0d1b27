"""Telling a waiting or failed pod's owner why: a Warning event and PodScheduled=False on the pod, or, for a
Koordinator Reservation, a Warning event on it and a Scheduled=False condition in its status. Best effort: a
notice that cannot be written is logged and tried again on a later round.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client

from dispatcher.intake import PendingPod
from hoss.kube.client import KubeError, request_json
from hoss.kube.events import pod_event, post_event, reservation_event, set_unschedulable, unschedulable_condition
from hoss.kube.rest import STRATEGIC_MERGE_PATCH
from hoss.model import reservations
from hoss.model.objects import Json

log = logging.getLogger(__name__)

COMPONENT = "hoss-dispatcher"
STATUS_TIMEOUT_SECONDS = 5.0


async def write_reservation_status(api: Any, name: str, patch: Json, *, what: str) -> bool:
    """Merge-patch a Reservation's status; False (logged, naming ``what`` was written) when the apiserver refused
    it."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = reservations.API
    try:
        await request_json(custom.patch_cluster_custom_object_status, group, version, plural, name, patch,
                           _content_type="application/merge-patch+json", _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
    except KubeError as error:
        log.warning("cannot write %s of Reservation %s: %s", what, name, error)
        return False
    return True


class Notifier(Protocol):
    """Tells a pod's owner why it waits, or why it failed."""

    async def waiting(self, pod: PendingPod, *, reason: str, message: str) -> None: ...

    async def failed(self, pod: PendingPod, *, reason: str, message: str) -> bool:
        """Set the pod's phase Failed with the reason; False when that could not be written."""
        ...


class KubeNotifier:
    """A Warning event and PodScheduled=False, as ``kubectl describe pod`` shows them; for a Reservation, a Warning
    event on it and a Scheduled=False condition in its status. Best effort."""

    def __init__(self, core: Any) -> None:
        self.core = core

    async def waiting(self, pod: PendingPod, *, reason: str, message: str) -> None:
        name = pod.annotations.get(reservations.ANNOTATION)
        if name:
            await post_event(self.core, reservation_event(name, pod.uid, reason=reason, message=message,
                                                           component=COMPONENT, warning=True))
            await write_reservation_status(self.core.api_client, name, reservations.no_worker_status(message),
                                           what="the status")
            return
        event = pod_event(
            namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=reason, message=message,
            component=COMPONENT,
        )
        await post_event(self.core, event)
        await set_unschedulable(self.core, namespace=pod.namespace, name=pod.name, message=message, reason=reason)

    async def failed(self, pod: PendingPod, *, reason: str, message: str) -> bool:
        """status.phase Failed with the reason and message (and PodScheduled=False), then a Warning event."""
        patch = unschedulable_condition(message, reason=reason)
        patch["status"].update({"phase": "Failed", "reason": reason, "message": message[:1024]})
        try:
            await request_json(self.core.patch_namespaced_pod_status, pod.name, pod.namespace, patch,
                               _content_type=STRATEGIC_MERGE_PATCH)
        except KubeError as error:
            if error.status != 404:  # gone already: nothing to fail
                log.warning("cannot fail pod %s: %s", pod.key, error)
                return False
            return True
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot fail pod %s: %s", pod.key, error)
            return False
        await post_event(self.core, pod_event(namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=reason,
                                              message=message, component=COMPONENT))
        return True
