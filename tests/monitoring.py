"""The shipped monitoring (deploy/monitoring: the Grafana dashboard and the Prometheus alert rules) as the tests read
it: every PromQL expression, the series names each one reads, and the series names a component exports, from its
metrics registry in-process or from its /metrics text."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

MONITORING = Path(__file__).resolve().parents[1] / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yaml"

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "unknown": ("",),
}
"""The series a metric family of each type exposes, by suffix (prometheus_client names a counter's family without
its ``_total``)."""

KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                      "offset", "inf", "nan", "atan2"})
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def metric_names(expression: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers that are neither functions (followed by ``(``)
    nor keywords, once strings, label matchers, ranges and grouping labels are taken out."""
    text = _STRINGS.sub('""', expression)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in KEYWORDS}


def dashboard_panels() -> list[dict[str, object]]:
    """Every panel of the dashboard, those inside rows included."""
    document = json.loads(DASHBOARD.read_text())

    def walk(panels: Iterable[dict[str, object]]) -> Iterator[dict[str, object]]:
        for panel in panels:
            yield panel
            inner = panel.get("panels")
            if isinstance(inner, list):
                yield from walk(inner)

    return list(walk(document["panels"]))


def dashboard_expressions() -> dict[str, str]:
    """``<panel title> <refId>`` -> the PromQL of each target of the dashboard."""
    found = {}
    for panel in dashboard_panels():
        targets = panel.get("targets")
        for target in targets if isinstance(targets, list) else []:
            found[f"{panel['title']} {target['refId']}"] = str(target["expr"])
    return found


def alert_rules() -> list[dict[str, object]]:
    """Every rule of alerts.yaml."""
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alert_expressions() -> dict[str, str]:
    """alert name -> its PromQL."""
    return {str(rule["alert"]): str(rule["expr"]) for rule in alert_rules()}


def shipped_expressions() -> dict[str, str]:
    """Every expression of the dashboard and the rules, by where it is."""
    return {**{f"dashboard: {k}": v for k, v in dashboard_expressions().items()},
            **{f"alert: {k}": v for k, v in alert_expressions().items()}}


def registry_series(registry: CollectorRegistry | Collector) -> set[str]:
    """The series names a registry exposes (whether or not a labelled metric has a sample yet)."""
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def exposition_series(text: str) -> set[str]:
    """The series names in a Prometheus text exposition (a component's /metrics)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
        names |= {sample.name for sample in family.samples}
    return names


def unexported(expressions: dict[str, str], exported: set[str]) -> dict[str, set[str]]:
    """Per expression the series it reads that nothing exports (empty when all are exported)."""
    return {where: missing for where, expression in expressions.items()
            if (missing := metric_names(expression) - exported)}
