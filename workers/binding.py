"""Posting a worker's bindings, and what their answers mean.

A binding carries the pod's uid and resourceVersion (metadata.uid, metadata.resourceVersion: the apiserver binds
only the pod at the version the reservation was made for) and goes in one of the webhook's lanes; the resolver's
webhook checks it against the pod's reservation. At most ``BindLimit.limit`` bindings are in flight at once
(`workers.bindlimit`). A binding that fails releases the pod's reservation, but only while it is still assumed:
one the webhook admitted stays (the binding may have happened after all); the resolver's sync checks it at once
only when the answer proves the write failed (a 4xx), else once the write is surely over. A success records
kube-scheduler's Normal ``Scheduled`` event off the binding path.

The dispatcher sends no new version of a pod whose status alone changed (`hoss.model.compact`: the PodScheduled=False
condition this worker wrote, a nomination), so a work item may name a resourceVersion the pod has moved on from. A
binding refused for that precondition reads the pod once and, when it is the pod the item describes but for its
resourceVersion (`compact.same_but_version`: the requests the reservation holds among the rest), is posted again,
once, at the version read. A pod that changed in what scheduling reads is out of date: its new version comes from
the dispatcher.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

import aiohttp

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.pod import PodView
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.model import compact
from hoss.model.admission import lane_of
from hoss.model.objects import Json
from workers.bindlimit import BindLimit
from workers.metrics import Tally
from workers.notices import Notices

log = logging.getLogger(__name__)

VERSION_PRECONDITION = "Precondition failed: ResourceVersion"
"""How the apiserver's refusal of a write whose resourceVersion precondition no longer holds begins
(k8s.io/apiserver storage.Preconditions.Check), inside its 409 Conflict."""


class Outcome(NamedTuple):
    """A binding's outcome."""

    bound: bool
    status: int | None
    """The HTTP status of the answer (None: no answer)."""
    changed: bool = False
    """Refused because the pod changed since the version the binding named (its work item is out of date)."""


Verdict = Literal["bound", "gone", "changed", "retry soon", "retry"]


def verdict(outcomes: Sequence[Outcome], *, gang: bool) -> Verdict:
    """What a work item's binding outcomes mean for it: every pod bound; its one pod gone (404); a pod changed since
    the item was made ("changed": the item is out of date, the dispatcher sends the pod as it is now); else it is
    tried again, soon when a binding lost a race (409)."""
    if all(outcome.bound for outcome in outcomes):
        return "bound"
    if not gang and outcomes[0].status == 404:
        return "gone"
    if any(outcome.changed for outcome in outcomes):
        return "changed"
    return "retry soon" if any(outcome.status == 409 for outcome in outcomes) else "retry"


def version_changed(error: KubeError) -> bool:
    """Whether the apiserver refused a binding because the pod is no longer at the version the binding named."""
    return error.status == 409 and VERSION_PRECONDITION in str(error)


def proves_failure(status: int | None) -> bool:
    """Whether an error answer to a binding proves the apiserver will not write it: a 4xx (refused: by a webhook,
    a conflict, a precondition, the pod gone, too many requests), but 408. A 5xx or a timeout does not: the
    apiserver, or a proxy before it, may answer while the write still goes through (a 504 that says it may still be
    processing, a 500 from an etcd timeout)."""
    return status is not None and 400 <= status < 500 and status != 408


class Binder(Protocol):
    """Posts one binding; raises `KubeError` (with the HTTP status) when the apiserver refuses it."""

    async def bind(self, pod: PodView, node: str) -> None: ...


class PodReader(Protocol):
    """Reads one pod as the apiserver has it (`KubeREST.get_pod`); raises `KubeError` when it answers an error."""

    async def get_pod(self, namespace: str, name: str) -> Json: ...


class RestBinder:
    """Bindings through the lean client: one keep-alive session, protobuf bodies, metadata.uid and
    metadata.resourceVersion set (the apiserver binds the pod only at the version its work item carried, so with
    the requests its reservation holds), and the webhook lanes taken in turn (`hoss.model.admission.lane_of`)."""

    def __init__(self, rest: KubeREST) -> None:
        self.rest = rest
        self.posted = 0

    async def bind(self, pod: PodView, node: str) -> None:
        self.posted += 1
        await self.rest.create_binding(pod.namespace, pod.name, pod.uid, node, lane=lane_of(self.posted),
                                       resource_version=pod.resource_version)


class Bindings:
    """One worker's bindings: posted through `binder` within `limit`, counted in `tally`, told through `notices`
    (``Scheduled`` events only when `scheduled_events`); `default_policy` counts pods that name none; `reader`
    reads a pod whose binding named a resourceVersion it moved on from (None: such a binding is out of date)."""

    def __init__(self, binder: Binder, ledger: Ledger, *, limit: BindLimit, tally: Tally, notices: Notices,
                 scheduled_events: bool, default_policy: str, reader: PodReader | None = None) -> None:
        self.binder = binder
        self.ledger = ledger
        self.reader = reader
        self.limit = limit
        self.tally = tally
        self.notices = notices
        self.scheduled_events = scheduled_events
        self.default_policy = default_policy
        self.in_flight = 0

    async def bind(self, pod: PodView, node: str, *, form: Json | None = None) -> Outcome:
        """Post one binding; on refusal release the reservation (only while it is still assumed). `form` is the
        pod's compact form in the work item, against which a pod that moved on from the binding's version is read
        (see the module docstring)."""
        async with self.limit:
            self.in_flight += 1
            try:
                return await self._post(pod, node, form)
            except Exception:  # whatever a binder raises, the pod is tried again, not lost
                self.tally.count("errors")
                log.exception("binding %s to %s failed unexpectedly", pod.key, node)
                await self.unreserve(pod, node)
                return Outcome(False, None)
            finally:
                self.in_flight -= 1

    async def _post(self, pod: PodView, node: str, form: Json | None) -> Outcome:
        try:
            await self.binder.bind(pod, node)
        except KubeError as error:
            if version_changed(error) and form is not None and self.reader is not None:
                return await self._rebind(pod, node, form)
            return await self._refused(pod, node, error, changed=True)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return await self._unanswered(pod, node, error)
        return self._bound(pod, node)

    async def _rebind(self, pod: PodView, node: str, form: Json) -> Outcome:
        """The pod moved on from the version the binding named: read it once. The same pod but for its version is
        posted again, once, at the version read; else the item is out of date, the pod gone, or (not read) tried
        again. The room stays reserved meanwhile (the webhook admits the pod again on the node of its entry)."""
        found = await self._current(pod, form)
        if isinstance(found, Outcome):
            await self.unreserve(pod, node, answered=True)  # the 409 proved that the binding was not written
            if found.changed:
                self.tally.count("stale")
                log.info("binding %s to %s: the pod changed since its work item was made", pod.key, node)
            return found
        try:
            await self.binder.bind(found, node)
        except KubeError as error:
            # Refused for its version again: the pod is being written, its item is good (tried again soon).
            return await self._refused(found, node, error, changed=False)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return await self._unanswered(found, node, error)
        return self._bound(found, node)

    async def _refused(self, pod: PodView, node: str, error: KubeError, *, changed: bool) -> Outcome:
        """The apiserver refused the binding: release the room, and say so unless the pod's version was the cause
        (`changed`: its item is out of date)."""
        await self.unreserve(pod, node, answered=proves_failure(error.status))
        if version_changed(error):
            # Not a refusal the pod's owner needs to hear of: the pod changed since its work item was made (a
            # label, a resize), and the dispatcher sends it as it is now.
            self.tally.count("stale")
            log.info("binding %s to %s: the pod changed since its work item was made", pod.key, node)
            return Outcome(False, error.status, changed=changed)
        self.tally.count("denied")
        log.info("binding %s to %s refused (%s): %s", pod.key, node, error.status, error)
        self.notices.refused(pod, node, error)
        return Outcome(False, error.status)

    async def _unanswered(self, pod: PodView, node: str, error: Exception) -> Outcome:
        log.warning("binding %s to %s failed: %s", pod.key, node, error)
        await self.unreserve(pod, node)
        return Outcome(False, None)

    def _bound(self, pod: PodView, node: str) -> Outcome:
        self.tally.count("bound")
        self.tally.bound_by(pod.policy or self.default_policy)
        if self.scheduled_events:
            self.notices.scheduled(pod, node)
        return Outcome(True, 200)

    async def _current(self, pod: PodView, form: Json) -> PodView | Outcome:
        """The pod's view at the resourceVersion it has now, when it is the pod `form` describes but for that
        version; else the binding's outcome: out of date (it changed), gone (404), or tried again (no answer)."""
        assert self.reader is not None
        try:
            raw = await self.reader.get_pod(pod.namespace, pod.name)
        except KubeError as error:
            if error.status == 404:
                return Outcome(False, 404)
            log.warning("binding %s: cannot read the pod again: %s", pod.key, error)
            return Outcome(False, None)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("binding %s: cannot read the pod again: %s", pod.key, error)
            return Outcome(False, None)
        version = (raw.get("metadata") or {}).get("resourceVersion")
        if not compact.same_but_version(form, raw) or not isinstance(version, str) or not version:
            return Outcome(False, 409, changed=True)
        log.info("binding %s: only its resourceVersion moved on (%s -> %s): binding it at that one", pod.key,
                 pod.resource_version, version)
        return dataclasses.replace(pod, resource_version=version)

    async def unreserve(self, pod: PodView, node: str, *, answered: bool = False) -> None:
        """Drop the reservation of a binding that failed. One the webhook admitted stays (the binding may have
        happened after all); `answered` (an answer that proves the write is over, `proves_failure`) asks the
        resolver's sync to check it at once, else it waits for the sync's check after its write timeout."""
        try:
            # The release's change-stream entry gives the room back to this worker's table, as to every other.
            await self.ledger.release_assumed(uid=pod.uid, node=node, answered=answered)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("cannot release the reservation of %s on %s (it expires by itself): %s", pod.key, node, error)
