"""`hoss reschedule`: one round of the rescheduler from the operator's shell (``--dry-run``: the plan only)."""

from __future__ import annotations

import orjson

from hoss.errors import HossError
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from rescheduler.service import Rescheduler, describe, plan_json
from rescheduler.settings import DEFAULT_MIN_STRANDED_GPUS, ReschedulerSettings


async def run_once(*, kubeconfig: str, redis_url: str, dry_run: bool, node_selector: str = "", max_moves: int = 4,
                   min_stranded_gpus: int = DEFAULT_MIN_STRANDED_GPUS, as_json: bool = False) -> tuple[str, int]:
    """The report of one round, and the exit code (0; 1 when the plan was carried out but did not complete)."""
    settings = ReschedulerSettings(kubeconfig=kubeconfig, redis_url=redis_url, dry_run=dry_run,
                                   node_selector=[p for p in node_selector.split(",") if p.strip()],
                                   max_moves=max_moves, min_pending_seconds=0,
                                   min_stranded_gpus=min_stranded_gpus)
    async with Ledger.from_url(redis_url) as ledger:
        rest = await KubeREST.connect(kubeconfig)
        try:
            result = await Rescheduler(settings, rest=rest, ledger=ledger).round()
        except HossError as error:
            return f"error: {error}", 2
        finally:
            await rest.close()
    record = result.record
    if as_json:
        body = record.to_json() if record is not None else (plan_json(result.plan) if result.plan else None)
        return orjson.dumps(body, option=orjson.OPT_INDENT_2).decode(), 0
    if result.plan is None:
        return describe(None), 0
    header = "dry run: nothing was changed" if dry_run else ""
    lines = [f"outcome: {record.outcome} ({record.detail})"] if record is not None else []
    text = describe(result.plan, lines)
    code = 0 if record is None or record.outcome == "completed" else 1
    return f"{header}\n{text}" if header else text, code
