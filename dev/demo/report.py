"""The demo's report: every story's figures in one dataclass, printed as text (dev/demo/printing.py) or as one line of
JSON (``--json``, which tests/e2e/test_demo.py reads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dev.demo.stories.devices import DeviceStory
from dev.demo.stories.gangs import GangStory
from dev.demo.stories.gpu import GpuStory
from dev.demo.stories.pools import PoolStory
from dev.demo.stories.race import RaceStory


@dataclass
class DemoReport:
    pods_total: int
    pods_bound: int
    pods_pending: int
    seconds: float
    pods_per_second: float
    ledger_conflicts: int
    """Ledger conflicts the workers retried during the throughput story."""
    webhook_denials: int
    """Bindings the webhook denied over the whole demo (the foreign-scheduler story's among them), as the apiserver
    counted them."""
    oversold_nodes: int
    """Over every node and every bound pod of the plane, checked from the apiserver after all the stories."""
    per_worker: dict[str, int]
    """Pods each worker bound during the throughput story."""
    nodes: int
    workers: int
    status_url: str
    pending_reasons: dict[str, int] = field(default_factory=dict)
    dashboard_url: str = ""
    per_worker_why: dict[str, str] = field(default_factory=dict)
    """Why a worker placed few or no pods in the throughput story; a worker with a fair share is not named."""
    pods_by_policy: dict[str, int] = field(default_factory=dict)
    """The throughput story's pods by policy (label hoss.io/policy)."""
    gangs: GangStory | None = None
    gpu: GpuStory | None = None
    pools: PoolStory | None = None
    race: RaceStory | None = None
    devices: DeviceStory | None = None
    demo_seconds: float = 0.0
    """From the first node created to the end of the last story."""
