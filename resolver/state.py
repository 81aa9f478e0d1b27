"""What the webhook's parts share: its settings and ledger, the sync while this replica runs it, and the record of
its reviews (verdict counts, recent denials, latency) that /metrics, /status and the stats hash show."""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from hoss.kube.access import TokenAccess
from hoss.kube.leader import LeaderElector
from hoss.ledger.client import Ledger
from hoss.ledger.results import QuotaReport
from hoss.model import admission
from hoss.model import devices as dra
from hoss.model.dra import DeviceClasses
from hoss.model.objects import Json
from hoss.model.resourceclaims import DeviceCatalog
from hoss.reload import ConfigFile, reload_counter
from resolver.metrics import LatencyWindow, WebhookMetrics
from resolver.mirror import PodIndex
from resolver.router import NamespaceLabels, Rule
from resolver.server import BodyBudget, WebhookServer
from resolver.settings import ResolverSettings
from resolver.sync import LedgerSync

PodReader = Callable[[str, str], Awaitable[Json]]
"""GET of one pod (namespace, name) as raw JSON; raises KubeError (404 when there is none) or a network error."""


@dataclass
class Denial:
    at: float
    pod: str
    node: str
    username: str
    reason: str
    message: str


@dataclass
class WebhookState:
    """Everything the handlers share: settings, ledger, the sync while this replica runs it, metrics and recent
    denials. ``get_pod`` reads a pod from the apiserver (None: no apiserver, e.g. in tests); ``pods`` is an index
    consulted when no sync runs (tests)."""

    settings: ResolverSettings
    ledger: Ledger
    pods: PodIndex = field(default_factory=PodIndex)
    sync: LedgerSync | None = None
    get_pod: PodReader | None = None
    elector: LeaderElector | None = None
    server: WebhookServer | None = None
    """The HTTPS server once it serves, for its counts in /status."""
    access: TokenAccess | None = None
    """With it (``--access=kubernetes``), /status and /metrics need a bearer token it accepts."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    denials: collections.deque[Denial] = field(default_factory=lambda: collections.deque(maxlen=50))
    verdict_counts: collections.Counter[str] = field(default_factory=collections.Counter)
    review_latency: LatencyWindow = field(default_factory=LatencyWindow)
    pod_reads: int = 0
    """pods the webhook had to GET from the apiserver (a binding whose pod neither index of the sync held, and the
    name of each pod created on a node)"""
    ledger_stats: dict[str, str] = field(default_factory=dict)
    """``{hoss}:stats`` as last read (overcommits, audit_drift, stale_ledger), refreshed by publish_stats"""
    namespaces: NamespaceLabels = field(default_factory=NamespaceLabels)
    """Namespace labels for the router (an informer keeps them while the resolver runs)."""
    routing_rules: list[Rule] = field(default_factory=list)
    """The router's rules in use: replaced whole when the routing file is reloaded (`routing_file`)."""
    routing_file: ConfigFile[list[Rule]] | None = None
    """The routing file when one is set, for its entry in /status (`hoss.reload`)."""
    routed: collections.Counter[str] = field(default_factory=collections.Counter)
    """Router outcomes: policy name of each routed pod, or 'unchanged'."""
    quota_report: QuotaReport | None = None
    """Elastic quotas and their use as last read (publish_stats), for /metrics and /status."""
    device_classes: DeviceClasses = field(default_factory=DeviceClasses)
    """The extended resources DeviceClasses map to DRA devices (an informer keeps them while the resolver runs):
    not counted on a node that has none of them (`hoss.model.dra`)."""
    devices: DeviceCatalog = field(default_factory=DeviceCatalog)
    """ResourceSlices and ResourceClaims (informers keep them while the resolver runs): what allocated devices draw
    on shared counters, for the judgement of an allocation's (`resolver.claims`)."""
    slice_changes: int = 0
    """Counts the list and events of ResourceSlices: `inventory` parses them again once it moved."""
    _inventory: tuple[int, dra.Inventory] | None = None

    def inventory(self) -> dra.Inventory:
        """`devices`' slices, parsed once per change of them (slices hoss cannot read left out)."""
        version = self.slice_changes
        if self._inventory is None or self._inventory[0] != version:
            kept = []
            for raw in self.devices.slices.values():
                try:
                    kept.append(dra.parse_slice(raw))
                except dra.DeviceError:
                    continue  # a slice hoss cannot read counts for nothing here; the workers name it
            self._inventory = (version, dra.Inventory(tuple(kept)))
        return self._inventory[1]

    def __post_init__(self) -> None:
        self.hoss_usernames = frozenset(self.settings.hoss_usernames)
        # Reviews need a client certificate from the client CA (with one of client_names, when they are set).
        self.authenticate = self.settings.client_ca_file is not None
        self.client_names = frozenset(self.settings.client_names)
        self.metrics = WebhookMetrics(self)
        self.config_reloads = reload_counter(self.registry, "resolver")
        self.body_budget = BodyBudget(self.settings.max_pending_body_bytes)
        """The review bodies being read at once (`resolver.server.BodyBudget`)."""

    def count_verdict(self, verdict: admission.Verdict) -> None:
        self.verdict_counts[verdict.reason] += 1
        self.metrics.count_verdict(verdict)

    def record_review(self, seconds: float) -> None:
        """A judged review took ``seconds``: for the histogram and the p50/p99 window."""
        self.metrics.observe_review(seconds)
        self.review_latency.add(seconds)
