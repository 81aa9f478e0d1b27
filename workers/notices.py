"""Telling a pod's owner what the worker did with it, off the scheduling path: FailedScheduling events and
PodScheduled=False on a pod it could not place, kube-scheduler's Normal ``Scheduled`` event on a bound pod, and for
a Koordinator Reservation its events and status.

A pod's failure is told once per message (a pod retried for the same reason gets no new event); the messages are
forgotten when the pod is placed. Without an apiserver client nothing is written. Writes are best effort: a failed
one is logged by the call that makes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from hoss.framework.pod import PodView
from hoss.kube.client import KubeError
from hoss.kube.events import EventSink, pod_event, reservation_event, scheduled_event, set_unschedulable
from hoss.kube.rest import KubeREST
from hoss.ledger.results import QuotaExceeded
from hoss.model import reservations
from hoss.model.objects import Json
from hoss.queue import GangMember
from workers.intake import Work, members_of
from workers.reservations import reservation_name, write_status

log = logging.getLogger(__name__)

CLOSE_SECONDS = 5.0
"""How long stopping waits for the writes still going."""


def quota_message(refusal: QuotaExceeded) -> str:
    """The FailedScheduling message of a pod its namespace's elastic quota refuses."""
    return f"{refusal}."


def failure_message(error: Exception) -> str:
    """The FailedScheduling message of a pod whose processing raised (e.g. a plugin bug)."""
    return f"hoss failed while scheduling this pod: {type(error).__name__}: {error}"


class Notices:
    """What one worker writes to the apiserver beside bindings; `component` signs its events."""

    def __init__(self, rest: KubeREST | None, events: EventSink | None, *, component: str) -> None:
        self.rest = rest
        self.events = events
        self.component = component
        self.last_message: dict[str, str] = {}
        """pod uid -> the failure last told on it"""
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        if self.events is not None:
            self.events.start()

    async def close(self) -> None:
        """Let the writes still going finish (for a while), then the event sink."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_SECONDS)
        if self.events is not None:
            await self.events.close(timeout=CLOSE_SECONDS)

    def record(self, event: Json) -> None:
        if self.events is not None:
            self.events.record(event)

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a best-effort apiserver write (a condition, a status) without holding up scheduling."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def placed(self, uids: list[str]) -> None:
        """These pods are placed: a later failure is told again."""
        for uid in uids:
            self.last_message.pop(uid, None)

    def unschedulable(self, work: Work, message: str) -> None:
        """The item fits nowhere (now): a Reservation gets the message in its status and an event, each pod an
        event and PodScheduled=False."""
        if name := reservation_name(work.raw):
            if self._new(work.item.uid, message):
                self.background(self._reservation_status(name, reservations.unschedulable_status(message)))
                self.record(reservation_event(name, work.item.uid, reason="FailedScheduling", message=message,
                                              component=self.component, warning=True))
            return
        self._tell_pods(members_of(work.item), message, reason="Unschedulable")

    def malformed(self, work: Work) -> None:
        """The item's pod cannot be parsed: say why on it (once: the item is acknowledged)."""
        item = work.item
        log.warning("pod %s is malformed: %s", item.key, work.problem)
        self.record(pod_event(namespace=item.namespace, name=item.name, uid=item.uid, reason="FailedScheduling",
                              message=work.problem, component=self.component))
        self._condition(item.namespace, item.name, work.problem, reason="InvalidPod")

    def failed(self, work: Work, error: Exception) -> None:
        """Processing the item raised: log it and say so on its pods, once per pod and message."""
        item = work.item
        message = failure_message(error)
        if self.last_message.get(item.uid) != message:  # logged once per pod and reason, like the event
            log.error("pod %s: %s (retried with backoff)", item.key, message,
                      exc_info=(type(error), error, error.__traceback__))
        self._tell_pods(members_of(item), message, reason="SchedulerError")

    def refused(self, pod: PodView, node: str, error: KubeError) -> None:
        """The apiserver refused the pod's binding (a pod that is gone, 404, gets no event)."""
        if error.status != 404:
            self.record(pod_event(namespace=pod.namespace, name=pod.name, uid=pod.uid, reason="FailedScheduling",
                                  message=f"binding to {node} refused: {error}", component=self.component))

    def scheduled(self, pod: PodView, node: str) -> None:
        self.record(scheduled_event(namespace=pod.namespace, name=pod.name, uid=pod.uid, node=node,
                                    component=self.component))

    def reservation_placed(self, name: str, uid: str, node: str) -> None:
        self.last_message.pop(uid, None)
        self.record(reservation_event(name, uid, reason="Scheduled", message=f"Reservation {name} placed on {node}",
                                      component=self.component, warning=False))

    def reservation_used(self, name: str, pod: PodView, node: str) -> None:
        """The pod is bound where it took the Reservation's room: the Reservation succeeded, the pod its owner."""
        owner = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        self.background(self._reservation_status(name, reservations.succeeded_status(node, owner)))

    def _new(self, uid: str, message: str) -> bool:
        """Whether `message` is news for pod `uid` (then it is remembered as told)."""
        if self.last_message.get(uid) == message:
            return False
        self.last_message[uid] = message
        return True

    def _tell_pods(self, members: list[GangMember], message: str, *, reason: str) -> None:
        for member in members:
            if self._new(member.uid, message):
                self._condition(member.namespace, member.name, message, reason=reason)
                self.record(pod_event(namespace=member.namespace, name=member.name, uid=member.uid,
                                      reason="FailedScheduling", message=message, component=self.component))

    def _condition(self, namespace: str, name: str, message: str, *, reason: str) -> None:
        if self.rest is not None:
            self.background(set_unschedulable(self.rest, namespace=namespace, name=name, message=message,
                                              reason=reason))

    async def _reservation_status(self, name: str, patch: Json) -> None:
        await write_status(self.rest, name, patch)
