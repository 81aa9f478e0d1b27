"""The worker's /healthz names a loop that is failing or dead (HTTP 500), and its heartbeat carries the same."""

from __future__ import annotations

import fakeredis
from aiohttp.test_utils import TestClient, TestServer

from dev.local.plane import POLICIES_FILE
from hoss.framework.pod import PodView
from workers.core import Worker
from workers.server import build_app
from workers.settings import WorkerSettings


class NoBinder:
    async def bind(self, pod: PodView, node: str) -> None:
        raise AssertionError("nothing is bound here")


async def test_healthz_is_500_naming_a_dead_or_failing_loop_and_the_heartbeat_says_so(
    fake_redis: fakeredis.FakeAsyncRedis,
) -> None:
    worker = Worker(WorkerSettings(id="w", policies_file=str(POLICIES_FILE), port=0), redis=fake_redis, rest=None,
                    binder=NoBinder())
    async with TestClient(TestServer(build_app(worker))) as http:
        response = await http.get("/healthz")
        assert (response.status, await response.text()) == (200, "ok")
        worker.supervisor.dead["schedule"] = "RuntimeError: boom"
        worker.supervisor.failing["intake"] = "KeyError: 'uid'"
        response = await http.get("/healthz")
        body = await response.text()
        assert response.status == 500
        assert "loop schedule dead: RuntimeError: boom" in body and "loop intake failing: KeyError: 'uid'" in body
    assert worker.info().unhealthy == ["intake", "schedule"]
