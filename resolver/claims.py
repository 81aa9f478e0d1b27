"""The resolver's judgement of ResourceClaim allocations (resource.k8s.io/v1 ``resourceclaims/status`` UPDATE), whoever
writes them: hoss's workers, kube-scheduler, any other scheduler.

A write that gives a claim an allocation (the webhook entry's matchConditions send only those) takes its devices
in the ledger, all or none, in one atomic call, for the pod the write reserves the claim for (its new
``status.reservedFor`` entry; the claim itself when there is none): ``promise_claims.lua`` with the keys
``{hoss}:device:<driver>/<pool>/<device>``, which a hoss worker also sets before it writes (`workers.devices`). A
device promised to another pod is refused with 409, naming it: of a hoss worker and another scheduler choosing one
device at the same instant, the second to reach the ledger loses, and its scheduler retries its pod. The promise
lasts `HOLD_SECONDS`: by then every dispatcher has the allocation from its watch of ResourceClaims, so no hoss worker
chooses the device again; another scheduler learns it from its own cache.

Devices that draw on shared counters (partitions of one GPU) take what they draw as well (``promise_counters.lua``,
`hoss.model.devices.counters`), the resolver's informers of ResourceSlices and ResourceClaims being the view: what
the allocations it has seen draw, plus what other pods' promises draw through devices it has not seen yet, plus
this allocation, must fit each counter; else the write is refused with 409 naming the counter.

Admin access devices are shared by design and not taken. A ledger that cannot answer refuses (fail closed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.model import admission
from hoss.model.devices import DeviceId
from hoss.model.devices.counters import counter_draws
from hoss.model.objects import section
from hoss.model.resourceclaims import allocation_devices
from resolver.state import WebhookState

log = logging.getLogger(__name__)

HOLD_SECONDS = 60.0
"""How long an admitted allocation keeps its devices promised in the ledger."""


class MalformedClaimReview(ValueError):
    """The review is not a ResourceClaim status update hoss can read; the message says why."""


@dataclass(frozen=True)
class ClaimAllocation:
    """A ResourceClaim status update as the resolver judges it."""

    review_uid: str
    claim: str
    """namespace/name"""
    holder: str
    """The uid of the pod the write reserves the claim for (the claim's uid when it names none)."""
    devices: tuple[str, ...]
    """'driver/pool/device' of every device the new allocation takes that the old one did not."""
    username: str


def parse_claim_review(body: bytes) -> ClaimAllocation:
    """The AdmissionReview of a ResourceClaim status update; raises `MalformedClaimReview`."""
    try:
        review = orjson.loads(body)
        request: Mapping[str, Any] = review["request"]
        uid = str(request["uid"])
    except (orjson.JSONDecodeError, KeyError, TypeError) as error:
        raise MalformedClaimReview(f"not an AdmissionReview: {error!r}") from error
    new, old = request.get("object"), request.get("oldObject")
    if not isinstance(new, dict):
        raise MalformedClaimReview("request.object is not a ResourceClaim")
    metadata = section(new, "metadata")
    before = set(allocation_devices(old)) if isinstance(old, dict) else set()
    taken = [device for device in allocation_devices(new) if device not in before]
    reserved = section(new, "status").get("reservedFor")
    old_reserved = section(old, "status").get("reservedFor") if isinstance(old, dict) else None
    known = {ref.get("uid") for ref in (old_reserved if isinstance(old_reserved, list) else [])
             if isinstance(ref, dict)}
    consumers = [str(ref.get("uid")) for ref in (reserved if isinstance(reserved, list) else [])
                 if isinstance(ref, dict) and ref.get("uid") and ref.get("uid") not in known]
    user = section(request, "userInfo").get("username")
    return ClaimAllocation(
        review_uid=uid, claim=f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}",
        holder=consumers[0] if consumers else str(metadata.get("uid") or ""),
        devices=tuple(sorted({f"{driver}/{pool}/{device}" for driver, pool, device in taken})),
        username=str(user or ""))


async def _judge_counters(state: WebhookState, write: ClaimAllocation) -> admission.Verdict:
    """The allocation's devices are held: what they draw on shared counters is taken too
    (`hoss.model.devices.counters`, the resolver's informers as the view), or the write is refused and its devices
    given back."""
    inventory = state.inventory()
    devices = [_device_id(name) for name in write.devices]
    if not any(found.consumes for device in devices if (found := inventory.device(device)) is not None):
        return admission.Verdict(allowed=True, reason="devices-held")  # no shared counter: nothing more to read
    namespace, _, name = write.claim.partition("/")
    claim_uid = str(section(state.devices.claims.get((namespace, name)) or {}, "metadata").get("uid") or "")
    seen = [(d[0], d[1], d[2]) for d in state.devices.allocated_devices(besides=frozenset({claim_uid}))]
    draws = counter_draws(devices, allocated=seen, inventory=inventory)
    if not draws:
        return admission.Verdict(allowed=True, reason="devices-held")
    try:
        over = await state.ledger.promise_counters(uid=write.holder, draws=draws, ttl_seconds=HOLD_SECONDS)
        if over is None:
            return admission.Verdict(allowed=True, reason="devices-held")
        await state.ledger.unpromise_devices(uid=write.holder, devices=write.devices)
    except (LedgerUnavailable, LedgerNotReadyError, TimeoutError) as error:
        return admission.Verdict(allowed=False, reason="ledger-unavailable", code=503,
                                 message=f"hoss: cannot judge the allocation of ResourceClaim {write.claim}: {error}")
    counter_set, counter, holder = over
    return admission.Verdict(
        allowed=False, reason="counter-overdrawn", code=409,
        message=f"hoss: counter {counter} of {counter_set} would be overdrawn with what pod {holder} is being "
                f"given; ResourceClaim {write.claim} cannot have its devices")


def _device_id(name: str) -> DeviceId:
    driver, pool, device = name.rsplit("/", 2)
    return driver, pool, device


async def judge_claim(state: WebhookState, write: ClaimAllocation) -> admission.Verdict:
    """Allow the allocation when its devices are promised to its pod (or free), refuse it when another pod holds
    one, in one atomic ledger call."""
    if not write.devices:
        return admission.Verdict(allowed=True, reason="no-new-devices")
    try:
        taken = await state.ledger.promise_devices(uid=write.holder, devices=write.devices, ttl_seconds=HOLD_SECONDS)
    except (LedgerUnavailable, LedgerNotReadyError, TimeoutError) as error:
        return admission.Verdict(allowed=False, reason="ledger-unavailable", code=503,
                                 message=f"hoss: cannot judge the allocation of ResourceClaim {write.claim}: {error}")
    if taken is None:
        return await _judge_counters(state, write)
    device, holder = taken
    return admission.Verdict(
        allowed=False, reason="device-taken", code=409,
        message=f"hoss: device {device} is being allocated for pod {holder}; ResourceClaim {write.claim} cannot "
                f"have it")
