"""Settings of ``hoss-rescheduler`` (flags, env ``HOSS_*``, YAML; see hoss.settings for precedence)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from hoss.settings import AccessSettings, RedisURL, check_lease_timing, default_identity

DEFAULT_MIN_STRANDED_GPUS = 4
"""The periodic pass's default threshold: half an 8-GPU node stranded on partly used nodes."""


class ReschedulerSettings(AccessSettings):
    """Settings of the defragmenting rescheduler."""

    kubeconfig: str | None = None
    """Kubeconfig to reach the apiserver; unset means the in-cluster service account."""
    redis_url: RedisURL = "redis://127.0.0.1:6379/0"
    """Redis holding the ledger: redis://user:password@host:port/db; rediss:// for TLS (see hoss-resolver's
    redis_url)."""
    host: str = "0.0.0.0"
    """Address of the /healthz and /status server."""
    port: int = Field(default=8095, ge=0, le=65535)
    """Port of the /healthz and /status server (0: any free port)."""
    interval_seconds: float = Field(default=10.0, gt=0)
    """How often the leader reads the cluster and looks for a plan (one plan at a time)."""
    min_pending_seconds: float = Field(default=10.0, ge=0)
    """A pending GPU pod is planned for once it has waited this long (the workers had their chance); a pod with
    the hoss.io/defragment scheduling gate at once."""
    min_stranded_gpus: int = Field(default=DEFAULT_MIN_STRANDED_GPUS, ge=0)
    """The periodic pass (moves with no pending pod) runs when the GPUs free on partly used nodes add up to at
    least this many; 0 turns it off. The default, 4, is half an 8-GPU node: as many as a 4-GPU pod needs in one
    piece (the issue's example: 1 + 4 GPUs stranded on two nodes, one move leaves 5 in one piece)."""
    max_moves: int = Field(default=4, ge=1, le=8)
    """Most pods one plan moves."""
    max_evictions_per_minute: int = Field(default=10, ge=1)
    """Most evictions in any minute, across plans: a plan that would exceed it waits."""
    hold_seconds: float = Field(default=120.0, gt=0)
    """How long the room of a plan stays held in the ledger if nobody claims it (a replacement that never
    comes)."""
    outcome_timeout_seconds: float = Field(default=120.0, gt=0)
    """How long a plan waits for every held room to be claimed before it is reported as timed out and what is
    left is dropped."""
    node_selector: list[str] = Field(default_factory=list)
    """Only nodes with all these labels are looked at (key=value, comma-separated in env and flags); empty: every
    GPU node."""
    scheduler_names: list[str] = Field(default_factory=lambda: ["hoss"], min_length=1)
    """Pending pods of these schedulers are planned for (comma-separated in env and flags): hoss's workers place a
    pod on the room held for it; another scheduler would not look for it."""
    movable_owner_kinds: list[str] = Field(
        default_factory=lambda: ["ReplicaSet", "StatefulSet", "Job", "ReplicationController"], min_length=1)
    """Controller kinds whose pods may be moved (their controller creates a replacement elsewhere;
    comma-separated in env and flags)."""
    dry_run: bool = False
    """Plan and report (log, /status) without holding or evicting anything."""
    lease_name: str = Field(default="hoss-rescheduler", min_length=1)
    """Name of the coordination.k8s.io/v1 Lease that elects the active rescheduler."""
    lease_namespace: str = Field(default="hoss-system", min_length=1)
    """Namespace of the Lease."""
    lease_duration_seconds: int = Field(default=15, ge=2)
    """How long a Lease holds without renewal before another replica may take it over."""
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    """A leader that could not renew for this long stops planning (must be below lease_duration_seconds)."""
    renew_interval_seconds: float = Field(default=2.0, gt=0)
    """How often the leader renews the Lease and a follower checks whether it may take it over."""
    identity: str = Field(default_factory=default_identity, min_length=1, max_length=253)
    """This replica's name in the Lease's holderIdentity (default hostname-pid)."""

    @property
    def node_labels(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.node_selector)

    @model_validator(mode="after")
    def _selector_pairs(self) -> Self:
        for item in self.node_selector:
            if "=" not in item or not item.split("=", 1)[0]:
                raise ValueError(f"node_selector: {item!r} is not key=value")
        return self

    @model_validator(mode="after")
    def _lease_timing_is_ordered(self) -> Self:
        check_lease_timing(self.renew_interval_seconds, self.renew_deadline_seconds, self.lease_duration_seconds)
        return self
