"""The resolvers' published counters, summed for /status (``resolver``).

Resolver instances publish their counters to Redis hashes ``{hoss}:resolver:<instance>`` (fields ``verdicts``:
JSON object reason -> count, ``recent_denials``: JSON list of denials, ``review_p50_ms`` and ``review_p99_ms``:
their review latency, ``updated_unix``), which expire when the resolver stops; the dispatcher sums them. A field
that does not parse is left out and logged; it never hides the other instances.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping

from pydantic import TypeAdapter, ValidationError

from dispatcher.status import Denial, ResolverInstance, ResolverStatus
from hoss.queue import PREFIX

log = logging.getLogger(__name__)

RESOLVER_STATS_MATCH = f"{PREFIX}:resolver:*"
"""SCAN pattern of the resolvers' stats hashes."""
RECENT_DENIALS = 20
"""How many of the newest denials /status shows."""

_VERDICTS = TypeAdapter(dict[str, int])
_DENIALS = TypeAdapter(list[Denial])


def merge_resolver_stats(stats: Mapping[str, Mapping[str, str]]) -> ResolverStatus:
    """Sum the verdicts of every resolver instance (instance -> its stats hash) and keep the newest denials.

    A field that does not parse is left out of the sum and logged; it never hides the other instances.
    """
    verdicts: collections.Counter[str] = collections.Counter()
    denials: list[Denial] = []
    instances: list[ResolverInstance] = []
    for instance, fields in sorted(stats.items()):
        try:
            verdicts.update(_VERDICTS.validate_json(fields.get("verdicts") or "{}"))
        except ValidationError as error:
            log.warning("resolver %s: unreadable verdicts field: %s", instance, error)
        try:
            denials += _DENIALS.validate_json(fields.get("recent_denials") or "[]")
        except ValidationError as error:
            log.warning("resolver %s: unreadable recent_denials field: %s", instance, error)
        try:
            updated: float | None = float(fields["updated_unix"]) if fields.get("updated_unix") else None
        except ValueError:
            log.warning("resolver %s: unreadable updated_unix %r", instance, fields.get("updated_unix"))
            updated = None
        instances.append(ResolverInstance(
            instance=instance, updated_unix=updated,
            review_p50_ms=_optional_float(fields, "review_p50_ms", instance),
            review_p99_ms=_optional_float(fields, "review_p99_ms", instance),
        ))
    denials.sort(key=lambda denial: denial.at, reverse=True)
    return ResolverStatus(
        instances=instances, verdicts=dict(sorted(verdicts.items())), recent_denials=denials[:RECENT_DENIALS]
    )


def _optional_float(fields: Mapping[str, str], name: str, instance: str) -> float | None:
    raw = fields.get(name)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        log.warning("resolver %s: unreadable %s %r", instance, name, raw)
        return None


def resolver_instance(key: str) -> str:
    """``{hoss}:resolver:<instance>`` -> ``<instance>``."""
    return key.removeprefix(RESOLVER_STATS_MATCH.removesuffix("*"))
