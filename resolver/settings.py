"""Settings of ``hoss-resolver``: one pydantic model, filled as every service's (hoss.settings)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from hoss.settings import AccessSettings, RedisURL, check_lease_timing, default_identity


class ResolverSettings(AccessSettings):
    """Settings of ``hoss-resolver``, the admission webhook that guards every binding."""

    kubeconfig: str | None = None
    """Kubeconfig to reach the apiserver; unset means the in-cluster service account."""
    redis_url: RedisURL = "redis://127.0.0.1:6379/0"
    """Redis holding the ledger: redis://user:password@host:port/db; rediss:// for TLS, with ?ssl_ca_certs=,
    ssl_certfile= and ssl_keyfile= (PEM files: the server's CA, a client certificate and its key)."""
    host: list[str] = Field(default_factory=lambda: ["0.0.0.0"], min_length=1)
    """Addresses the HTTPS server listens on (comma-separated; the local plane gives each webhook lane its own
    loopback address)."""
    port: int = Field(default=8443, ge=1, le=65535)
    """Port the HTTPS server listens on."""
    tls_cert_file: str
    """Serving certificate (PEM); reloaded when the file changes."""
    tls_key_file: str
    """Serving key (PEM); reloaded when the file changes."""
    client_ca_file: str | None = None
    """CA (PEM) that signed the client certificate the apiserver presents to the webhook (its admission
    configuration's kubeConfigFile); /validate-binding then answers only clients with a certificate it signed (401
    without one). Unset: reviews are not authenticated (a warning at start-up). New CAs added to the file are
    trusted when it changes."""
    client_names: list[str] = Field(default_factory=list)
    """Names (certificate common name or DNS name) of the clients allowed to post reviews, e.g. kube-apiserver
    (comma-separated in env and flags); another certificate from client_ca_file gets 403. Empty: any certificate
    that CA signed."""
    enforce: Literal["all", "hoss-only"] = "all"
    """'all' judges every binding in the cluster; 'hoss-only' lets bindings by other users through unchecked."""
    hoss_usernames: list[str] = Field(
        default_factory=lambda: ["system:serviceaccount:hoss-system:hoss-worker"]
    )
    """User names whose bindings are hoss's own (comma-separated in env and flags)."""
    hoss_scheduler_names: list[str] = Field(default_factory=lambda: ["hoss"], min_length=1)
    """schedulerName values of hoss's pods (the dispatcher's scheduler_names; comma-separated in env and flags).
    The syncing replica indexes the pending pods of every other scheduler, so their bindings are judged without a
    GET of the pod."""
    verify_after_seconds: float = Field(default=2.0, gt=0)
    """How long after the webhook admits a binding (or a pod created on a node) the syncing replica first GETs the
    pod to see whether the write happened; the entry stays counted until the sync sees the pod bound or has proof
    the write failed."""
    write_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long after its admission a write is surely over when nobody saw its answer: the apiserver's
    --request-timeout (default 1m). An admitted entry whose pod is still unbound this long after is dropped."""
    unauthenticated_write_timeout_seconds: float = Field(default=10.0, gt=0)
    """write_timeout_seconds when reviews are not authenticated (client_ca_file unset, as on a managed control
    plane), if shorter: anyone who reaches the port may then post a review, and what a forged one admits is held
    this long at most (plus one verify retry), not the apiserver's whole request timeout. A real write the apiserver
    commits later than this after its review (etcd stalled that long) is counted when the sync sees it, possibly
    past the node's room: docs/architecture.md, "Reviews nobody authenticated"."""
    audit_interval_seconds: float = Field(default=60.0, gt=0)
    """How often the syncing replica compares the ledger's bound entries with the apiserver's pods, repairs drift
    (a rebuild) and counts it (hoss_ledger_audit_drift in /metrics, /status, a warning in the log)."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest AdmissionReview accepted; larger bodies get HTTP 400."""
    max_pending_body_bytes: int = Field(default=64 << 20, ge=1024)
    """Most bytes of review bodies being read at once: a review reserves its Content-Length (max_body_bytes when it
    sends none) before its body is read, and waits while the rest is reserved."""
    max_connections: int = Field(default=512, ge=1)
    """Most connections of clients whose certificate client_ca_file verified (the apiserver's) open at once; a new
    one beyond is closed after its TLS handshake. Without client_ca_file every connection counts here, and one more
    closes the oldest."""
    max_anonymous_connections: int = Field(default=128, ge=1)
    """Most other connections open at once (in their TLS handshake, or without a verified client certificate: the
    kubelet's probes, readers of /status and /metrics); one more closes the oldest, so connections that park can
    neither hold the port nor grow the resolver's memory (each costs about 300 KiB while open)."""
    expire_interval_seconds: float = Field(default=1.0, gt=0)
    """How often reservations past their deadline are released."""
    lease_name: str = Field(default="hoss-resolver-sync", min_length=1)
    """Name of the coordination.k8s.io/v1 Lease that elects the one replica running the ledger sync (every
    replica serves the webhook)."""
    lease_namespace: str = Field(default="hoss-system", min_length=1)
    """Namespace of the Lease."""
    lease_duration_seconds: int = Field(default=15, ge=2)
    """How long a Lease holds without renewal before another replica may take over the sync."""
    renew_deadline_seconds: float = Field(default=10.0, gt=0)
    """A leader that could not renew for this long stops syncing (must be below lease_duration_seconds)."""
    renew_interval_seconds: float = Field(default=2.0, gt=0)
    """How often the leader renews the Lease and a follower checks whether it may take it over."""
    identity: str = Field(default_factory=default_identity, min_length=1, max_length=253)
    """This replica's name in the Lease's holderIdentity (default hostname-pid)."""
    scheduler_names: list[str] = Field(default_factory=lambda: ["hoss"], min_length=1)
    """hoss's scheduler names (comma-separated in env and flags; the dispatcher's setting of the same name): the
    router (POST /mutate-pod) sets the first as spec.schedulerName of the pods it routes."""
    routing_file: str | None = None
    """Routing rules for the router (configs/routing.yaml: namespace selector and pod selector -> policy); pods of
    namespaces labelled hoss.io/policy=<policy> are routed without it. Read at start-up (a bad rule stops it, naming
    the field) and again whenever it changes (config_reload_seconds): new rules route the pods created from then on;
    a file with a bad rule is refused and the rules in use are kept, and an Event, /status and
    hoss_resolver_config_reloads_total{result="failure"} say why."""
    config_reload_seconds: float = Field(default=5.0, ge=0)
    """How often routing_file is read for a change (a ConfigMap's update reaches the mounted file within the
    kubelet's sync period, about a minute). 0: read once, at start."""

    @model_validator(mode="after")
    def _client_names_need_a_ca(self) -> Self:
        if self.client_names and self.client_ca_file is None:
            raise ValueError("client_names needs client_ca_file (the CA whose certificates carry those names)")
        return self

    @property
    def held_write_timeout_seconds(self) -> float:
        """How long after its admission an unproven write's room is held: write_timeout_seconds, or
        unauthenticated_write_timeout_seconds when reviews are not authenticated and that is shorter."""
        if self.client_ca_file is not None:
            return self.write_timeout_seconds
        return min(self.write_timeout_seconds, self.unauthenticated_write_timeout_seconds)

    def file_problems(self) -> list[str]:
        """Each file setting that names no readable file, as 'name (flag, env): path: why'; checked at start-up."""
        problems = []
        for name in ("tls_cert_file", "tls_key_file", "client_ca_file"):
            path = getattr(self, name)
            if path is None:
                continue
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                problems.append(
                    f"{name} (--{name.replace('_', '-')}, HOSS_{name.upper()}): {path}: {error.strerror or error}"
                )
        return problems

    @model_validator(mode="after")
    def _lease_timing_is_ordered(self) -> Self:
        # The leader must stop syncing before another replica may take over, and must try to renew before it stops.
        check_lease_timing(self.renew_interval_seconds, self.renew_deadline_seconds, self.lease_duration_seconds)
        return self
