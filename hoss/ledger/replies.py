"""Decoding the Lua scripts' flat replies into typed results (`hoss.ledger.results`); every function is pure.

A script answers one flat array that its decoder reads front to back (`Cursor`), in the order the script wrote it;
the two change together. A refusal starts with its kind (``conflict``, ``unknown_node``, ``not_ready``,
``held_elsewhere``), whatever the script. A reply the decoder does not expect raises `LedgerUnavailable`: a script
and its decoder out of step is an outage, never a result to act on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson

from hoss.errors import LedgerNotReadyError, LedgerUnavailable
from hoss.ledger.arguments import ElasticQuota
from hoss.ledger.results import (
    AdmittedEntry,
    BatchResult,
    Change,
    Confirmed,
    ConfirmResult,
    Conflict,
    EntryState,
    GangReserved,
    GangResult,
    HeldElsewhere,
    LedgerLoad,
    LedgerNotReady,
    LedgerSnapshot,
    NeedRequest,
    NodeSnapshot,
    Nomination,
    Overcommit,
    PodEntry,
    QuotaExceeded,
    QuotaReport,
    QuotaUse,
    ReservationOwner,
    ReservationRefused,
    ReservationShares,
    Reserved,
    Stale,
    UnconfirmedCreates,
    UnknownNode,
    VerifyBatch,
)
from hoss.model.resources import ResourceVector

logger = logging.getLogger(__name__)


def as_text(value: object) -> str:
    """A reply item as text: redis-py hands bytes unless it decodes responses."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_texts(values: Iterable[object]) -> list[str]:
    return [as_text(value) for value in values]


class Cursor:
    """Reads a script's flat reply front to back."""

    def __init__(self, reply: Sequence[object]) -> None:
        self._items: Iterator[object] = iter(reply)

    def text(self) -> str:
        return as_text(next(self._items))

    def number(self) -> int:
        return int(self.text())

    def pairs(self) -> dict[str, str]:
        return {self.text(): self.text() for _ in range(self.number())}

    def vector(self) -> ResourceVector:
        return {resource: int(amount) for resource, amount in self.pairs().items()}


def parse_used(text: str) -> ResourceVector:
    """The used totals of a change entry: 'cpu=100,memory=5' -> {'cpu': 100, 'memory': 5}."""
    if not text:
        return {}
    used: ResourceVector = {}
    for part in text.split(","):
        name, _, amount = part.partition("=")
        used[name] = int(amount)
    return used


def parse_amounts(text: str) -> dict[str, int]:
    """'cpu=1000,pods=1' (the ledger's encoding of amounts) as a mapping; a part without '=' is left out."""
    pairs = (part.split("=", 1) for part in text.split(",") if "=" in part)
    return {name: int(amount) for name, amount in pairs}


def conflict(node: str, resource: str, wanted: int, free: int) -> Conflict:
    """A conflict on `node`, or, with no node and a 'quota ...' resource, the namespace's quota refusing."""
    if not node and resource.startswith("quota "):
        return QuotaExceeded(node=node, resource=resource, wanted=wanted, free=free)
    return Conflict(node=node, resource=resource, wanted=wanted, free=free)


def refusal(reply: Sequence[object]) -> Conflict | UnknownNode | LedgerNotReady | HeldElsewhere | None:
    """The typed result of a refusing reply, None for any other reply."""
    cursor = Cursor(reply)
    kind = cursor.text()
    if kind == "conflict":
        return conflict(cursor.text(), cursor.text(), cursor.number(), cursor.number())
    if kind == "unknown_node":
        return UnknownNode(cursor.text())
    if kind == "not_ready":
        return LedgerNotReady(cursor.text())
    if kind == "held_elsewhere":
        return HeldElsewhere(node=cursor.text(), state=entry_state(cursor.text()))
    return None


def ready_or_raise(reply: list[Any]) -> list[Any]:
    """The reply of a write that returns a plain value; not ready raises (there is no result to carry it)."""
    refused = refusal(reply)
    if isinstance(refused, LedgerNotReady):
        raise LedgerNotReadyError(refused.reason)
    return reply


def entry_state(value: str) -> EntryState:
    if value == "assumed":
        return "assumed"
    if value == "bound":
        return "bound"
    if value == "admitted":
        return "admitted"
    raise LedgerUnavailable(f"ledger entry has unknown state {value!r}")


def decode_reserve_reply(reply: Sequence[object]) -> GangResult:
    """The result of reserve.lua; a success is GangReserved with no uids (the caller knows them)."""
    refused = refusal(reply)
    if refused is not None:
        return refused
    if as_text(reply[0]) != "reserved":
        raise LedgerUnavailable(f"unexpected reserve reply {reply!r}")
    return GangReserved((), change=as_text(reply[1]) if len(reply) > 1 else "")


def decode_confirm_reply(reply: Sequence[object]) -> ConfirmResult:
    refused = refusal(reply)
    if refused is not None:
        return refused
    if as_text(reply[0]) == "need_request":
        return NeedRequest()
    cursor = Cursor(reply)
    kind = cursor.text()
    if kind == "unconfirmed":
        node, resource, held, wanted, alloc = cursor.text(), cursor.text(), cursor.number(), cursor.number(), \
            cursor.number()
        return UnconfirmedCreates(node=node, resource=resource, wanted=wanted, free=alloc - held, held=held)
    if kind != "confirmed":
        raise LedgerUnavailable(f"unexpected confirm reply {reply!r}")
    return Confirmed(node=cursor.text(), foreign=cursor.number() == 1)


def decode_batch_result(item: Sequence[object], *, change: str = "") -> BatchResult:
    """One 5-item result of reserve_batch.lua; `change`: the id of the change-stream entry the call wrote."""
    kind, node = as_text(item[0]), as_text(item[1])
    if kind == "reserved":
        return Reserved(node, consumed=as_text(item[2]) == "consumed", change=change)
    if kind == "bound":
        return HeldElsewhere(node=node, state="bound")
    if kind == "stale":
        return Stale(node)
    if kind == "conflict":
        return conflict(node, as_text(item[2]), int(as_text(item[3])), int(as_text(item[4])))
    if kind == "unknown":
        return UnknownNode(node)
    raise LedgerUnavailable(f"unexpected reserve_batch result {list(item)!r}")


def decode_batch_reply(reply: Sequence[object]) -> list[BatchResult] | LedgerNotReady:
    """The reply of reserve_batch.lua: 5 items per pod, in order, then the id of the change-stream entry the call
    wrote (when it wrote one); or not ready."""
    refused = refusal(reply) if reply and as_text(reply[0]) == "not_ready" else None
    if isinstance(refused, LedgerNotReady):
        return refused
    change = as_text(reply[-1]) if len(reply) % 5 == 1 else ""
    return [decode_batch_result(reply[i:i + 5], change=change) for i in range(0, len(reply) - len(reply) % 5, 5)]


def decode_hold_moves_reply(reply: Sequence[object]) -> Conflict | UnknownNode | str | None:
    """The reply of hold_moves.lua: None when held, the node of a pending pod that holds an entry already, or the
    refusal of the first hold that does not fit."""
    kind = as_text(reply[0])
    if kind == "held":
        return None
    if kind == "placed":
        return as_text(reply[2])
    refused = refusal(reply)
    if isinstance(refused, Conflict | UnknownNode):
        return refused
    raise LedgerUnavailable(f"unexpected hold_moves reply {reply!r}")


def decode_reservation_owners(uids: Sequence[str], reply: Sequence[object]) -> dict[str, ReservationShares]:
    """The reply of reservation_owners.lua for `uids`: per uid, whether its entry is there, its room and its owners'
    shares. Only the Reservations whose entry is there are answered."""
    found: dict[str, ReservationShares] = {}
    at = 0
    for uid in uids:
        held, room, count = int(as_text(reply[at])), as_text(reply[at + 1]), int(as_text(reply[at + 2]))
        at += 3
        owners = []
        for _ in range(count):
            owner, pod, node, state, share = (as_text(v) for v in reply[at:at + 5])
            owners.append(ReservationOwner(uid=owner, pod=pod, node=node, state=state, share=parse_amounts(share)))
            at += 5
        if held:
            found[uid] = ReservationShares(room=parse_amounts(room), owners=tuple(owners))
    return found


def decode_refusals(flat: Sequence[str]) -> list[ReservationRefused]:
    """uid, pod, node, resource, wanted, free sextuples of Reservations refused room (bind_many.lua, rebuild.lua)."""
    return [ReservationRefused(uid=flat[i], pod=flat[i + 1], node=flat[i + 2], resource=flat[i + 3],
                               wanted=int(flat[i + 4]), free=int(flat[i + 5])) for i in range(0, len(flat), 6)]


def decode_bind_reply(reply: Sequence[object]) -> list[Overcommit | ReservationRefused]:
    """The reply of bind_many.lua: after its status pair, the count of overcommitting bindings, their pod/node/what
    triples, then the Reservations refused room."""
    overcommitted = int(as_text(reply[2]))
    flat = as_texts(reply[3:])
    split = 3 * overcommitted
    overcommits: list[Overcommit | ReservationRefused] = [
        Overcommit(pod=flat[i], node=flat[i + 1], what=flat[i + 2]) for i in range(0, split, 3)]
    return [*overcommits, *decode_refusals(flat[split:])]


def decode_verify_batch(reply: Sequence[object]) -> VerifyBatch:
    """The reply of verify_due.lua: the Redis time, then the admitted entries due."""
    cursor = Cursor(reply)
    now = cursor.number()
    entries = []
    for _ in range(cursor.number()):
        uid, node, pod, via, admitted = (cursor.text() for _ in range(5))
        entries.append(AdmittedEntry(uid=uid, node=node, pod=pod, via=via, admitted_ms=int(admitted),
                                     answered=cursor.number() == 1))
    return VerifyBatch(now_ms=now, entries=entries)


def decode_load_reply(reply: Sequence[object]) -> LedgerLoad:
    """The reply of load.lua: ready flag, epoch, the last change id, every node, every pod entry."""
    cursor = Cursor(reply)
    ready = cursor.number() == 1
    epoch = cursor.text() or None
    last = cursor.text()
    nodes = {}
    for _ in range(cursor.number()):
        name = cursor.text()
        spec = cursor.text()
        nodes[name] = (spec, parse_used(cursor.text()))
    pods = [(cursor.text(), cursor.text(), cursor.text()) for _ in range(cursor.number())]
    return LedgerLoad(ready=ready, epoch=epoch, last_change=last, nodes=nodes, pods=pods)


def decode_snapshot_reply(reply: Sequence[object]) -> LedgerSnapshot:
    cursor = Cursor(reply)
    ready = cursor.number() == 1
    epoch = cursor.text() or None
    nodes: dict[str, NodeSnapshot] = {}
    for _ in range(cursor.number()):
        name = cursor.text()
        alloc, used, assumed, bound = cursor.vector(), cursor.vector(), cursor.number(), cursor.number()
        admitted = cursor.number()
        nodes[name] = NodeSnapshot(alloc=alloc, used=used, assumed=assumed, bound=bound, labels=cursor.pairs(),
                                   admitted=admitted)
    return LedgerSnapshot(ready=ready, epoch=epoch, nodes=nodes)


def decode_entries_reply(reply: Sequence[object]) -> list[PodEntry]:
    cursor = Cursor(reply)
    entries = []
    for _ in range(cursor.number()):
        uid, node, pod, state, owner, deadline = (cursor.text() for _ in range(6))
        entries.append(
            PodEntry(
                uid=uid,
                pod=pod,
                node=node,
                state=entry_state(state),
                owner=owner,
                deadline_ms=int(deadline) if deadline else None,
                request=cursor.vector(),
            )
        )
    return entries


def decode_quotas_reply(reply: Sequence[object]) -> QuotaReport:
    """The reply of quotas.lua."""
    cursor = Cursor(reply)
    quotas = []
    for _ in range(cursor.number()):
        namespace = cursor.text()
        quota = ElasticQuota(namespace=namespace, min=cursor.vector(), max=cursor.vector())
        quotas.append(QuotaUse(quota=quota, used=cursor.vector()))
    return QuotaReport(quotas=quotas, sum_min=cursor.vector(), sum_used=cursor.vector())


def decode_used_drift(reply: Sequence[object]) -> list[str]:
    """The reply of used_audit.lua: node, resource, kept and summed quadruples, as messages."""
    flat = as_texts(reply)
    return [f"node {flat[i]} {flat[i + 1]}: used {flat[i + 2]}, entries {flat[i + 3]}" for i in range(0, len(flat), 4)]


def decode_quota_drift(reply: Sequence[object]) -> list[str]:
    """The reply of quota_audit.lua: namespace-or-sum/resource, kept and summed triples, as messages."""
    flat = as_texts(reply)
    return [f"quota {flat[i]}: kept {flat[i + 1]}, entries {flat[i + 2]}" for i in range(0, len(flat), 3)]


def decode_change(entry_id: str, fields: object) -> Change:
    """A change-stream entry; redis-py hands the fields as a dict (insertion order kept) or a flat list."""
    if isinstance(fields, dict):
        pairs = [(as_text(k), as_text(v)) for k, v in fields.items()]
    else:
        flat = [as_text(v) for v in fields]  # type: ignore[attr-defined]
        pairs = list(zip(flat[0::2], flat[1::2], strict=True))
    if not pairs or pairs[0][0] != "t":
        raise LedgerUnavailable(f"change {entry_id} has no kind: {pairs[:2]!r}")
    items = [(key[2:] if key.startswith("n:") else key, value) for key, value in pairs[1:]]
    return Change(id=entry_id, kind=pairs[0][1], items=items)


def decode_changes(reply: Sequence[Sequence[Any]] | None) -> list[Change]:
    """An XREAD reply of the change stream: every entry of its one stream, in order (none for an empty reply)."""
    changes: list[Change] = []
    for _stream, entries in reply or []:
        for entry_id, fields in entries:
            changes.append(decode_change(as_text(entry_id), fields))
    return changes


def decode_nominations(flat: Sequence[object]) -> dict[str, Nomination]:
    """uid/JSON pairs (nominations.lua) as Nominations; an unreadable one is left out."""
    result: dict[str, Nomination] = {}
    for i in range(0, len(flat) - 1, 2):
        uid = as_text(flat[i])
        try:
            value = orjson.loads(as_text(flat[i + 1]))
            request = {str(k): int(v) for k, v in dict(value.get("request") or {}).items()}
            result[uid] = Nomination(uid=uid, node=str(value["node"]), priority=int(value.get("priority") or 0),
                                     request=request, owner=str(value.get("owner") or ""),
                                     pin=bool(value.get("pin")))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            logger.warning("nomination of %s is unreadable: %r", uid, flat[i + 1])
    return result
