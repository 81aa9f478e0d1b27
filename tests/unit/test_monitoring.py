"""The shipped monitoring (deploy/monitoring): every series the Grafana dashboard and the alert rules read is one a
component exports (its metrics registry, built in-process as the component builds it), promtool (built from the Go
module proxy by `python -m dev local build`) accepts the rules and parses every dashboard expression, and both files
are well formed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import fakeredis
import pytest
import yaml

from bench.pipeline import SinkBinder, worker_settings
from dev.local import binaries
from dev.local.plane import POLICIES_FILE
from dispatcher.core import Dispatcher
from dispatcher.settings import DispatcherSettings
from hoss.ledger.client import Ledger
from hoss.queue import WorkQueue
from rescheduler.service import Rescheduler
from rescheduler.settings import ReschedulerSettings
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from tests.monitoring import (
    ALERTS,
    alert_rules,
    dashboard_expressions,
    dashboard_panels,
    metric_names,
    registry_series,
    shipped_expressions,
    unexported,
)
from workers.core import Worker


def test_metric_names_are_the_series_an_expression_selects() -> None:
    expression = ('histogram_quantile(0.99, sum by (le, profile) (rate(scheduler_scheduling_attempt_duration_seconds_'
                  'bucket{result="scheduled", profile=~"a|b"}[5m]))) / ignoring(x) group_left(y) '
                  'max(up offset 5m) > 1e3 and on(job) absent(hoss_resolver_ready) or time() - 14 * 86400')
    assert metric_names(expression) == {"scheduler_scheduling_attempt_duration_seconds_bucket", "up",
                                        "hoss_resolver_ready"}


@pytest.fixture
def exported(fake_redis: fakeredis.FakeAsyncRedis, tmp_path: Path) -> set[str]:
    """The series of the four components' registries, each built as its process builds it."""
    worker = Worker(worker_settings("w", "redis://unused", str(POLICIES_FILE)), redis=fake_redis, rest=None,
                    binder=SinkBinder(fake_redis))
    dispatcher = Dispatcher(queue=WorkQueue(fake_redis), settings=DispatcherSettings(identity="d"))
    resolver = WebhookState(settings=ResolverSettings(tls_cert_file=str(tmp_path / "c"),
                                                      tls_key_file=str(tmp_path / "k")), ledger=Ledger(fake_redis))
    rescheduler = Rescheduler(ReschedulerSettings(), rest=None, ledger=Ledger(fake_redis))  # type: ignore[arg-type]
    return set().union(*(registry_series(registry) for registry in (
        worker.tally.registry, dispatcher.metrics.registry, resolver.registry, rescheduler.metrics.registry)))


def test_every_series_the_dashboard_and_the_rules_read_is_exported(exported: set[str]) -> None:
    expressions = shipped_expressions()
    assert len(dashboard_expressions()) >= 40 and len(alert_rules()) >= 10
    assert unexported(expressions, exported) == {}
    # kube-scheduler's names, where hoss's workers mean the same
    for name in ("scheduler_scheduling_attempt_duration_seconds_bucket", "scheduler_schedule_attempts_total",
                 "scheduler_pod_scheduling_sli_duration_seconds_bucket", "scheduler_pending_pods",
                 "scheduler_framework_extension_point_duration_seconds_bucket", "scheduler_preemption_attempts_total",
                 "scheduler_preemption_victims_bucket", "hoss_plugin_execution_duration_seconds_bucket"):
        assert name in exported


def test_an_expression_reading_a_series_nobody_exports_is_caught(exported: set[str]) -> None:
    assert unexported({"typo": "sum(rate(scheduler_schedule_attempt_total[5m]))"}, exported) == \
        {"typo": {"scheduler_schedule_attempt_total"}}


def promtool_check(rules: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binaries.require("promtool")), "check", "rules", str(rules)], capture_output=True,
                          text=True, check=False, timeout=60)


def test_promtool_accepts_the_alert_rules() -> None:
    checked = promtool_check(ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    """Each panel's PromQL as a recording rule: promtool parses it as Prometheus would."""
    rules = [{"record": f"hoss_dashboard:target_{i}", "expr": expression}
             for i, expression in enumerate(dashboard_expressions().values())]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool_check(path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"alert": "Broken", "expr": "sum(rate(hoss_worker_pods_total[5m])"}]}]}))
    checked = promtool_check(path)
    assert checked.returncode != 0
    assert "Broken" in checked.stdout + checked.stderr or "parse error" in checked.stdout + checked.stderr


def test_every_alert_says_how_bad_and_what_happened() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]  # type: ignore[index]
        assert rule["annotations"]["summary"], rule["alert"]  # type: ignore[index]
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    for wanted in ("HossWebhookDenialsSurging", "HossResolverNotReady", "HossWorkerWithoutHeartbeat",
                   "HossPodsPendingTooLong"):
        assert wanted in names


def test_the_dashboard_panels_have_unique_ids_and_fit_grafanas_grid() -> None:
    panels = dashboard_panels()
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert isinstance(grid, dict)
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & occupied, f"panel {panel['title']} overlaps another"
        occupied |= cells
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
