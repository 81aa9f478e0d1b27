"""What the ledger's operations answer: typed results, plain frozen data (`hoss.ledger.replies` decodes them).

A refusal is a result, not an exception: a reservation that does not fit answers `Conflict` (or `UnknownNode`,
`LedgerNotReady`, `HeldElsewhere`, ...), so callers match on the type; only a Redis that cannot answer raises
(`hoss.errors.LedgerUnavailable`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hoss.ledger.arguments import ElasticQuota
from hoss.model.resources import ResourceVector

EntryState = Literal["assumed", "admitted", "bound"]


@dataclass(frozen=True)
class Reserved:
    """The pod holds an assumed entry on `node` (new, refreshed or moved there), or is already bound there."""

    node: str
    consumed: bool = False
    """The pod took a share of the room of the Reservation it named (`BatchPod.reservation`); the share goes back
    to the Reservation when the pod's entry goes."""
    change: str = field(default="", compare=False)
    """The id of the change-stream entry the reserving call wrote ('' when unknown): its totals count the pod."""


@dataclass(frozen=True)
class ReservationOwner:
    """An owner pod holding a share of a Reservation's room (`Ledger.reservation_owners`)."""

    uid: str
    pod: str
    """namespace/name"""
    node: str
    state: str
    share: Mapping[str, int]


@dataclass(frozen=True)
class ReservationShares:
    """A Reservation's entry: the room it still holds and its owners' shares."""

    room: Mapping[str, int]
    owners: tuple[ReservationOwner, ...]


@dataclass(frozen=True)
class GangReserved:
    """Every member of the gang holds an entry on its node."""

    uids: tuple[str, ...]
    change: str = field(default="", compare=False)
    """The id of the change-stream entry the call wrote: its totals count every member."""


@dataclass(frozen=True)
class Overcommit:
    """The sync bound a pod on a node that had no room for it (the apiserver's truth, recorded and counted)."""

    pod: str
    node: str
    what: str
    """e.g. 'cpu used 5000 of 4000'"""


@dataclass(frozen=True)
class ReservationRefused:
    """A Reservation marked Available on a node without room for it: the ledger holds nothing for it, so its owners
    cannot take room from it (its status is a claim; see reservation_refusal in hoss/ledger/lua/common.lua)."""

    uid: str
    pod: str
    """'Reservation/<name>'"""
    node: str
    resource: str
    """the first resource that does not fit"""
    wanted: int
    free: int


@dataclass(frozen=True)
class Rebuilt:
    """A rebuild's outcome: the new epoch, and the Reservations it did not let hold room."""

    epoch: str
    refused: tuple[ReservationRefused, ...] = ()


@dataclass(frozen=True)
class AdmittedEntry:
    """An admitted entry the sync should check: does the pod run on the node, or did the admitted write fail?"""

    uid: str
    node: str
    pod: str
    """namespace/name"""
    via: str
    admitted_ms: int
    """Redis time of the (last) admission"""
    answered: bool
    """the binder saw the apiserver answer its binding with an error: the write is over"""


@dataclass(frozen=True)
class VerifyBatch:
    """`Ledger.verify_due`: the Redis time of the read and the entries due."""

    now_ms: int
    entries: list[AdmittedEntry]


@dataclass(frozen=True)
class Confirmed:
    """The binding may go ahead. `foreign`: there was no reservation, so the call fit-checked and added one."""

    node: str
    foreign: bool


@dataclass(frozen=True)
class Conflict:
    """`resource` does not fit on `node`: the pod (or gang members on that node) want `wanted`, `free` is left.

    ``free`` is allocatable minus used, counting what the pods' own current reservations give back; it is
    negative when the node is overcommitted.
    """

    node: str
    resource: str
    wanted: int
    free: int

    def __str__(self) -> str:
        return f"{self.resource} does not fit on node {self.node}: wanted {self.wanted}, free {self.free}"


@dataclass(frozen=True)
class QuotaExceeded(Conflict):
    """The pod's namespace's elastic quota refuses it (on every node): `resource` is the whole message, e.g.
    'quota team-a: nvidia.com/gpu 6 used + 2 requested > max 6'; `free` is what the quota leaves. A Conflict,
    so code that knows only conflicts still refuses."""

    @property
    def namespace(self) -> str:
        return self.resource.removeprefix("quota ").split(":", 1)[0]

    def __str__(self) -> str:
        return self.resource


@dataclass(frozen=True)
class UnconfirmedCreates(Conflict):
    """A user's creates of pods on nodes that the sync has not yet seen bound or failed hold `held` of `resource`
    already, and the pod's `wanted` is more than `free`, what the allocatable of its node leaves beside them: one
    user's unconfirmed creates hold at most one node's room (confirm.lua). A Conflict, so code that knows only
    conflicts still refuses."""

    held: int = 0

    def __str__(self) -> str:
        return (f"unconfirmed creates hold {self.held} of {self.resource}; {self.wanted} more would pass node "
                f"{self.node}'s allocatable {self.held + self.free}")


@dataclass(frozen=True)
class QuotaUse:
    """An elastic quota and what its namespace's entries (assumed, admitted and bound) use now."""

    quota: ElasticQuota
    used: ResourceVector

    @property
    def borrowed(self) -> ResourceVector:
        """What the namespace uses above its min, of the resources its quota names (in min or max)."""
        named = self.quota.min.keys() | self.quota.max.keys()
        return {r: a - self.quota.min.get(r, 0) for r, a in self.used.items()
                if r in named and a > self.quota.min.get(r, 0)}


@dataclass(frozen=True)
class QuotaReport:
    """Every elastic quota with its use, and the sums the borrowing rule compares (used <= min)."""

    quotas: list[QuotaUse]
    sum_min: ResourceVector
    sum_used: ResourceVector


@dataclass(frozen=True)
class UnknownNode:
    """The ledger has no node of that name (not synced yet, or deleted)."""

    node: str


@dataclass(frozen=True)
class LedgerNotReady:
    """The ledger has not been rebuilt since Redis started or lost its data; nothing may be admitted."""

    reason: str


@dataclass(frozen=True)
class NeedRequest:
    """A confirm without a request found no entry for the pod: call again with the pod's request."""


@dataclass(frozen=True)
class Stale:
    """The dispatcher marked the pod changed (a newer digest) or gone since this version was queued."""

    marker: str


@dataclass(frozen=True)
class HeldElsewhere:
    """The pod already holds resources on another node, in `state`."""

    node: str
    state: EntryState


ReserveResult = Reserved | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere
GangResult = GangReserved | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere
ConfirmResult = Confirmed | Conflict | UnknownNode | LedgerNotReady | HeldElsewhere | NeedRequest
BatchResult = Reserved | Conflict | UnknownNode | Stale | HeldElsewhere
"""Per pod of `Ledger.reserve_batch`: reserved on a node, bound already (HeldElsewhere with state bound, on
whatever node), stale, or refused everywhere (the last candidate's conflict, or unknown nodes)."""


@dataclass(frozen=True)
class Nomination:
    """Room held on `node` for a preempting pod (see 'Nominations' in hoss/ledger/lua/common.lua)."""

    uid: str
    node: str
    priority: int
    request: ResourceVector
    owner: str = ""
    """For the rescheduler's hold of a moved pod's room: the controller whose replacement pod claims it."""
    pin: bool = False
    """A rescheduler's hold (`Ledger.hold_moves`): workers steer the pod it is for onto its node."""


@dataclass(frozen=True)
class LedgerLoad:
    """What a worker reads at start (and after a rebuild): every node's description and used totals, and the
    change-stream id to follow from."""

    ready: bool
    epoch: str | None
    last_change: str
    nodes: dict[str, tuple[str, ResourceVector]]
    """node -> (compact description JSON, '' when the sync has not written one; used totals)"""
    pods: list[tuple[str, str, str]] = field(default_factory=list)
    """Every pod entry as (uid, node, meta)."""


@dataclass(frozen=True)
class Change:
    """One change-stream entry: ``kind`` u (used totals, pods placed and removed), s (node description), d (node
    gone), r (rebuilt)."""

    id: str
    kind: str
    items: list[tuple[str, str]]
    """(node, used text | spec JSON | '') pairs; for r: [("epoch", epoch)]. A u entry then holds
    ("p:<uid>", "<node>\n<meta>") for a pod that holds an entry after the call and ("x:<uid>", node) for one that
    holds none any more (node names cannot contain ':')."""


@dataclass(frozen=True)
class NodeSnapshot:
    """One node as the ledger sees it: allocatable, used (bound + assumed), entry counts and labels."""

    alloc: ResourceVector
    used: ResourceVector
    assumed: int
    """number of assumed entries on the node"""
    bound: int
    """number of bound entries on the node"""
    labels: dict[str, str] = field(default_factory=dict)
    admitted: int = 0
    """number of admitted entries on the node (the webhook allowed them; not bound yet as far as the sync saw)"""

    @property
    def free(self) -> ResourceVector:
        """alloc - used for every resource either side names; negative when overcommitted."""
        return {r: self.alloc.get(r, 0) - self.used.get(r, 0) for r in {*self.alloc, *self.used}}


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ready flag, the epoch of the last rebuild and every node, read at one instant."""

    ready: bool
    epoch: str | None
    nodes: dict[str, NodeSnapshot]


@dataclass(frozen=True)
class PodEntry:
    """One pod's hold on a node, as stored."""

    uid: str
    pod: str
    node: str
    state: EntryState
    owner: str
    deadline_ms: int | None
    """Redis server time in milliseconds after which an assumed entry expires; None for bound entries"""
    request: ResourceVector
