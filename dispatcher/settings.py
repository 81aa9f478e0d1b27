"""Settings of ``hoss-dispatcher`` (flags, env ``HOSS_*``, YAML; see hoss.settings for precedence)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from hoss.settings import AccessSettings, RedisURL, check_lease_timing, default_identity


class DispatcherSettings(AccessSettings):
    """Settings of the dispatcher: pending-pod intake, routing to workers, reclaim, leader election, /status."""

    kubeconfig: str | None = None
    """Kubeconfig to reach the apiserver; unset means the in-cluster service account."""
    redis_url: RedisURL = "redis://127.0.0.1:6379/0"
    """Redis holding the ledger, the worker registry and the work queues: redis://user:password@host:port/db;
    rediss:// for TLS (see hoss-resolver's redis_url)."""
    scheduler_names: list[str] = Field(default_factory=lambda: ["hoss"], min_length=1)
    """Pods whose spec.schedulerName is one of these are dispatched (comma-separated in env and flags)."""
    default_policy: str = Field(default="default", min_length=1)
    """Policy of a pod without the hoss.io/policy label."""
    host: str = "0.0.0.0"
    """Address the HTTP server (/status, /metrics, /healthz, the dashboard) listens on; 127.0.0.1 keeps it to
    the pod (kubectl port-forward still reaches it)."""
    port: int = Field(default=8080, ge=0, le=65535)
    """Port the HTTP server listens on (0: any free port)."""
    lease_name: str = Field(default="hoss-dispatcher", min_length=1)
    """Name of the coordination.k8s.io/v1 Lease that elects the active dispatcher."""
    lease_namespace: str = Field(default="hoss-system", min_length=1)
    """Namespace of the Lease."""
    lease_duration_seconds: int = Field(default=15, ge=2)
    """How long a Lease holds without renewal before another replica may take it over."""
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    """A leader that could not renew for this long stops dispatching (must be below lease_duration_seconds)."""
    renew_interval_seconds: float = Field(default=2.0, gt=0)
    """How often the leader renews the Lease and a follower checks whether it may take it over."""
    identity: str = Field(default_factory=default_identity, min_length=1, max_length=253)
    """This replica's name in the Lease's holderIdentity (default hostname-pid)."""
    reclaim_interval_seconds: float = Field(default=1.0, gt=0)
    """How often the leader looks for dead workers, moves their work and retries pods waiting for a worker."""
    stall_seconds: float = Field(default=15.0, gt=0)
    """A worker whose heartbeat lives but which has decided nothing this long after work was sent to it is
    stuck: its work is taken back as a dead worker's is (it re-registers when it moves again)."""
    no_worker_event_interval_seconds: float = Field(default=30.0, gt=0)
    """Least time between two NoWorkerForPolicy events about the same pod."""
    informer_lag_seconds: float = Field(default=5.0, ge=0)
    """How far the pending-pod watch may lag the workers: a pod a worker acknowledged but still seen pending is
    dispatched again, and a dispatched uid never seen pending is forgotten, only after this long."""
    pack_depth: int = Field(default=256, ge=0)
    """A worker keeps getting new pods until about this many wait for its decision (as the dispatcher estimates
    from its heartbeat and its measured decision rate); only then is another worker engaged, and once all are,
    pods are spread (power of two choices). A load that one worker keeps up with stays on it: fewer, fuller
    batches, less CPU per pod, and the others' feeds pause (dispatcher/routing.py, hoss/framework/feed.py). A worker
    reads up to 128 items at once (its read batch), so a heartbeat right after a read says 128 are ready: a depth of 64
    engaged other workers for nothing several times a run (on the local plane, 4 workers and 3,000 pods: worker
    CPU 1.59 ms per pod at 64 against 1.38 at 256). At the rates workers decide (several hundred to a few thousand
    pods a second) 256 pods are a fraction of a second. 0 spreads every pod."""
    failed_dependency: Literal["fail", "wait"] = "fail"
    """What becomes of a pod whose hoss.io/depends-on Job or PodGroup failed: fail (the pod is set Failed with
    reason DependencyFailed, so its Job counts the failure) or wait (it stays Pending, told why, and starts if the
    dependency is re-created and holds)."""

    @model_validator(mode="after")
    def _lease_timing_is_ordered(self) -> Self:
        check_lease_timing(self.renew_interval_seconds, self.renew_deadline_seconds, self.lease_duration_seconds)
        return self
