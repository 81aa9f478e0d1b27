"""Kubernetes Events and pod conditions that explain scheduling, as ``kubectl describe pod`` shows them.

Building the bodies is pure; posting them is one call each. Posting is best effort: a failure is logged and
never stops scheduling.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from typing import Any

import aiohttp

from resolver.kube import KubeError, request_json

log = logging.getLogger(__name__)

Json = dict[str, Any]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_event(
    *, namespace: str, name: str, uid: str, reason: str, message: str, component: str, warning: bool = True
) -> Json:
    """A core/v1 Event about a pod."""
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def unschedulable_condition(message: str, *, reason: str = "Unschedulable") -> Json:
    """A strategic-merge patch for pods/status setting PodScheduled=False with the reason."""
    return {
        "status": {
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": reason,
                    "message": message[:1024],
                    "lastTransitionTime": _now(),
                }
            ]
        }
    }


async def post_event(core: Any, event: Json) -> None:
    try:
        await request_json(core.create_namespaced_event, event["metadata"]["namespace"], event)
    except (KubeError, aiohttp.ClientError, OSError) as error:
        log.warning("cannot record event %s on %s: %s", event["reason"], event["involvedObject"]["name"], error)


async def set_unschedulable(
    core: Any, *, namespace: str, name: str, message: str, reason: str = "Unschedulable"
) -> None:
    try:
        await request_json(
            core.patch_namespaced_pod_status, name, namespace, unschedulable_condition(message, reason=reason),
            _content_type="application/strategic-merge-patch+json",
        )
    except (KubeError, aiohttp.ClientError, OSError) as error:
        log.warning("cannot set PodScheduled=False on %s/%s: %s", namespace, name, error)
