"""An owner pod whose binding fails after it took a Reservation's room: a real worker (its binder refuses, as
the apiserver or the webhook may) and a real dispatcher on a real redis-server. The worker releases its
reservation when the binding fails, and the owner's share is the Reservation's again in that same ledger call:
not after the reservation's ttl, nor at the resolver's next audit."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio

from bench.pipeline import prepare_ledger, run_worker, worker_settings
from dev.local.plane import POLICIES_FILE
from dispatcher import reservations as dispatcher_reservations
from dispatcher.core import Dispatcher
from dispatcher.roles import cancel_and_wait
from dispatcher.settings import DispatcherSettings
from hoss.framework.pod import PodView
from hoss.kube.client import KubeError
from hoss.ledger.client import Ledger
from hoss.ledger.results import ReservationShares
from hoss.queue import WorkQueue
from tests.waiting import until
from workers.core import Worker

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
TOTAL = {"cpu": 2000, GPU: 4, "pods": 1}
META = '{"namespace":"team","priority":2147483647,"reservation":"pool","allocateOnce":false}'


class RefusingBinder:
    """Refuses every binding (403, as a denying webhook answers) and notes what the ledger held meanwhile."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.calls = 0
        self.during: ReservationShares | None = None
        self.refused = asyncio.Event()

    async def bind(self, pod: PodView, node: str) -> None:
        self.calls += 1
        self.during = (await self.ledger.reservation_owners(["uid-pool"])).get("uid-pool")
        self.refused.set()
        raise KubeError(f"binding {pod.key} to {node} denied", status=403)


async def test_a_failed_binding_gives_the_owners_share_back_to_the_reservation_at_once(
    client: redis.asyncio.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = {"metadata": {"name": "g1", "labels": {"kubernetes.io/hostname": "g1"}}, "spec": {},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110", GPU: "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    await prepare_ledger(client, [node])
    ledger = Ledger(client)
    await ledger.hold_reservation(uid="uid-pool", name="pool", candidates=["g1"], request=TOTAL, meta=META,
                                  owner="w", ttl_seconds=30)
    await ledger.keep_reservation(uid="uid-pool", name="pool", node="g1", request=TOTAL, meta=META)
    binder = RefusingBinder(ledger)
    monkeypatch.setattr("bench.pipeline.SinkBinder", lambda _redis: binder)
    # A long backoff and a long ttl: neither a retry nor the reservation's expiry can give the room back here.
    settings = worker_settings("w1", redis_url, str(POLICIES_FILE), backoff_initial_seconds=60.0,
                               reservation_ttl_seconds=120.0)
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop))
    dispatcher = Dispatcher(queue=WorkQueue(client), settings=DispatcherSettings(identity="t"))
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    dispatcher_reservations.observe(dispatcher, "ADDED", {
        "metadata": {"name": "pool", "uid": "uid-pool", "creationTimestamp": created},
        "spec": {"template": {"metadata": {"namespace": "team"}, "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "2", GPU: "4"}, "limits": {GPU: "4"}}}]}},
                 "owners": [{"labelSelector": {"matchLabels": {"app": "train"}}}], "allocateOnce": False},
        "status": {"phase": "Available", "nodeName": "g1"}})
    owner: dict[str, Any] = {
        "metadata": {"name": "owner", "namespace": "team", "uid": "uid-owner", "labels": {"app": "train"}},
        "spec": {"schedulerName": "hoss", "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "1", GPU: "2"}, "limits": {GPU: "2"}}}]},
        "status": {"phase": "Pending"}}
    lead = None
    try:
        async def beating() -> tuple[bool, str]:
            live, _dead = await dispatcher.queue.workers()
            return bool(live), f"{len(live)} live workers"

        # The worker must be beating before the first round, or the pod waits for one.
        await until(beating, timeout=10, what="the worker's first heartbeat")
        await dispatcher.on_list([owner])
        dispatcher.synced.set()
        lead = asyncio.create_task(dispatcher.lead())
        await asyncio.wait_for(binder.refused.wait(), timeout=60)
        # While the binding was in flight the owner held a share of the Reservation, on its node.
        assert binder.during is not None and binder.during.room[GPU] == 2
        assert [(o.uid, o.node, dict(o.share)) for o in binder.during.owners] == [
            ("uid-owner", "g1", {"cpu": 1000, GPU: 2})]
        async def share_back() -> tuple[bool, str]:
            view = (await ledger.reservation_owners(["uid-pool"]))["uid-pool"]
            return not view.owners, str(view)

        await until(share_back, timeout=10, what="the owner's share to go back to the Reservation")
        view = (await ledger.reservation_owners(["uid-pool"]))["uid-pool"]
        assert view.owners == () and view.room == TOTAL, view
        assert "uid-owner" not in {e.uid for e in await ledger.entries()}
        assert binder.calls == 1, "released by the failed binding, not by a later attempt"
    finally:
        if lead is not None:
            await cancel_and_wait(lead)
        stop.set()
        finished: Worker = await worker
        assert finished.counters.get("denied") == 1
