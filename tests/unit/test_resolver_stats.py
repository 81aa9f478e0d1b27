"""The resolver's stats hash, as the webhook writes it and the dispatcher's /status reads it."""

from __future__ import annotations

from pathlib import Path

import fakeredis

from dispatcher.resolverstats import merge_resolver_stats
from hoss.ledger.client import Ledger
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.stats import stats_fields


async def test_the_dispatcher_reads_each_replicas_review_latency(
    tmp_path: Path, fake_redis: fakeredis.FakeAsyncRedis
) -> None:
    state = WebhookState(
        settings=ResolverSettings(tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k")),
        ledger=Ledger(fake_redis),
    )
    idle = stats_fields(state)
    for ms in (1.0, 2.0, 3.0, 40.0):
        state.review_latency.add(ms / 1000)
    state.verdict_counts["reserved"] += 4
    merged = merge_resolver_stats({"busy": stats_fields(state), "idle": idle})
    by_name = {i.instance: i for i in merged.instances}
    assert (by_name["busy"].review_p50_ms, by_name["busy"].review_p99_ms) == (2.0, 40.0)
    assert (by_name["idle"].review_p50_ms, by_name["idle"].review_p99_ms) == (None, None)
    assert merged.verdicts == {"reserved": 4}
