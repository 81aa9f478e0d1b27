"""Koordinator Reservations: mirror them, place Pending ones like pods, and as leader end the expired ones."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from dispatcher.core import STATUS_TIMEOUT_SECONDS, Dispatcher
from resolver import reservations
from resolver.errors import ResolverError
from resolver.kube import InformerHandlers, Json, KubeError, request_json, run_crd_informer

log = logging.getLogger(__name__)

EXPIRY_INTERVAL_SECONDS = 1.0
UNSUPPORTED_ALLOCATE_ONCE = "spec.allocateOnce: false is not supported by hoss yet (a reservation serves one pod)"


def observe(dispatcher: Dispatcher, kind: str, obj: Json) -> None:
    """Apply one Reservation event: a Pending one of ours joins the pending set as a pod (`reservations.as_pod`);
    one that left Pending (placed, used, failed) or was deleted leaves it."""
    uid = str((obj.get("metadata") or {}).get("uid") or "")
    try:
        parsed = reservations.parse(obj)
    except ResolverError as error:
        log.warning("Reservation %s ignored: %s", (obj.get("metadata") or {}).get("name"), error)
        dispatcher.reservations.pop(uid, None)
        return
    names = dispatcher.settings.scheduler_names
    if kind == "DELETED":
        dispatcher.reservations.pop(uid, None)
        dispatcher.on_reservation_gone(uid)
        return
    before = dispatcher.reservations.get(uid)
    dispatcher.reservations[uid] = parsed
    if parsed.available and (before is None or not before.available):
        dispatcher.on_reservation_available(parsed)
    ours = not parsed.scheduler_name or parsed.scheduler_name in names
    if ours and parsed.pending and parsed.allocate_once and parsed.expires_unix > time.time():
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


async def end_reservations(api: client.ApiClient, dispatcher: Dispatcher, is_leader: Callable[[], bool], *,
                           interval: float = EXPIRY_INTERVAL_SECONDS) -> None:
    """As leader: a Reservation past its ttl/expires that is still Pending or Available becomes Failed (reason
    Expired; the resolver's sync then frees its room), and one with allocateOnce false is refused (Failed)."""
    custom: Any = client.CustomObjectsApi(api)
    group, version, plural = reservations.API
    ended: set[str] = set()

    async def fail(reservation: reservations.Reservation, reason: str, message: str) -> None:
        try:
            await request_json(custom.patch_cluster_custom_object_status, group, version, plural, reservation.name,
                               reservations.failed_status(reason, message),
                               _content_type="application/merge-patch+json",
                               _request_timeout=STATUS_TIMEOUT_SECONDS * 2)
            log.info("Reservation %s: %s", reservation.name, message)
            ended.add(reservation.uid)
        except KubeError as error:
            log.warning("cannot end Reservation %s: %s", reservation.name, error)

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
            elif not reservation.allocate_once and reservation.pending:
                await fail(reservation, "Unsupported", UNSUPPORTED_ALLOCATE_ONCE)
