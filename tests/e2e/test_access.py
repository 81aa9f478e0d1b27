"""The dispatcher's /status and /metrics with --access=kubernetes: only a token whose user holds hoss-viewer."""

from __future__ import annotations

from deploy.local.cluster import Cluster
from deploy.local.plane import LocalPlane
from tests.e2e.hoss import status_access


async def test_status_and_metrics_need_a_token_of_a_hoss_viewer(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    outcomes = await status_access(plane, namespace)
    assert outcomes == {
        "nobody /status": 401, "nobody /metrics": 401,
        "forged /status": 401, "forged /metrics": 401,
        "stranger /status": 403, "stranger /metrics": 403,
        "viewer /status": 200, "viewer /metrics": 200,
        "nobody /healthz": 200,
    }
