"""The resolver's stats for the dispatcher's /status: each replica publishes its verdict counts, review latency and
recent denials to Redis (one hash per replica, ``{hoss}:resolver:<instance>``, expiring when the replica stops
refreshing it), and reads back the ledger's cluster-wide counters, the elastic quotas' use and whether the ledger is
ready (hoss_resolver_ready) for its own /metrics and /status."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from hoss.errors import HossError
from hoss.kube.client import raise_if_cancelled
from hoss.ledger.keys import STATS_KEY
from resolver.judge import LEDGER_CALL_TIMEOUT_SECONDS
from resolver.state import WebhookState

log = logging.getLogger(__name__)


def stats_fields(state: WebhookState) -> dict[str, str]:
    """The resolver's stats hash (``{hoss}:resolver:<instance>``) that the dispatcher's /status reads."""
    latency = state.review_latency.summary_ms()
    return {
        "verdicts": json.dumps(dict(state.verdict_counts)),
        "recent_denials": json.dumps([d.__dict__ for d in reversed(state.denials)]),
        "review_p50_ms": "" if latency["p50"] is None else str(latency["p50"]),
        "review_p99_ms": "" if latency["p99"] is None else str(latency["p99"]),
        "leader": "1" if state.sync is not None else "0",
        "updated_unix": f"{time.time():.3f}",
    }


async def ledger_ready(state: WebhookState) -> bool:
    """Whether the ledger answers and is ready, as /readyz asks it (an unreachable ledger is not ready)."""
    try:
        async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
            return await state.ledger.is_ready()
    except (HossError, TimeoutError):
        return False


async def publish_stats(state: WebhookState, redis: Redis, *, instance: str, interval: float = 2.0) -> None:
    """Publish verdict counts, review latency and recent denials for the dispatcher's /status (one key per
    resolver replica)."""
    key = f"{{hoss}}:resolver:{instance}"
    while True:
        try:
            pipe = redis.pipeline(transaction=True)
            fields: dict[Any, Any] = stats_fields(state)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, int(interval * 10))
            pipe.hgetall(STATS_KEY)
            state.ledger_stats = dict((await pipe.execute())[-1] or {})
        except RedisError as error:
            log.warning("cannot publish resolver stats: %s", error)
        try:
            async with asyncio.timeout(LEDGER_CALL_TIMEOUT_SECONDS):
                state.quota_report = await state.ledger.quotas()
        except (HossError, TimeoutError) as error:
            log.warning("cannot read elastic quotas' use: %s", error or "no answer")
        state.metrics.set_ready(await ledger_ready(state))
        raise_if_cancelled()
        await asyncio.sleep(interval)
