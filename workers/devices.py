"""PreBind of a pod's ResourceClaims: kube-scheduler's DynamicResources PreBind, and its Unreserve.

Once the pod's room is reserved on a node, and before its Binding is posted:

1. The devices the chosen node's allocation takes (`hoss.framework.plugins.devices.allocation_on`) are promised to
   the pod in the ledger, all or none, in one atomic call (``promise_claims.lua``, keys
   ``{hoss}:device:<driver>/<pool>/<device>``). Of two workers (or two pods of one batch) that chose one device at
   the same instant, the second finds it promised: its pod is retried, and by then the dispatcher's watch of
   ResourceClaims brings the first one's allocation, so the device is no longer offered. Devices that draw on
   shared counters are promised by what they draw too (``promise_counters.lua``, `hoss.model.devices.counters`),
   so two workers never overdraw a counter set between them.
2. Each claim to allocate gets the finalizer ``resource.kubernetes.io/delete-protection`` (an update of the claim)
   and then, in one status update, its ``status.allocation`` and the pod in ``status.reservedFor``; a claim
   allocated already gets only the pod in reservedFor. A claim allocated elsewhere meanwhile, replaced or being
   deleted fails the PreBind, as in kube-scheduler; a conflicting write (409) is tried again on the claim as it is
   now.

3. On a node that leaves extended resources to DRA (`hoss.model.dra`), the claim for them is made as kube-scheduler
   makes it (``<pod>-extended-resources-<random>``, annotated ``resource.kubernetes.io/extended-resource-claim:
   "true"``, owned by the pod; a claim an earlier attempt made is deleted first), allocated and reserved as above,
   and the pod's ``status.extendedResourceClaimStatus`` names it and maps each container's resource to its request.

Any failure answers the message the pod is retried with (``running PreBind plugin "DynamicResources": ...``), gives
the promises back, takes the pod out of the reservedFor of the claims it was written into (kube-scheduler's
Unreserve: the resourceclaim controller then deallocates a claim nobody reserves) and deletes the claim it made for
the extended resources. Once the pod is bound the
promises are cut short: the claims' allocations are in the apiserver, which the dispatcher's watch reads.
"""

from __future__ import annotations

import datetime
import logging

import aiohttp

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.framework.nodes import NodeTable
from hoss.framework.plugins.devices import allocation_on, extended_claim, extended_mappings, left_on, prepare
from hoss.framework.pod import ClaimUse, PodView
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST, segment
from hoss.ledger.client import Ledger
from hoss.model import devices as dra
from hoss.model import dra as dra_names
from hoss.model.devices import DeviceId
from hoss.model.devices.counters import counter_draws
from hoss.model.objects import Json, section

log = logging.getLogger(__name__)

PREBIND = 'running PreBind plugin "DynamicResources": '
"""How a PreBind failure's message begins (kube-scheduler's words)."""
FINALIZER = "resource.kubernetes.io/delete-protection"
CONFLICT_RETRIES = 5


class ClaimWriteFailed(Exception):
    """A claim could not be allocated or reserved for the pod; the message says why."""


def needs_devices(pod: PodView) -> bool:
    """Whether the pod has ResourceClaims to allocate or to reserve before its own binding, or extended resources
    a DeviceClass serves (whether its node leaves them to DRA is PreBind's to see)."""
    return pod.devices is not None and (bool(pod.devices.extended) or any(
        claim.allocation is None or not claim.reserved for claim in pod.devices.claims))


def device_keys(allocation: dra.Allocation) -> list[str]:
    """The ledger's promise keys of the devices an allocation takes ('<driver>/<pool>/<device>')."""
    return [f"{driver}/{pool}/{device}" for driver, pool, device in sorted(dra.devices_of(allocation))]


class DeviceBinder:
    """Promises the devices of a pod's allocation in the `ledger` (for `promise_seconds`), then writes the claims
    through `rest`."""

    def __init__(self, rest: KubeREST, ledger: Ledger, *, promise_seconds: float) -> None:
        self.rest = rest
        self.ledger = ledger
        self.promise_seconds = promise_seconds
        self.made: dict[str, ClaimUse] = {}
        """The claim made for a pod's extended resources (by pod uid) until the pod is bound or given up."""
        self.counters: dict[str, list[str]] = {}
        """The counter sets a pod's promise draws on (by pod uid) until the pod is bound or given up."""

    async def prebind(self, pod: PodView, node: str, nodes: NodeTable, *,
                      taken: frozenset[DeviceId] = frozenset()) -> tuple[str | None, frozenset[DeviceId]]:
        """None when the pod's claims are allocated and reserved for it on `node`, leaving out the devices `taken`
        (by the members of its gang bound before it), and the devices it took; else the message to retry the pod
        with (everything this call promised or wrote undone)."""
        if not needs_devices(pod) or pod.devices is None:
            return None, frozenset()
        allocation = None
        keys: list[str] = []
        if node not in nodes:
            return f"{PREBIND}node {node!r} is no longer known", frozenset()
        left = left_on(pod.devices, nodes, nodes.row(node))
        extended = extended_claim(pod.devices, left)
        if pod.devices.to_allocate or extended is not None:
            allocation = allocation_on(pod.devices, node, nodes.labels[nodes.row(node)], taken=taken, left=left)
            if allocation is None:
                return f"{PREBIND}cannot allocate all claims on node {node!r} any more", frozenset()
            keys = device_keys(allocation)
            message = await self._promise(pod, keys, seconds=self.promise_seconds)
            if message is None:
                message = await self._promise_counters(pod, allocation, taken=taken)
                if message is not None:
                    await self.unreserve(pod, [], keys)
            if message is not None:
                return f"{PREBIND}{message}", frozenset()
        written: list[ClaimUse] = []
        try:
            for index, claim in enumerate(pod.devices.to_allocate):
                assert allocation is not None
                await self._write(pod, claim, dra.allocation_status(allocation, index))
                written.append(claim)
            for claim in pod.devices.claims:
                if claim.allocation is not None and not claim.reserved:
                    await self._write(pod, claim, None)
                    written.append(claim)
            if extended is not None:
                assert allocation is not None
                status = dra.allocation_status(allocation, len(pod.devices.to_allocate))
                await self._make_extended(pod, extended, status, mappings=extended_mappings(pod.devices, left))
        except ClaimWriteFailed as error:
            log.info("pod %s: its ResourceClaims were not written for %s: %s", pod.key, node, error)
            await self.unreserve(pod, written, keys)
            return f"{PREBIND}{error}", frozenset()
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("pod %s: writing its ResourceClaims for %s failed: %s", pod.key, node, error)
            await self.unreserve(pod, written, keys)
            return f"{PREBIND}{error}", frozenset()
        return None, dra.devices_of(allocation) if allocation is not None else frozenset()

    async def _promise_counters(self, pod: PodView, allocation: dra.Allocation, *,
                                taken: frozenset[DeviceId]) -> str | None:
        """Take what the allocation draws on shared counters in the ledger (`hoss.model.devices.counters`); the
        message to retry the pod with when another pod's promise would overdraw a counter with it."""
        assert pod.devices is not None
        inventory = prepare(pod.devices).inventory
        if not allocation.counters or inventory is None:
            return None
        draws = counter_draws(dra.devices_of(allocation), allocated=pod.devices.allocated | taken,
                              inventory=inventory)
        try:
            found = await self.ledger.promise_counters(uid=pod.uid, draws=draws, ttl_seconds=self.promise_seconds)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            return f"cannot promise its devices' shared counters: {error}"
        if found is None:
            self.counters[pod.uid] = [draw.key for draw in draws]
            return None
        log.info("pod %s: counter %s of %s would be overdrawn with pod %s", pod.key, found[1], found[0], found[2])
        return f"counter set {found[0]} is in the process of being allocated for another pod"

    async def _promise(self, pod: PodView, keys: list[str], *, seconds: float) -> str | None:
        try:
            taken = await self.ledger.promise_devices(uid=pod.uid, devices=keys, ttl_seconds=seconds)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            return f"cannot promise its devices: {error}"
        if taken is None:
            return None
        log.info("pod %s: device %s is promised to pod %s", pod.key, *taken)
        return f"device {taken[0]} is in the process of being allocated for another pod"

    async def bound(self, pod: PodView, devices: frozenset[DeviceId]) -> None:
        """The pod is bound: the promises of the `devices` it took only bridge the moments until the dispatcher
        sees the allocations (a few seconds)."""
        self.made.pop(pod.uid, None)
        self.counters.pop(pod.uid, None)  # the promise lasts its time: the dispatcher has the allocation by then
        if devices:
            keys = [f"{driver}/{pool}/{device}" for driver, pool, device in sorted(devices)]
            await self._promise(pod, keys, seconds=min(self.promise_seconds, 30.0))

    async def _make_extended(self, pod: PodView, claim: Json, allocation: Json, *, mappings: list[Json]) -> None:
        """Make the claim for the pod's extended resources (`claim`: its requests), allocate and reserve it, and
        name it in the pod's status.extendedResourceClaimStatus; a claim an earlier attempt made goes first."""
        assert pod.devices is not None
        if pod.devices.stale is not None:
            await self._delete(pod, ClaimUse(entry="", claim=pod.devices.stale[0], uid=pod.devices.stale[1],
                                             version=""))
        body: Json = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"generateName": f"{pod.name}-extended-resources-", "namespace": pod.namespace,
                         "annotations": {dra_names.EXTENDED_CLAIM_ANNOTATION: "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid,
                                              "controller": True}]},
            "spec": claim["spec"]}
        try:
            made = await self.rest.request(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{segment(pod.namespace)}/resourceclaims", body=body)
        except KubeError as error:
            raise ClaimWriteFailed(f"create claim for extended resources {pod.namespace}/{pod.name}: "
                                   f"{error}") from error
        metadata = section(made, "metadata")
        use = ClaimUse(entry="", claim=str(metadata.get("name") or ""), uid=str(metadata.get("uid") or ""),
                       version=str(metadata.get("resourceVersion") or ""))
        self.made[pod.uid] = use
        await self._write(pod, use, allocation)
        try:
            await self.rest.patch_pod_status(pod.namespace, pod.name, {"status": {"extendedResourceClaimStatus": {
                "requestMappings": mappings, "resourceClaimName": use.claim}}})
        except KubeError as error:
            raise ClaimWriteFailed(f"update pod {pod.namespace}/{pod.name} ExtendedResourceClaimStatus: "
                                   f"{error}") from error

    async def _delete(self, pod: PodView, claim: ClaimUse) -> None:
        """Delete a claim made for the pod's extended resources: its finalizer off first (an update of the claim as
        it is now, tried again on a 409), then the claim; one gone already is fine."""
        path = self._path(pod.namespace, claim.claim)
        for attempt in range(CONFLICT_RETRIES):
            try:
                raw = await self.rest.request("GET", path)
            except KubeError as error:
                if error.status == 404:
                    return
                raise
            metadata = section(raw, "metadata")
            if claim.uid and metadata.get("uid") != claim.uid:
                return
            finalizers = list(metadata.get("finalizers") or [])
            if FINALIZER not in finalizers:
                break
            metadata["finalizers"] = [f for f in finalizers if f != FINALIZER]
            raw["metadata"] = metadata
            try:
                await self.rest.request("PUT", path, body=raw)
                break
            except KubeError as error:
                if error.status != 409 or attempt + 1 == CONFLICT_RETRIES:
                    raise
        try:
            await self.rest.request("DELETE", path, body={"preconditions": {"uid": claim.uid}} if claim.uid else None)
        except KubeError as error:
            if error.status not in (404, 409):
                raise
        log.info("pod %s: ResourceClaim %s/%s for its extended resources deleted", pod.key, pod.namespace, claim.claim)

    def _path(self, namespace: str, name: str) -> str:
        return f"/apis/resource.k8s.io/v1/namespaces/{segment(namespace)}/resourceclaims/{segment(name)}"

    async def _write(self, pod: PodView, claim: ClaimUse, allocation: Json | None) -> None:
        """Allocate `claim` (when `allocation` is given) and reserve it for the pod, as kube-scheduler's
        bindClaim: the finalizer first, then allocation and reservedFor in one status update; a 409 is tried
        again on the claim as it is now."""
        path = self._path(pod.namespace, claim.claim)
        for attempt in range(CONFLICT_RETRIES):
            raw = await self.rest.request("GET", path)
            metadata = section(raw, "metadata")
            status = section(raw, "status")
            if claim.uid and metadata.get("uid") != claim.uid:
                raise ClaimWriteFailed(f"claim {pod.namespace}/{claim.claim} was replaced in the meantime")
            if metadata.get("deletionTimestamp"):
                raise ClaimWriteFailed(f"claim {pod.namespace}/{claim.claim} got deleted in the meantime")
            if allocation is not None and status.get("allocation"):
                raise ClaimWriteFailed(f"claim {pod.namespace}/{claim.claim} got allocated elsewhere in the meantime")
            try:
                if allocation is not None:
                    finalizers: list[object] = list(metadata.get("finalizers") or [])
                    if FINALIZER not in finalizers:
                        metadata["finalizers"] = [*finalizers, FINALIZER]
                        raw["metadata"] = metadata
                        raw = await self.rest.request("PUT", path, body=raw)
                        status = section(raw, "status")
                    # kube-scheduler 1.36 stamps the allocation (DRADeviceBindingConditions and
                    # DRAResourceClaimDeviceStatus, both on by default)
                    status["allocation"] = {**allocation, "allocationTimestamp": datetime.datetime.now(
                        datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
                reserved: list[object] = list(status.get("reservedFor") or [])
                if not any(isinstance(ref, dict) and ref.get("uid") == pod.uid for ref in reserved):
                    status["reservedFor"] = [*reserved, {"resource": "pods", "name": pod.name, "uid": pod.uid}]
                raw["status"] = status
                await self.rest.request("PUT", f"{path}/status", body=raw)
            except KubeError as error:
                if error.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                    continue
                what = "add allocation and reservation to" if allocation is not None else "add reservation to"
                raise ClaimWriteFailed(f"{what} claim {pod.namespace}/{claim.claim}: {error}") from error
            log.info("pod %s: ResourceClaim %s/%s %s", pod.key, pod.namespace, claim.claim,
                     "allocated and reserved" if allocation is not None else "reserved")
            return

    async def _unreserve_one(self, pod: PodView, claim: ClaimUse) -> None:
        """Take the pod out of the claim's reservedFor (a status update on the claim as it is now, tried again on a
        409)."""
        path = self._path(pod.namespace, claim.claim)
        for attempt in range(CONFLICT_RETRIES):
            raw = await self.rest.request("GET", path)
            if claim.uid and section(raw, "metadata").get("uid") != claim.uid:
                return
            status = section(raw, "status")
            reserved: list[object] = list(status.get("reservedFor") or [])
            kept = [ref for ref in reserved if not (isinstance(ref, dict) and ref.get("uid") == pod.uid)]
            if len(kept) == len(reserved):
                return
            status["reservedFor"] = kept
            raw["status"] = status
            try:
                await self.rest.request("PUT", f"{path}/status", body=raw)
            except KubeError as error:
                if error.status != 409 or attempt + 1 == CONFLICT_RETRIES:
                    raise
            else:
                return

    async def unreserve(self, pod: PodView, written: list[ClaimUse], keys: list[str]) -> None:
        """Take the pod out of the reservedFor of the claims `written` and give the promises of `keys` back
        (kube-scheduler's Unreserve; the resourceclaim controller deallocates a claim nobody reserves)."""
        for claim in written:
            try:
                await self._unreserve_one(pod, claim)
            except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("pod %s: cannot unreserve ResourceClaim %s/%s: %s", pod.key, pod.namespace, claim.claim,
                            error)
        if (made := self.made.pop(pod.uid, None)) is not None:
            try:
                await self._delete(pod, made)
            except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
                # the claim stays until the pod goes; its next attempt deletes it first (DEVICES' stale)
                log.warning("pod %s: cannot delete ResourceClaim %s/%s: %s", pod.key, pod.namespace, made.claim,
                            error)
        sets = self.counters.pop(pod.uid, [])
        try:
            if keys:
                await self.ledger.unpromise_devices(uid=pod.uid, devices=keys)
            if sets:
                await self.ledger.unpromise_counters(uid=pod.uid, keys=sets)
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.warning("pod %s: its devices' promises expire by themselves: %s", pod.key, error)
