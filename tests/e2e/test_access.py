"""/status and /metrics with --access=kubernetes, on the dispatcher, a resolver replica, a worker and the rescheduler
alike: only a token whose user holds hoss-viewer reads them; health probes stay open."""

from __future__ import annotations

from dev.local.cluster import Cluster
from dev.local.plane import LocalPlane
from tests.e2e.hoss import status_access

EXPECTED = {"nobody": 401, "forged": 401, "stranger": 403, "viewer": 200}


async def test_status_and_metrics_need_a_token_of_a_hoss_viewer(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    outcomes = await status_access(plane, namespace)
    expected = {
        **{f"{component} {who} {path}": code
           for component in ("dispatcher", "resolver", "worker", "rescheduler")
           for who, code in EXPECTED.items() for path in ("/status", "/metrics")},
        **{f"{component} nobody /healthz": 200 for component in ("dispatcher", "resolver", "worker", "rescheduler")},
    }
    assert outcomes == expected
