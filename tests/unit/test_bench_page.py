"""docs/benchmarks.md is rendered from the benchmark's JSON, and the checked-in page is what the checked-in JSON
renders to."""

from __future__ import annotations

import json
from pathlib import Path

from bench import page


def test_the_page_renders_every_scenario_and_target_from_the_checked_in_json(tmp_path: Path) -> None:
    results = json.loads(page.DEFAULT_JSON.read_text())
    written = page.write(json_path=page.DEFAULT_JSON, page_path=tmp_path / "docs" / "benchmarks.md",
                         chart_path=page.DEFAULT_CHART, churn_path=page.DEFAULT_CHURN)
    for target in results["targets"]:
        row = next(line for line in written.splitlines() if line.startswith(f"| {target['target']} |"))
        assert target["value"] in row, target
        assert ("met" in row) if target["met"] else ("not met" in row or "not measured" in row), row
    for system, figures in results["scenarios"]["throughput"].items():
        row = next(line for line in written.splitlines() if line.startswith(f"| `{system}` |"))
        assert f"{figures['pods_per_second']:,.1f}" in row, system
    for title in ("Contention", "worker core", "GPU mix", "churn"):
        assert title in written, title
    link = written.split("![", 1)[1].split("](", 1)[1].split(")", 1)[0]
    assert (tmp_path / "docs" / link).resolve() == page.DEFAULT_CHART


def test_the_checked_in_page_is_up_to_date() -> None:
    chart = Path("..") / "bench" / "results" / "latest.png"
    expected = page.render(json.loads(page.DEFAULT_JSON.read_text()),
                           churn=json.loads(page.DEFAULT_CHURN.read_text()), chart=chart.as_posix())
    current = page.DEFAULT_PAGE.read_text() if page.DEFAULT_PAGE.exists() else ""
    assert current == expected, f"docs/benchmarks.md is stale: run `{page.COMMAND}` and commit the page"


def test_a_run_aimed_elsewhere_writes_its_page_beside_its_json(tmp_path: Path) -> None:
    assert page.page_for(page.DEFAULT_JSON) == page.DEFAULT_PAGE
    assert page.page_for(tmp_path / "bench.json") == tmp_path / "bench.md"


def test_a_quick_run_without_churn_or_chart_still_renders(tmp_path: Path) -> None:
    results = json.loads(page.DEFAULT_JSON.read_text())
    results["quick"] = True
    del results["scenarios"]["gpu_churn"]
    (tmp_path / "bench.json").write_text(json.dumps(results))
    written = page.write(json_path=tmp_path / "bench.json", page_path=tmp_path / "bench.md",
                         chart_path=tmp_path / "missing.png", churn_path=None)
    assert "quick run" in written
    assert "## 4b." not in written and "run alone" not in written and "![" not in written
