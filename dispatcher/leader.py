"""Leader election on a Lease: moved to `hoss.kube.leader` (the resolver elects its syncing replica too); this module
re-exports the same names so the dispatcher and its tests keep importing them from here."""

from __future__ import annotations

from hoss.kube.leader import (
    MICRO_TIME_FORMAT,
    Action,
    KubeLeaseAPI,
    LeaderElector,
    LeaseAPI,
    LeaseConflict,
    LeaseRecord,
    LeaseSpecError,
    decide,
    format_micro_time,
    lease_object,
    parse_lease,
    parse_micro_time,
    released_object,
)

__all__ = [
    "MICRO_TIME_FORMAT",
    "Action",
    "KubeLeaseAPI",
    "LeaderElector",
    "LeaseAPI",
    "LeaseConflict",
    "LeaseRecord",
    "LeaseSpecError",
    "decide",
    "format_micro_time",
    "lease_object",
    "parse_lease",
    "parse_micro_time",
    "released_object",
]
