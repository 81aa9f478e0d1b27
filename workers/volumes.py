"""PreBind of a pod's claims that wait for their first consumer: kube-scheduler's VolumeBinding PreBind.

Once the pod's room is reserved on a node, and before its Binding is posted, each such claim gets what
`hoss.framework.plugins.volumes.plan` chose for that node:

- a static PV: the PV's claimRef is set to the claim (with the annotation ``pv.kubernetes.io/bound-by-controller``,
  as kube-scheduler's binder writes it) in one update whose metadata.resourceVersion is the version the decision
  read; the persistentvolume-binder controller then binds the claim to it;
- provisioning: the annotation ``volume.kubernetes.io/selected-node`` is set on the claim (an update at the
  claim's current version, refused when another node was named meanwhile); its provisioner then creates a PV.

Then the claims are read until each is fully bound (spec.volumeName and ``pv.kubernetes.io/bind-completed``) to a
PV whose node affinity allows the node. Any failure -- a PV or claim changed since the decision (the apiserver's
409: another worker's pod took the PV), a claimRef reset, the selected-node annotation removed (the provisioner
gave up), a claim bound to a PV the node cannot use, the timeout -- answers the message the pod is retried with,
and its room is released. As kube-scheduler, it undoes nothing it wrote: a provisioner removes the annotation
when it gives up, and a PV claimed for a pod that went elsewhere is left to the persistentvolume-binder (which
binds the claim to it, or frees it when the claim is bound to another PV).

A ReadWriteOncePod claim is promised to the pod in the ledger before its room is reserved (`promise`,
``promise_claims.lua``: one atomic call, all of the pod's such claims or none, for the length of the reservation
and the binding): of two workers that decided pods using one such claim at the same instant, the second finds it
promised and its pod waits (backing off) without reserving; once the pod is bound, its ledger entry names the
claim and VolumeRestrictions keeps other pods off it, and the promise is cut short. A failure gives it back. The
same holds, on the chosen node, for the CSI attach slots its volumes take (``promise_attach.lua``: the handles
counted there, those promised to other pods and its own, each once, within the driver's limit; NodeVolumeLimits)
and for its in-tree disks (``promise_disks.lua``: VolumeRestrictions' disk conflicts).

Why two workers never promise one PV twice: the apiserver decides. A PV's claimRef is written only by an update
at the version the decision read, so of two workers that chose one PV only the first write succeeds; the other
gets 409 and its pod is decided again once the dispatcher's watch brings the PV as claimed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.volumes import DISK_CONFLICT, MAX_VOLUME_COUNT, attached_on, plan, terms_match
from hoss.framework.pod import DelayedClaim, PodView, VolumeOption, volume_terms
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST, segment
from hoss.ledger.arguments import AttachSlots
from hoss.ledger.client import Ledger
from hoss.model.objects import Json, section
from hoss.model.storage import BIND_COMPLETED, BOUND_BY_CONTROLLER, SELECTED_NODE

log = logging.getLogger(__name__)

PREBIND = 'running PreBind plugin "VolumeBinding": binding volumes: '
"""How a PreBind failure's message begins (kube-scheduler's words)."""


class PreBindFailed(Exception):
    """The pod's claims could not be bound for the chosen node; the message says why."""


def needs_prebind(pod: PodView) -> bool:
    """Whether the pod has claims to bind, or ReadWriteOncePod claims or attach slots to promise, before its own
    binding."""
    return bool(pod.disks) or (pod.storage is not None
                               and bool(pod.storage.delayed or pod.storage.once or pod.storage.attach))


def attach_slots(pod: PodView, node: str, nodes: NodeTable) -> list[AttachSlots]:
    """Per CSI driver `node` limits, the slots the pod's volumes take there (`promise_attach.lua`)."""
    attach = pod.storage.attach if pod.storage is not None else None
    if attach is None or node not in nodes:
        return []
    attached = attach.counted(node, attached_on(pod, node, nodes))
    return [AttachSlots(driver=driver, limit=attach.limits[driver][node],
                        attached=tuple(sorted(attached.get(driver, ()))),
                        handles=tuple(sorted(handle for own, handle in attach.volumes if own == driver)))
            for driver in sorted({driver for driver, _handle in attach.volumes})
            if node in attach.limits.get(driver, {})]


class VolumeBinder:
    """Promises a pod's ReadWriteOncePod claims in the `ledger` (for `promise_seconds` beyond the wait), binds its
    waiting claims for its chosen node through `rest`, then waits (at most `timeout_seconds`, reading every
    `poll_seconds`) for them to be bound."""

    def __init__(self, rest: KubeREST, ledger: Ledger, *, timeout_seconds: float, promise_seconds: float,
                 poll_seconds: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.rest = rest
        self.ledger = ledger
        self.promise_seconds = promise_seconds
        self.timeout_seconds = timeout_seconds
        self.poll_seconds = poll_seconds
        self.clock = clock

    async def prebind(self, pod: PodView, node: str, nodes: NodeTable) -> str | None:
        """None when the pod's claims are bound for `node`; else the message to retry the pod with."""
        if not needs_prebind(pod):
            return None
        if node not in nodes:
            return f"{PREBIND}node {node!r} is no longer known"
        row = nodes.row(node)
        # promised before the reservation already (`promise`, for single pods): again here, which keeps a promise
        # to this pod, and covers gang members
        message = await self.promise(pod, node=node, nodes=nodes)
        if message is not None:
            return message
        message = await self._bind_claims(pod, node, nodes, row) if pod.storage and pod.storage.delayed else None
        if message is not None:
            await self.unpromise(pod, node=node)
        return message

    def _once(self, pod: PodView) -> list[str]:
        return [f"{pod.namespace}/{claim}" for claim in (pod.storage.once if pod.storage is not None else ())]

    async def promise(self, pod: PodView, *, node: str, nodes: NodeTable, seconds: float | None = None) -> str | None:
        """Promise the pod its ReadWriteOncePod claims and its volumes' attach slots on `node` in the ledger, before
        its room is reserved (for the reservation and the claims' binding, or `seconds`); None when promised (or it
        has none), else why not (its RWOP promises are given back when the slots are not)."""
        once = self._once(pod)
        slots = attach_slots(pod, node, nodes)
        if not once and not slots and not pod.disks:
            return None
        if seconds is None:
            seconds = self.promise_seconds + (self.timeout_seconds if pod.storage and pod.storage.delayed else 0)
        try:
            taken = await self.ledger.promise_claims(uid=pod.uid, claims=once, ttl_seconds=seconds) if once else None
            if taken is not None:
                log.info("pod %s: claim %s is promised to pod %s", pod.key, *taken)
                return (f"persistentvolumeclaim {taken[0]!r} with ReadWriteOncePod access mode is being bound for "
                        f"another pod")
            disk = await self.ledger.promise_disks(
                uid=pod.uid, node=node, disks=[(d.kind, d.id, d.read_only) for d in pod.disks],
                ttl_seconds=seconds) if pod.disks else None
            full = await self.ledger.promise_attach(uid=pod.uid, node=node, drivers=slots, ttl_seconds=seconds) \
                if slots and disk is None else None
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            return f"cannot promise its volumes: {error}"
        if disk is None and full is None:
            return None
        await self.unpromise(pod, node=node)
        if disk is not None:
            log.info("pod %s: disk %s on %s is promised to pod %s", pod.key, disk[0], node, disk[1])
            return f"{DISK_CONFLICT}: disk {disk[0]} on node {node!r} is being bound for another pod"
        assert full is not None
        log.info("pod %s: node %s would count %d volumes of %s, over its limit %d, with the slots promised to "
                 "other pods", pod.key, node, full[1], full[0], full[2])
        return (f"{MAX_VOLUME_COUNT}: node {node!r} would have {full[1]} volumes of {full[0]} (limit {full[2]}) with "
                f"those being bound for other pods")

    async def unpromise(self, pod: PodView, *, node: str) -> None:
        """Give the pod's promises back (its binding failed)."""
        try:
            if self._once(pod):
                await self.ledger.unpromise_claims(uid=pod.uid, claims=self._once(pod))
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("pod %s: its claims' promises expire by themselves: %s", pod.key, error)
        await self.give_back_slots(pod, node=node)

    async def give_back_slots(self, pod: PodView, *, node: str) -> None:
        """Give back the attach slots and disks promised to the pod on `node` (it was not reserved or bound there)."""
        try:
            if pod.disks:
                await self.ledger.unpromise_disks(uid=pod.uid, node=node)
            if pod.storage is not None and pod.storage.attach is not None:
                drivers = sorted({driver for driver, _handle in pod.storage.attach.volumes})
                await self.ledger.unpromise_attach(uid=pod.uid, node=node, drivers=drivers)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("pod %s: its attach slots and disks on %s expire by themselves: %s", pod.key, node, error)

    async def _bind_claims(self, pod: PodView, node: str, nodes: NodeTable, row: int) -> str | None:
        assert pod.storage is not None
        chosen = plan(pod.storage, nodes)
        provisioned: set[str] = set()
        try:
            for claim in pod.storage.delayed:
                choice = chosen.choices.get(claim.claim)
                index = int(choice[row]) if choice is not None else -1
                if index >= 0:
                    await self._claim_volume(pod, claim, claim.volumes[index])
                else:
                    await self._select_node(pod, claim, node)
                    provisioned.add(claim.claim)
            await self._wait_bound(pod, node, nodes, provisioned)
        except PreBindFailed as error:
            log.info("pod %s: its volumes were not bound for %s: %s", pod.key, node, error)
            return f"{PREBIND}{error}"
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("pod %s: binding its volumes for %s failed: %s", pod.key, node, error)
            return f"{PREBIND}{error}"
        return None

    def _claim_path(self, namespace: str, name: str) -> str:
        return f"/api/v1/namespaces/{segment(namespace)}/persistentvolumeclaims/{segment(name)}"

    async def _claim_volume(self, pod: PodView, claim: DelayedClaim, option: VolumeOption) -> None:
        """Set the PV's claimRef to the claim, at the PV's version the decision read."""
        path = f"/api/v1/persistentvolumes/{segment(option.name)}"
        pv = await self.rest.request("GET", path)
        metadata = section(pv, "metadata")
        spec = section(pv, "spec")
        ref = section(spec, "claimRef")
        if ref and (ref.get("name") != claim.claim or ref.get("namespace") != pod.namespace
                    or (ref.get("uid") and ref.get("uid") != claim.uid)):
            raise PreBindFailed(f"persistentvolume {option.name!r} was bound to another claim meanwhile")
        if option.version and metadata.get("resourceVersion") != option.version:
            raise PreBindFailed(f"persistentvolume {option.name!r} changed since the pod was scheduled")
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": pod.namespace,
                            "name": claim.claim, "uid": claim.uid, "resourceVersion": claim.version}
        metadata.setdefault("annotations", {})[BOUND_BY_CONTROLLER] = "yes"
        pv["spec"], pv["metadata"] = spec, metadata
        try:
            await self.rest.request("PUT", path, body=pv)
        except KubeError as error:
            if error.status == 409:
                raise PreBindFailed(f"persistentvolume {option.name!r} was taken meanwhile: {error}") from error
            raise
        log.info("pod %s: persistentvolume %s claimed for %s/%s", pod.key, option.name, pod.namespace, claim.claim)

    async def _select_node(self, pod: PodView, claim: DelayedClaim, node: str) -> None:
        """Name `node` on the claim for its provisioner (unless it names it already)."""
        path = self._claim_path(pod.namespace, claim.claim)
        raw = await self.rest.request("GET", path)
        metadata = section(raw, "metadata")
        if claim.uid and metadata.get("uid") != claim.uid:
            raise PreBindFailed(f"persistentvolumeclaim {claim.claim!r} was replaced")
        annotations = section(metadata, "annotations")
        selected = annotations.get(SELECTED_NODE)
        if selected == node or section(raw, "spec").get("volumeName"):
            return
        if selected:
            raise PreBindFailed(f"persistentvolumeclaim {claim.claim!r} was given to node {selected!r} meanwhile")
        annotations[SELECTED_NODE] = node
        metadata["annotations"] = annotations
        raw["metadata"] = metadata
        try:
            await self.rest.request("PUT", path, body=raw)
        except KubeError as error:
            if error.status == 409:
                raise PreBindFailed(f"persistentvolumeclaim {claim.claim!r} changed meanwhile: {error}") from error
            raise
        log.info("pod %s: claim %s/%s to be provisioned on %s", pod.key, pod.namespace, claim.claim, node)

    async def _wait_bound(self, pod: PodView, node: str, nodes: NodeTable, provisioned: set[str]) -> None:
        """Read the claims until every one is bound to a PV the node can use (kube-scheduler's checkBindings)."""
        assert pod.storage is not None
        deadline = self.clock() + self.timeout_seconds
        waiting = list(pod.storage.delayed)
        while waiting:
            left = []
            for claim in waiting:
                if not await self._bound(pod, claim, node, nodes, provisioned=claim.claim in provisioned):
                    left.append(claim)
            waiting = left
            if not waiting:
                return
            if self.clock() >= deadline:
                names = ", ".join(claim.claim for claim in waiting)
                raise PreBindFailed(f"timed out waiting for the condition: claims {names} not bound after "
                                    f"{self.timeout_seconds:g}s")
            await asyncio.sleep(self.poll_seconds)

    async def _bound(self, pod: PodView, claim: DelayedClaim, node: str, nodes: NodeTable, *,
                     provisioned: bool) -> bool:
        raw = await self.rest.request("GET", self._claim_path(pod.namespace, claim.claim))
        metadata = section(raw, "metadata")
        annotations = section(metadata, "annotations")
        volume = str(section(raw, "spec").get("volumeName") or "")
        if not volume or BIND_COMPLETED not in annotations:
            if provisioned and annotations.get(SELECTED_NODE) != node:
                raise PreBindFailed(f"selectedNode annotation reset for PVC {claim.claim!r}")
            return False
        pv: Json = await self.rest.request("GET", f"/api/v1/persistentvolumes/{segment(volume)}")
        ref = section(section(pv, "spec"), "claimRef")
        if ref.get("name") != claim.claim or ref.get("namespace") != pod.namespace:
            raise PreBindFailed(f"ClaimRef got reset for pv {volume!r}")
        affinity = section(section(section(pv, "spec"), "nodeAffinity"), "required").get("nodeSelectorTerms")
        if affinity is not None and not terms_match(nodes, volume_terms(affinity, field="pv"))[nodes.row(node)]:
            raise PreBindFailed(f"pv {volume!r} node affinity doesn't match node {node!r}")
        return True
