"""``hoss status``: the dispatcher's /status as a readable table."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from dispatcher.status import SystemStatus


class StatusUnreachable(Exception):
    """The dispatcher's /status could not be read (the URL and the cause in the message)."""


_BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage"})
GIB = 1 << 30
MIB = 1 << 20


def _number(value: float) -> str:
    """At most two decimals, thousands separated, no trailing zeros: 1,001.75 / 2,560 / 0.5 (and <0.01, never a
    misleading 0, for an amount too small to show)."""
    if 0 < value < 0.005:
        return "<0.01"
    text = f"{value:,.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def readable_totals(resource: str, used: int, alloc: int) -> tuple[str, str, str]:
    """``used`` and ``alloc`` (base units: milli-CPU, bytes, counts) in one unit a person reads at a glance,
    and that unit: CPU in cores, memory and storage in GiB (MiB when the larger is under 1 GiB), others counted."""
    if resource == "cpu":
        return _number(used / 1000), _number(alloc / 1000), "cores"
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        size, unit = (GIB, "GiB") if max(used, alloc) >= GIB else (MIB, "MiB")
        return _number(used / size), _number(alloc / size), unit
    return _number(used), _number(alloc), ""


def fetch(url: str, *, token: str | None = None) -> SystemStatus:
    """/status from ``url``; ``token`` is sent as a bearer token (a dispatcher with --access=kubernetes)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return SystemStatus.model_validate(json.loads(response.read()))
    except (urllib.error.URLError, OSError) as error:
        raise StatusUnreachable(f"cannot read {url}: {error}") from error


def render(status: SystemStatus, *, url: str) -> str:
    lines = [f"hoss status from {url}"]
    role = "leader" if status.leader else f"follower (leader: {status.leader_identity or 'none'})"
    lines.append(f"  dispatcher {status.identity}: {role}; redis {status.redis}")
    t = status.throughput
    lines.append(f"  throughput: {t.bound_per_second_1m:.1f} pods/s over the last minute; "
                 f"{t.dispatched_total} dispatched, {t.bound_total} bound; ledger conflicts {status.conflicts}")
    q = status.queues
    lines.append(f"  pending pods: {q.pending_total} ({q.undispatched} not yet sent to a worker)")
    for waiting in q.waiting_for_worker[:10]:
        age = time.time() - waiting.since
        lines.append(f"    {waiting.pod} waits {age:.0f}s: no live worker serves policy {waiting.policy!r}")
    lines.append("")
    lines.append(f"  {'worker':<22}{'alive':<7}{'policies':<24}{'queue':>7}{'in flight':>11}{'bound':>8}"
                 f"{'conflicts':>11}{'heartbeat':>11}")
    for w in status.workers:
        beat = f"{w.heartbeat_age_seconds:.1f}s" if w.heartbeat_age_seconds is not None else "-"
        alive = "NO" if not w.alive else "yes*" if w.routed is False else "yes"
        lines.append(f"  {w.id:<22}{alive:<7}{','.join(w.policies):<24}{w.queue_depth:>7}"
                     f"{w.in_flight:>11}{w.counters.get('bound', 0):>8}{w.counters.get('conflicts', 0):>11}{beat:>11}")
    if any(w.alive and w.routed is False for w in status.workers):
        lines.append("  * alive but not sent new pods: stalled, an unhealthy loop, or started since the leader's "
                     "last read of the heartbeats")
    if status.ledger is not None:
        ledger = status.ledger
        lines.append("")
        lines.append(f"  ledger: {'ready' if ledger.ready else 'NOT READY'}, {ledger.nodes} nodes, "
                     f"{ledger.bound} bound and {ledger.assumed} assumed entries")
        for resource, total in sorted(ledger.resources.items()):
            share = 100 * total.used / total.alloc if total.alloc else 0.0
            used, alloc, unit = readable_totals(resource, total.used, total.alloc)
            lines.append(f"    {resource:<20} {used:>12} / {alloc:<12} {unit:<6} ({share:.0f}% used)")
    if status.resolver is not None:
        resolver = status.resolver
        verdicts = ", ".join(f"{reason} {count}" for reason, count in sorted(resolver.verdicts.items())) or "none"
        lines.append("")
        lines.append(f"  resolver ({len(resolver.instances)} instance(s)) verdicts: {verdicts}")
        for denial in resolver.recent_denials[:5]:
            lines.append(f"    denied {denial.pod} -> {denial.node}: {denial.message}")
    return "\n".join(lines)
