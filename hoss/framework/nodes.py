"""The worker's node table: every node as rows of numpy arrays, so plugins filter and score all nodes at once.

One row per node. Row order is arbitrary and changes when a node is removed (the last row moves into the hole),
so a row number is only meaningful until the next mutation; plugins get the table, compute over whole columns,
and hand back arrays indexed by row.

Columns:
- resources: `alloc` and `used` are int64 matrices (rows x `resources`), base units as in
  `hoss.model.resources` (milli-CPU, bytes, counts). The resource axis only grows; a resource a node does not
  report is 0 there, so a GPU pod never fits a CPU node. `used` is what the ledger holds on the node (bound +
  assumed), fed by the worker; it is kept across node updates and reset when a node is removed.
- labels: per label key an int32 code per row (-1 = label absent) and the key's value list, so a selector is a
  table lookup over codes instead of a Python loop over nodes.
- taints: each distinct taint (key, value, effect) is a column of `taint_positions`; a cell holds the taint's
  position in the node's own ``spec.taints`` (-1 = absent), so "the first untolerated taint" is an argmin.
- `unschedulable` (spec.unschedulable) and `ready` (the Ready condition) as bool arrays.

The table also carries the pod index (`hoss.framework.podindex.PodIndex`, its base class): the pods that hold
ledger entries on the nodes. Raw nodes are parsed by `hoss.framework.node.parse_node`.

Invariants: `names[i]` and `index` are inverse; storage rows at and beyond `len(table)` are blank (zero usage,
no labels, no taints), so appending a row needs no clearing. Arrays handed out are read-only views; the table
changes only through its methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from hoss.framework.errors import UnknownNodeError
from hoss.framework.node import NodeView, Taint, parse_node
from hoss.framework.podindex import HostPort, PodIndex
from hoss.model.resources import ResourceVector

if TYPE_CHECKING:
    from hoss.framework.pod import PodView

_MIN_CAPACITY = 64
_ABSENT = -1


def stream_position(text: str) -> tuple[int, int]:
    """A Redis stream id ('1700000000000-3') as a comparable pair."""
    millis, _, sequence = text.partition("-")
    return int(millis), int(sequence or 0)


class NodeTable(PodIndex):
    """All nodes as numpy rows, and the pods on them (`PodIndex`); see the module docstring for the columns and
    invariants."""

    devices_taken: frozenset[tuple[str, str, str]] = frozenset()
    """DRA devices the worker's current decision has given to other pods already (a gang's earlier members, in a
    `workers.gang.ScratchUsage`): DynamicResources leaves them out. Empty on the worker's own table."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        """Node name per row."""
        self.index: dict[str, int] = {}
        """Node name -> row."""
        self.resources: list[str] = []
        """Resource name per column of `alloc` and `used`; only grows."""
        self.labels: list[dict[str, str]] = []
        """Labels per row."""
        self.taints: list[tuple[Taint, ...]] = []
        """Taints per row, in the node's order."""
        self.taint_kinds: list[Taint] = []
        """Taint per column of `taint_positions`; only grows."""
        self._resource_index: dict[str, int] = {}
        self._taint_index: dict[Taint, int] = {}
        self._capacity = _MIN_CAPACITY
        self._alloc = np.zeros((self._capacity, 0), dtype=np.int64)
        self._used = np.zeros((self._capacity, 0), dtype=np.int64)
        self._unschedulable = np.zeros(self._capacity, dtype=np.bool_)
        self._ready = np.zeros(self._capacity, dtype=np.bool_)
        self._taint_positions = np.full((self._capacity, 0), _ABSENT, dtype=np.int32)
        self._label_codes: dict[str, NDArray[np.int32]] = {}
        self._label_values: dict[str, list[str]] = {}
        self._label_value_codes: dict[str, dict[str, int]] = {}
        self._local: dict[str, dict[str, int]] = {}
        """Per node, what this worker counts there that the ledger totals it last applied do not hold yet
        (`hold_locally`, `expect`); `set_totals` keeps it on top of the ledger's totals."""
        self._expected: list[tuple[tuple[int, int], str, ResourceVector]] = []
        """(change-stream id, node, request) of reservations counted locally until the feed applies that entry."""

    def __len__(self) -> int:
        return len(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self.index

    # Read-only views over the live rows.

    @property
    def alloc(self) -> NDArray[np.int64]:
        """Allocatable per row and resource column."""
        return self._live(self._alloc)

    @property
    def used(self) -> NDArray[np.int64]:
        """Ledger usage (bound + assumed) per row and resource column."""
        return self._live(self._used)

    @property
    def unschedulable(self) -> NDArray[np.bool_]:
        """spec.unschedulable per row (cordoned nodes)."""
        return self._live(self._unschedulable)

    @property
    def ready(self) -> NDArray[np.bool_]:
        """The Ready condition per row (informational: kube-scheduler filters not-ready nodes by their taint)."""
        return self._live(self._ready)

    @property
    def taint_positions(self) -> NDArray[np.int32]:
        """Per row and `taint_kinds` column: the taint's position in the node's taint list, -1 when absent."""
        return self._live(self._taint_positions)

    def free(self) -> NDArray[np.int64]:
        """alloc - used per row and resource column; negative where a node is overcommitted."""
        return self.alloc - self.used

    def column_of(self, resource: str) -> int | None:
        """The resource's column, or None when no node reports or uses it."""
        return self._resource_index.get(resource)

    def alloc_column(self, resource: str) -> NDArray[np.int64]:
        """Allocatable of one resource per row (0 where the node does not report it)."""
        column = self._resource_index.get(resource)
        return np.zeros(len(self), dtype=np.int64) if column is None else self.alloc[:, column]

    def used_column(self, resource: str) -> NDArray[np.int64]:
        """Usage of one resource per row."""
        column = self._resource_index.get(resource)
        return np.zeros(len(self), dtype=np.int64) if column is None else self.used[:, column]

    def free_column(self, resource: str) -> NDArray[np.int64]:
        """Free amount of one resource per row; negative where the node is overcommitted."""
        return self.alloc_column(resource) - self.used_column(resource)

    def request_on(self, name: str, pod: PodView) -> ResourceVector:
        """The pod's request as node `name` counts it (`PodView.counted_on`: without the extended resources the
        node leaves to DRA), which the ledger holds there; raises `UnknownNodeError`."""
        if not pod.dra_resources:
            return pod.request
        row = self.row(name)
        return pod.counted_on({resource: int(self.alloc[row, column]) for resource in pod.dra_resources
                               if (column := self._resource_index.get(resource)) is not None})

    def used_of(self, name: str) -> ResourceVector:
        """One node's usage as a resource vector (resources at 0 left out); raises `UnknownNodeError`."""
        row = self._used[self.row(name)]
        return {resource: int(row[column]) for resource, column in self._resource_index.items() if row[column]}

    def label_codes(self, key: str) -> NDArray[np.int32]:
        """Per row the code of the node's value for label `key` (an index into `label_values(key)`), -1 if absent."""
        codes = self._label_codes.get(key)
        return np.full(len(self), _ABSENT, dtype=np.int32) if codes is None else self._live(codes)

    def label_code(self, key: str, value: str) -> int | None:
        """The code of `value` for label `key`, or None when no node has had that value."""
        return self._label_value_codes.get(key, {}).get(value)

    def label_values(self, key: str) -> Sequence[str]:
        """The values label `key` has or had on some node, indexed by code; may hold values no node has now."""
        return self._label_values.get(key, [])

    def row(self, name: str) -> int:
        """The node's current row; raises `UnknownNodeError`."""
        try:
            return self.index[name]
        except KeyError:
            raise UnknownNodeError(name) from None

    # Mutations.

    def upsert_node(self, node: Mapping[str, Any]) -> NodeView:
        """Add or replace a node from its raw JSON (usage is kept on replace); raises `NodeSpecError`."""
        view = parse_node(node)
        self.upsert(view)
        return view

    def upsert(self, node: NodeView) -> None:
        """Add or replace a parsed node; its usage is kept on replace and starts at 0 for a new node."""
        row = self.index.get(node.name)
        if row is None:
            row = len(self.names)
            self._reserve_rows(row + 1)
            self.names.append(node.name)
            self.labels.append({})
            self.taints.append(())
            self.index[node.name] = row
        else:
            self._clear_labels(row)
            self._taint_positions[row] = _ABSENT
        self._alloc[row] = 0
        for resource, amount in node.allocatable.items():
            column = self._resource_column(resource)  # may replace the arrays: look it up before indexing them
            self._alloc[row, column] = amount
        self.labels[row] = dict(node.labels)
        for key, value in node.labels.items():
            codes = self._label_column(key)
            codes[row] = self._label_code(key, value)
        self.taints[row] = node.taints
        for position, taint in reversed(list(enumerate(node.taints))):
            # Reversed, so a taint listed twice keeps its first position.
            column = self._taint_column(taint)
            self._taint_positions[row, column] = position
        self._unschedulable[row] = node.unschedulable
        self._ready[row] = node.ready

    def remove_node(self, name: str) -> bool:
        """Drop a node; the last row moves into its place. False when the node was not in the table."""
        for uid in list(self.pods_on.get(name, ())):
            self.remove_pod(uid)  # the ledger dropped the node's entries with it
        row = self.index.pop(name, None)
        if row is None:
            return False
        self._local.pop(name, None)
        last = len(self.names) - 1
        self._clear_labels(row)
        if row != last:
            moved = self.names[last]
            self.names[row] = moved
            self.index[moved] = row
            self.labels[row] = self.labels[last]
            self.taints[row] = self.taints[last]
            for key in self.labels[last]:
                codes = self._label_codes[key]
                codes[row] = codes[last]
                codes[last] = _ABSENT
            for array in (self._alloc, self._used, self._unschedulable, self._ready, self._taint_positions):
                array[row] = array[last]
        self._alloc[last] = 0
        self._used[last] = 0
        self._unschedulable[last] = False
        self._ready[last] = False
        self._taint_positions[last] = _ABSENT
        self.names.pop()
        self.labels.pop()
        self.taints.pop()
        return True

    def set_totals(self, name: str, totals: Mapping[str, int]) -> None:
        """The ledger's bound + assumed totals for the node (a change-stream entry, a load or a read): the node's
        usage becomes them plus what this worker counts there that they do not hold yet (`hold_locally`,
        `expect`). Entries carry totals, so the last one applied is the ledger's truth at that moment."""
        self.set_used(name, totals)
        local = self._local.get(name)
        if local:
            self.add_used(name, local)

    def hold_locally(self, name: str, amount: Mapping[str, int]) -> None:
        """Count `amount` on the node until `drop_locally` takes it off, whatever totals arrive in between (a
        decision's tentative placement while its reservation call is under way)."""
        local = self._local.setdefault(name, {})
        for resource, units in amount.items():
            local[resource] = local.get(resource, 0) + units
        self.add_used(name, amount)

    def drop_locally(self, name: str, amount: Mapping[str, int]) -> None:
        """Take off what `hold_locally` (or a settled `expect`) counted; nothing when the node left the table
        since (its local count went with it)."""
        local = self._local.get(name)
        if local is None:
            return
        for resource, units in amount.items():
            left = local.get(resource, 0) - units
            if left:
                local[resource] = left
            else:
                local.pop(resource, None)
        if not local:
            del self._local[name]
        self.add_used(name, {resource: -units for resource, units in amount.items()})

    def expect(self, name: str, amount: Mapping[str, int], change: str, applied: str) -> None:
        """The ledger reserved `amount` on the node in the call that wrote change-stream entry `change`; `applied`
        is the last entry the feed applied. Entry applied already: its totals count the reservation, nothing to
        do. Else count it locally until `settle` sees that entry applied (a call's reply and the feed's read of
        its entry arrive on different connections, in either order). Without an entry id (none written), count
        it until the next totals for the node replace it."""
        if not change:
            self.add_used(name, amount)
            return
        position = stream_position(change)
        if position <= stream_position(applied):
            return
        self.hold_locally(name, amount)
        self._expected.append((position, name, dict(amount)))

    def settle(self, applied: str) -> None:
        """The feed applied every entry up to `applied`: reservations expected in those entries are in the
        totals now, so stop counting them locally."""
        if not self._expected:
            return
        position = stream_position(applied)
        keep = []
        for expected in self._expected:
            if expected[0] <= position:
                self.drop_locally(expected[1], expected[2])
            else:
                keep.append(expected)
        self._expected = keep

    def set_used(self, name: str, used: Mapping[str, int]) -> None:
        """Replace the node's usage as it stands in this table (a what-if put back); resources not named are 0.
        The ledger's totals go through `set_totals`."""
        row = self.row(name)
        self._used[row] = 0
        for resource, amount in used.items():
            column = self._resource_column(resource)
            self._used[row, column] = amount

    def add_used(self, name: str, amount: Mapping[str, int]) -> None:
        """Add a pod's request to the node's usage (the worker reserved it)."""
        row = self.row(name)
        for resource, units in amount.items():
            column = self._resource_column(resource)
            self._used[row, column] += units

    def sub_used(self, name: str, amount: Mapping[str, int]) -> None:
        """Take a pod's request off the node's usage (the reservation was released)."""
        self.add_used(name, {resource: -units for resource, units in amount.items()})

    def port_taken(self, port: HostPort) -> NDArray[np.bool_]:
        """Rows of the nodes where a pod holds a host port that conflicts with `port` (kube-scheduler's rule)."""
        taken = np.zeros(len(self), dtype=np.bool_)
        for node in self.nodes_holding(port):
            row = self.index.get(node)
            if row is not None:
                taken[row] = True
        return taken

    # Storage.

    def _live(self, array: NDArray[Any]) -> NDArray[Any]:
        view = array[: len(self.names)]
        view.flags.writeable = False
        return view

    def _reserve_rows(self, rows: int) -> None:
        if rows <= self._capacity:
            return
        capacity = max(rows, 2 * self._capacity)
        self._alloc = _grown_rows(self._alloc, capacity, 0)
        self._used = _grown_rows(self._used, capacity, 0)
        self._unschedulable = _grown_rows(self._unschedulable, capacity, False)
        self._ready = _grown_rows(self._ready, capacity, False)
        self._taint_positions = _grown_rows(self._taint_positions, capacity, _ABSENT)
        for key, codes in self._label_codes.items():
            self._label_codes[key] = _grown_rows(codes, capacity, _ABSENT)
        self._capacity = capacity

    def _resource_column(self, resource: str) -> int:
        column = self._resource_index.get(resource)
        if column is None:
            column = len(self.resources)
            self.resources.append(resource)
            self._resource_index[resource] = column
            self._alloc = _with_column(self._alloc, 0)
            self._used = _with_column(self._used, 0)
        return column

    def _taint_column(self, taint: Taint) -> int:
        column = self._taint_index.get(taint)
        if column is None:
            column = len(self.taint_kinds)
            self.taint_kinds.append(taint)
            self._taint_index[taint] = column
            self._taint_positions = _with_column(self._taint_positions, _ABSENT)
        return column

    def _label_column(self, key: str) -> NDArray[np.int32]:
        codes = self._label_codes.get(key)
        if codes is None:
            codes = np.full(self._capacity, _ABSENT, dtype=np.int32)
            self._label_codes[key] = codes
            self._label_values[key] = []
            self._label_value_codes[key] = {}
        return codes

    def _label_code(self, key: str, value: str) -> int:
        value_codes = self._label_value_codes[key]
        code = value_codes.get(value)
        if code is None:
            values = self._label_values[key]
            if len(values) > 2 * len(self.names) + _MIN_CAPACITY:
                # Values of deleted nodes (e.g. unique hostnames) would pile up; recoding is O(rows), and it
                # happens only after as many new values, so it is O(1) per value over time.
                self._recode_label(key)
                values = self._label_values[key]
            code = len(values)
            values.append(value)
            value_codes[value] = code
        return code

    def _recode_label(self, key: str) -> None:
        codes = self._label_codes[key]
        values: list[str] = []
        value_codes: dict[str, int] = {}
        for row, labels in enumerate(self.labels):
            value = labels.get(key)
            if value is None or codes[row] == _ABSENT:
                # The row being upserted has its new labels set but not yet coded: leave it to the caller.
                continue
            code = value_codes.setdefault(value, len(values))
            if code == len(values):
                values.append(value)
            codes[row] = code
        self._label_values[key] = values
        self._label_value_codes[key] = value_codes

    def _clear_labels(self, row: int) -> None:
        for key in self.labels[row]:
            self._label_codes[key][row] = _ABSENT


def _grown_rows(array: NDArray[Any], rows: int, fill: object) -> NDArray[Any]:
    grown = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
    grown[: array.shape[0]] = array
    return grown


def _with_column(array: NDArray[Any], fill: object) -> NDArray[Any]:
    return np.concatenate([array, np.full((array.shape[0], 1), fill, dtype=array.dtype)], axis=1)
