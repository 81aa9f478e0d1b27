"""Koordinator Reservations: mirror them, place Pending ones like pods, and as leader end the expired ones, write
the owners of those with allocateOnce false (status.currentOwners, allocated) from the ledger's shares, and say on
each Reservation hoss refuses (a field it cannot honour) why: a Scheduled=False condition, reason Refused, naming
the field, and a Warning event, once per generation."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from dispatcher.core import Dispatcher
from dispatcher.notices import COMPONENT, write_reservation_status
from hoss.errors import HossError, LedgerNotReadyError, LedgerUnavailable
from hoss.kube.client import InformerHandlers, run_crd_informer
from hoss.kube.events import post_event, reservation_event
from hoss.ledger.client import Ledger
from hoss.ledger.results import ReservationShares
from hoss.model import reservations
from hoss.model.objects import Json

log = logging.getLogger(__name__)

EXPIRY_INTERVAL_SECONDS = 1.0


def observe(dispatcher: Dispatcher, kind: str, obj: Json) -> None:
    """Apply one Reservation event: a Pending one of ours joins the pending set as a pod (`reservations.as_pod`);
    one that left Pending (placed, used, failed) or was deleted leaves it."""
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    if kind == "DELETED":
        dispatcher.refused_reservations.pop(uid, None)
    try:
        parsed = reservations.parse(obj)
    except reservations.ReservationError as error:
        if kind != "DELETED":
            refused = reservations.RefusedReservation.of(obj, error)
            if dispatcher.refused_reservations.get(uid) != refused:
                log.warning("Reservation %s refused: %s", refused.name, error)
            dispatcher.refused_reservations[uid] = refused
        dispatcher.reservations.pop(uid, None)
        dispatcher.on_reservation_gone(uid)
        return
    except HossError as error:
        log.warning("Reservation %s ignored: %s", (obj.get("metadata") or {}).get("name"), error)
        dispatcher.reservations.pop(uid, None)
        return
    dispatcher.refused_reservations.pop(uid, None)
    names = dispatcher.settings.scheduler_names
    if kind == "DELETED":
        dispatcher.reservations.pop(uid, None)
        dispatcher.on_reservation_gone(uid)
        return
    before = dispatcher.reservations.get(uid)
    dispatcher.reservations[uid] = parsed
    if parsed.available and (before is None or not before.available or before.room_left != parsed.room_left
                             or (before.unschedulable, before.taints) != (parsed.unschedulable, parsed.taints)):
        # its owners sent already are sent again, with the room left (and without it, when they may not use it)
        dispatcher.on_reservation_available(parsed)
    ours = not parsed.scheduler_name or parsed.scheduler_name in names
    if ours and parsed.pending and parsed.expires_unix > time.time():
        dispatcher._observe(reservations.as_pod(parsed, scheduler_name=parsed.scheduler_name or names[0]))
    else:
        dispatcher.on_reservation_gone(uid)
    dispatcher.wake()


async def watch_reservations(api: client.ApiClient, dispatcher: Dispatcher, *, recheck_seconds: float = 60.0) -> None:
    """Mirror Reservations when the CRD is installed; check again now and then when it is not."""
    custom: Any = client.CustomObjectsApi(api)
    call = functools.partial(custom.list_cluster_custom_object, *reservations.API)

    async def on_list(items: list[Json]) -> None:
        listed = {str((item.get("metadata") or {}).get("uid") or "") for item in items}
        for uid in [uid for uid in dispatcher.refused_reservations if uid not in listed]:
            dispatcher.refused_reservations.pop(uid)
        for uid in [uid for uid in dispatcher.reservations if uid not in listed]:
            dispatcher.reservations.pop(uid, None)
            dispatcher.on_reservation_gone(uid)
        for item in items:
            observe(dispatcher, "ADDED", item)

    async def on_event(kind: str, obj: Json) -> None:
        observe(dispatcher, kind, obj)

    await run_crd_informer("reservations", call, InformerHandlers(on_list=on_list, on_event=on_event),
                           kind="Reservations", recheck_seconds=recheck_seconds,
                           found="Reservation CRD found: hoss places Reservations and gives their room to their owners")


def owners_status(reservation: reservations.Reservation, shares: ReservationShares) -> Json | None:
    """The status patch that makes an allocateOnce false Reservation's currentOwners and allocated say what the
    ledger's shares say (None when they do already)."""
    owners = []
    allocated: dict[str, int] = {}
    for owner in shares.owners:
        namespace, _, name = owner.pod.partition("/")
        owners.append({"namespace": namespace, "name": name, "uid": owner.uid})
        for resource, amount in owner.share.items():
            allocated[resource] = allocated.get(resource, 0) + amount
    patch = reservations.shared_status(reservation, owners, allocated)
    same_owners = [dict(o) for o in reservation.current_owners] == owners
    same_amounts = all(reservation.allocated.get(r, 0) == allocated.get(r, 0) for r in reservation.request)
    return None if same_owners and same_amounts else patch


async def end_reservations(api: client.ApiClient, dispatcher: Dispatcher, is_leader: Callable[[], bool], *,
                           ledger: Ledger | None = None, interval: float = EXPIRY_INTERVAL_SECONDS) -> None:
    """As leader: a Reservation past its ttl/expires that is still Pending or Available becomes Failed (reason
    Expired; the resolver's sync then frees its room; owner pods keep their own), and an Available one with
    allocateOnce false gets its owners written (`owners_status`)."""
    ended: set[str] = set()
    written: dict[str, str] = {}
    """uid -> the last owners patch written (the watch may not show it yet)"""

    async def write_owners(now: float) -> None:
        shared = [r for r in dispatcher.reservations.values()
                  if r.available and not r.allocate_once and r.expires_unix > now and r.uid not in ended]
        for uid in [uid for uid in written if uid not in dispatcher.reservations]:
            written.pop(uid)
        if ledger is None or not shared:
            return
        try:
            views = await ledger.reservation_owners([r.uid for r in shared])
        except (LedgerUnavailable, LedgerNotReadyError) as error:
            log.debug("cannot read the Reservations' owners: %s", error)
            return
        for reservation in shared:
            view = views.get(reservation.uid)
            patch = None if view is None else owners_status(reservation, view)
            if patch is None:
                written.pop(reservation.uid, None)
                continue
            text = str(patch)
            if written.get(reservation.uid) == text:
                continue  # written already; the watch has not shown it yet
            if await write_reservation_status(api, reservation.name, patch, what="the owners"):
                written[reservation.uid] = text

    said: dict[str, int] = {}
    """uid -> the generation of a refused Reservation whose refusal is written"""
    core: Any = client.CoreV1Api(api)

    async def refuse() -> None:
        for uid in [uid for uid in said if uid not in dispatcher.refused_reservations]:
            said.pop(uid)
        for uid, refused in list(dispatcher.refused_reservations.items()):
            if said.get(uid) == refused.generation:
                continue
            message = f"hoss refuses this Reservation: {refused.field}: {refused.reason}"
            if await write_reservation_status(api, refused.name,
                                              reservations.refused_status(refused.field, refused.reason),
                                              what="the refusal"):
                said[uid] = refused.generation
                await post_event(core, reservation_event(refused.name, uid, reason="Refused", message=message,
                                                         component=COMPONENT, warning=True))

    async def fail(reservation: reservations.Reservation, reason: str, message: str) -> None:
        if await write_reservation_status(api, reservation.name, reservations.failed_status(reason, message),
                                          what="the end"):
            log.info("Reservation %s: %s", reservation.name, message)
            ended.add(reservation.uid)

    while True:
        await asyncio.sleep(interval)
        if not is_leader():
            continue
        now = time.time()
        ended &= set(dispatcher.reservations)
        for reservation in list(dispatcher.reservations.values()):
            if reservation.uid in ended or reservation.phase in ("Succeeded", "Failed"):
                continue
            if reservation.expires_unix <= now:
                await fail(reservation, "Expired", "the reservation expired (spec.ttl / spec.expires)")
        await write_owners(now)
        await refuse()
