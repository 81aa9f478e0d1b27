"""Settings of ``hoss-worker`` (flags, env ``HOSS_*``, YAML; see hoss.settings for precedence)."""

from __future__ import annotations

from pydantic import Field

from hoss.model.admission import BINDING_LANES
from hoss.settings import AccessSettings, RedisURL, default_identity

IDLE_WEBHOOK_CONNECTIONS = 25 * BINDING_LANES
"""What the apiserver keeps open to the webhook for bindings: 25 idle connections per binding lane."""


class WorkerSettings(AccessSettings):
    """Settings of one scheduler worker."""

    id: str = Field(default_factory=default_identity, pattern=r"^[A-Za-z0-9._-]{1,63}$")
    """Worker id, unique among live workers (default hostname-pid)."""
    policies: list[str] = Field(default_factory=lambda: ["default"], min_length=1)
    """Policy profiles this worker serves (comma-separated in env and flags)."""
    policies_file: str = "configs/policies.yaml"
    """YAML file with the policy profiles. Read at start (a bad file stops the worker, naming the field) and again
    whenever it changes (config_reload_seconds): a file that parses, and still defines every profile in policies,
    decides from the next batch on; another is refused, the profiles in use are kept, and an Event, /status and
    hoss_worker_config_reloads_total{result="failure"} say why."""
    config_reload_seconds: float = Field(default=5.0, ge=0)
    """How often policies_file is read for a change (a ConfigMap's update reaches the mounted file within the
    kubelet's sync period, about a minute). 0: read once, at start."""
    kubeconfig: str | None = None
    """Kubeconfig to reach the apiserver; unset means the in-cluster service account."""
    redis_url: RedisURL = "redis://127.0.0.1:6379/0"
    """Redis holding the ledger and the work queues: redis://user:password@host:port/db; rediss:// for TLS (see
    hoss-resolver's redis_url)."""
    host: str = "0.0.0.0"
    """Address of the /healthz, /metrics and /status server."""
    port: int = Field(default=8090, ge=0, le=65535)
    """Port of the /healthz, /metrics and /status server (0: any free port)."""
    reservation_ttl_seconds: float = Field(default=30.0, gt=0)
    """How long a reservation holds if the worker never binds (the worker died)."""
    volume_bind_timeout_seconds: float = Field(default=600.0, gt=0)
    """How long a pod whose claims wait for their first consumer waits, once its node is chosen, for them to be
    bound before it is tried again (kube-scheduler's VolumeBinding bindTimeoutSeconds)."""
    heartbeat_interval_seconds: float = Field(default=1.0, gt=0)
    """How often the worker reports itself to the dispatcher."""
    heartbeat_ttl_seconds: float = Field(default=5.0, gt=0)
    """After this long without a heartbeat the dispatcher treats the worker as dead and moves its work."""
    max_binds_in_flight: int = Field(default=IDLE_WEBHOOK_CONNECTIONS, ge=1)
    """Most bindings this worker posts at once (its share of ``binds_in_flight_budget`` never exceeds it). The
    default, 200, lets a lone worker use the whole budget: with 64 its pods queued behind its bindings (hoss-1w's
    p99 latency in the 2026-11-23 08:28 bench was twice kube-scheduler's), and with 100 they still waited for a
    binding slot under an apiserver-bound load (docs/architecture.md, "The webhook's connections"). The worker's
    apiserver client holds this many requests at once and room for its events (workers.core.
    apiserver_requests_in_flight); before 2026-11-24 a fixed 100 capped it, so those runs had at most 100."""
    binds_in_flight_budget: int = Field(default=IDLE_WEBHOOK_CONNECTIONS, ge=0)
    """Bindings in flight across all workers, shared by those with bindings to post (at least 2 each, at most
    ``max_binds_in_flight``; counted at each heartbeat). The default, 200, is what the apiserver keeps open to the
    webhook: 25 idle connections for each of its 8 binding lanes (hoss/model/admission.py); beyond that every
    binding costs a TLS handshake on both sides. 0: no shared budget, each worker posts up to
    ``max_binds_in_flight``."""
    feed_linger_ms: float = Field(default=20.0, ge=0, le=1000)
    """After reading the ledger's change stream, wait this long before reading it again, so that the changes of
    several reservations (every worker's) come in one read: each worker reads every change, so the number of reads,
    not the size of each, is what grows with the number of workers. Other workers' reservations reach this worker's
    node table up to this much later (its own at once); a decision made on older totals costs at most a ledger
    conflict and the next candidate, never an oversold node. 0: read again at once."""
    feed_pause_after_idle_seconds: float = Field(default=2.0, ge=0)
    """A worker that has had nothing to decide or bind for this long stops reading the change stream, and catches
    up (the entries since, or one load of the ledger when they are more than its table holds) before its next
    decision: with the dispatcher keeping a load on as few workers as keep up, the idle ones then cost no CPU per
    pod (hoss/framework/feed.py). 0: always follow the stream."""
    read_batch: int = Field(default=128, ge=1)
    """Work items read from the queue at once."""
    candidates: int = Field(default=8, ge=1)
    """Best nodes kept per decision; on a ledger conflict the next one is tried."""
    backoff_initial_seconds: float = Field(default=1.0, gt=0)
    """First retry delay of an unschedulable pod."""
    backoff_max_seconds: float = Field(default=60.0, gt=0)
    """Longest retry delay of an unschedulable pod."""
    preemption_hold_seconds: float = Field(default=60.0, gt=0)
    """How long room stays held for a preempting pod while its victims leave (renewed when it preempts again):
    longer than the default 30 s termination grace period of a victim, plus the time for its removal to reach the
    ledger and the pod to be retried. A hold never keeps a bound pod's room; it only keeps lower-priority pods out."""
    decide_batch: int = Field(default=64, ge=1, le=4096)
    """Most pods decided before their reservations go to the ledger in one call."""
    scheduled_events: bool = True
    """Record kube-scheduler's Normal 'Scheduled' event for every pod bound (posted off the binding path)."""
    events_per_second: float = Field(default=0.0, ge=0)
    """Most events posted per second (0: no limit); beyond it they queue, and beyond 10,000 queued are dropped."""
    seed: int | None = None
    """Seed of the tie-breaking randomness (default: random per worker)."""
