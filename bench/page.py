"""docs/benchmarks.md, written from the benchmark's JSON, so that no figure on the page is copied by hand.

``python -m bench.page`` renders bench/results/latest.json (a full or quick ``python -m dev bench``) and, when it
exists, bench/results/churn.json (``python -m bench.churn``, run alone) into docs/benchmarks.md; the bench run
calls the same renderer after it writes its JSON. Rendering is pure (`render`): the page is a function of the
JSON, and a unit test checks that the checked-in page is what the checked-in JSON renders to.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DEFAULT_JSON = RESULTS / "latest.json"
DEFAULT_CHURN = RESULTS / "churn.json"
DEFAULT_CHART = RESULTS / "latest.png"
DEFAULT_PAGE = ROOT / "docs" / "benchmarks.md"
COMMAND = "python -m bench.page"

VERDICTS = {True: "met", False: "**not met**", None: "not measured"}


def cell(value: Any, digits: int = 1) -> str:
    """A number with ``digits`` decimals, ``-`` for a missing one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:,.{digits}f}"


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]], *, right_from: int = 1) -> list[str]:
    """A Markdown table; columns from ``right_from`` on are right-aligned."""
    align = ["---" if index < right_from else "---:" for index in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _run_line(results: Mapping[str, Any]) -> str:
    machine, versions, size = results.get("machine", {}), results.get("versions", {}), results.get("size", {})
    kind = "quick run (`--quick`)" if results.get("quick") else "full run"
    parts = [f"{kind} of {results.get('date', 'an unknown date')}"]
    if machine:
        parts.append(f"{machine.get('cpus')} cores, {machine.get('memory_gib')} GiB, Python {machine.get('python')}")
    if versions:
        parts.append(", ".join(f"{name} {version}" for name, version in versions.items()))
    if size:
        parts.append(f"{size.get('nodes'):,} nodes and {size.get('pods'):,} pods for throughput")
    if isinstance(results.get("seconds"), int | float):
        parts.append(f"{results['seconds'] / 60:.1f} minutes")
    return "; ".join(parts) + "."


def _targets(results: Mapping[str, Any]) -> list[str]:
    found = results.get("targets") or report.targets(dict(results))
    met = sum(1 for t in found if t["met"] is True)
    lines = [f"{met} of {len(found)} targets met. Each is judged from this run's figures by `bench/report.py`.", ""]
    lines += md_table(("target", "verdict", "measured"),
                    [(t["target"], VERDICTS[t["met"]], t["value"]) for t in found], right_from=3)
    return lines


def _throughput(tput: Mapping[str, Any]) -> list[str]:
    base = tput.get("kube-scheduler", {}).get("pods_per_second", 0.0)
    head = ("system", "pods/s", "vs kube-scheduler", "bound", "p50 ms", "p90 ms", "p99 ms",
            *(f"{label} CPU ms/pod" for _key, label in report.CPU_COLUMNS))
    rows = []
    for system, row in tput.items():
        cpu = row.get("cpu_per_1000_pods", {})
        rows.append((f"`{system}`", cell(row.get("pods_per_second")), report.ratio(row["pods_per_second"], base),
                     f"{row.get('bound', 0):,}", cell(row.get("p50_ms")), cell(row.get("p90_ms")),
                     cell(row.get("p99_ms")), *(cell(cpu.get(key), 2) for key, _label in report.CPU_COLUMNS)))
    lines = md_table(head, rows)
    lines += ["", "hoss* is the dispatcher, the workers and redis-server; total is every process of the plane (etcd, "
              "kwok and the benchmark's load generator too). `pipeline-*` rows have no apiserver: the binding goes "
              "into a sink (`bench/pipeline.py`). Every process's and every worker's CPU is in the JSON."]
    repeated = {system: row for system, row in tput.items() if row.get("runs_pods_per_second")}
    if repeated:
        lines += ["", "Rows made again in interleaved rounds (each row above is its run with the median pods/s); "
                  "every run in order:", ""]
        rows = []
        for system, row in repeated.items():
            rows.append((f"`{system}`", " / ".join(cell(v) for v in row["runs_pods_per_second"]),
                         " / ".join(cell(v, 0) for v in row.get("runs_p50_ms") or []) or "-",
                         " / ".join(cell(v, 0) for v in row.get("runs_p99_ms") or []) or "-"))
        lines += md_table(("system", "pods/s", "p50 ms", "p99 ms"), rows)
        ratios = []
        for top, bottom in report.COMPARED:
            rounds = report.per_round(dict(tput), top, bottom)
            if rounds is not None:
                ratios.append((f"`{top}` / `{bottom}`", " / ".join(f"{r:.2f}x" for r in rounds),
                               f"{statistics.median(rounds):.2f}x"))
        if ratios:
            lines += ["", "The ratio targets read the median of the per-round ratios:", ""]
            lines += md_table(("ratio", "each round", "median"), ratios)
    one, two = (tput.get(f"hoss-{n}w-pinned", {}).get("pods_per_second") for n in (1, 2))
    if one and two:
        lines += ["", f"Pinned-core scaling (worker i on core i, the rest of the plane unpinned): `hoss-2w-pinned` / "
                  f"`hoss-1w-pinned` = {two / one:.2f}x."]
    return lines


def _contention(cont: Mapping[str, Any]) -> list[str]:
    rows = [(system, str(r["placed"]), str(r["oversold_nodes"])) for system, r in cont.items() if isinstance(r, dict)]
    return [f"Demand {cont['demand_cpu']} cpu on {cont['capacity_cpu']} cpu of nodes.", "",
            *md_table(("system", "placed", "oversold nodes"), rows)]


def _core(core: Mapping[str, Any]) -> list[str]:
    rows, notes, sought = [], [], []
    for nodes, r in core.items():
        kube = r.get("kube_scheduler") or {}
        measured = bool(kube.get("measured"))
        kube_p50 = kube.get("decision_p50_ms") if measured else None
        rows.append((f"{int(nodes):,}", cell(r["decision_p50_ms"], 3), cell(r["decision_p99_ms"], 3),
                     cell(r.get("spread_decision_p50_ms"), 3), cell(r.get("anti_affinity_decision_p50_ms"), 3),
                     cell(kube_p50, 3), cell(kube.get("decision_mean_ms") if measured else None, 3),
                     report.ratio(kube_p50, r["decision_p50_ms"]) if kube_p50 else "-"))
        if measured:
            sought.append(f"{kube['feasible_nodes_sought']:,} of {int(nodes):,}")
        else:
            notes.append(f"At {int(nodes):,} nodes kube-scheduler {kube.get('reason', 'was not measured')}.")
    lines = md_table(("nodes", "hoss p50", "hoss p99", "hoss p50, zone spread", "hoss p50, anti-affinity",
                    "kube-scheduler p50", "kube-scheduler mean", "kube / hoss p50"), rows)
    text = ("Milliseconds per decision. The spread and anti-affinity columns are pods with a DoNotSchedule zone spread "
            "constraint and with hostname anti-affinity, one placed pod of their group per 20 nodes. kube-scheduler's "
            "figures come from its `scheduler_scheduling_algorithm_duration_seconds` (p50 interpolated in its "
            "bucket, mean exact).")
    if sought:
        text += (f" kube-scheduler stops filtering once enough nodes fit ({', '.join(sought)} nodes, its "
                 "percentageOfNodesToScore); hoss evaluates every node.")
    return [*lines, "", " ".join([text, *notes])]


def _gpu(gpu: Mapping[str, Any]) -> list[str]:
    rows = [(system, str(r["placed"]), str(r["fully_free_gpu_nodes"]), str(r["partly_used_gpu_nodes"]),
             str(r["stranded_gpus"])) for system, r in gpu.items() if isinstance(r, dict)]
    return [f"{gpu['gpus_requested']} GPUs of 1/2/4/8-GPU pods on {gpu['gpu_nodes']} 8-GPU nodes. kube-scheduler "
            "MostAllocated is NodeResourcesFit with scoringStrategy MostAllocated, cpu 1, memory 1, nvidia.com/gpu 3 "
            "(the upstream bin-packing example).", "",
            *md_table(("system", "placed", "whole free nodes", "partly used nodes", "stranded GPUs"), rows)]


def _churn(churn: Mapping[str, Any]) -> list[str]:
    rows = [(system, str(r["placed"]), str(r["fully_free_gpu_nodes"]), str(r["partly_used_gpu_nodes"]),
             str(r["stranded_gpus"])) for system, r in churn.items() if isinstance(r, dict)]
    lines = md_table(("system", "placed", "whole free nodes", "partly used nodes", "stranded GPUs"), rows)
    for system, r in churn.items():
        if isinstance(r, dict) and "plans" in r:
            lines += ["", f"{system}: {r['plans']} plans ({r['completed_plans']} completed), {r['pods_moved']} pods "
                      f"moved, {r['pods_lost']} pods lost, at most {r['max_oversold_during_moves']} oversold nodes in "
                      f"{r['oversold_checks']} checks made during the moves, {r['seconds']} s."]
    return lines


def render(results: Mapping[str, Any], *, churn: Mapping[str, Any] | None = None, chart: str | None = None) -> str:
    """The page for one bench run (``results``: the JSON `bench.run.run_bench` writes), with a run of
    ``python -m bench.churn`` (``churn``) and the chart's path relative to the page (``chart``) when given."""
    scenarios = results["scenarios"]
    lines = ["# Benchmarks", "",
             f"<!-- Written by `{COMMAND}` from bench/results/*.json: edit bench/page.py, not this page. -->", "",
             "hoss against kube-scheduler on one local control plane (real kube-apiserver, etcd and kwok nodes), each "
             "system alone on it, every process on the same cores. `python -m dev bench` runs every scenario and "
             f"rewrites this page; `{COMMAND}` renders it again from the JSON. The design choices these figures "
             "led to are in [decisions](decisions/README.md).", "",
             f"Run: {_run_line(results)}", ""]
    if chart:
        lines += [f"![throughput, CPU per process and latency per system]({chart})", ""]
    lines += ["## Targets", "", *_targets(results), ""]
    sections = (("throughput", "1. Throughput, latency and CPU per pod", _throughput),
                ("contention", "2. Contention: nodes with less room than the demand", _contention),
                ("core_scale", "3. The worker core: one decision over every node", _core),
                ("gpu_mix", "4. GPU mix", _gpu),
                ("gpu_churn", "4b. GPU mix with churn", _churn))
    for key, title, section in sections:
        if scenarios.get(key):
            lines += [f"## {title}", "", *section(scenarios[key]), ""]
    if churn:
        lines += ["## GPU churn, run alone (`python -m bench.churn`)", "",
                  "24 8-GPU nodes, every pod a ReplicaSet's, pods created to 60 % of the GPUs, a third deleted, the "
                  "same demand added again; kube-scheduler configured for GPU packing against hoss's gpu policy, "
                  "then hoss-rescheduler over hoss's result.", "", *_churn(churn), ""]
    lines += ["## How to read these figures", "",
              "Every process shares the same cores: the apiserver, etcd, kwok, the load generator, the scheduler and, "
              "for hoss, the resolver. Throughput therefore follows the CPU all of them spend per pod (the total "
              "column), and a shared machine's speed drifts between runs and within one. The rows the targets "
              "compare are made several times, interleaved, with the order of the two systems alternating from "
              "round to round, and the ratio targets read the median of the per-round ratios. Why the throughput "
              "targets are out of reach on two shared cores is worked out in "
              "[the guard's cost](decisions/0006-guard-cost.md)."]
    return "\n".join(lines) + "\n"


def page_for(json_path: Path) -> Path:
    """Where the page of a run's JSON goes: docs/benchmarks.md for the repository's bench/results/latest.json, else
    beside the JSON (``x.json`` -> ``x.md``), so a run aimed elsewhere never rewrites the docs."""
    if json_path.resolve() == DEFAULT_JSON:
        return DEFAULT_PAGE
    return json_path.with_suffix(".md")


def write(*, json_path: Path, page_path: Path, chart_path: Path | None = None, churn_path: Path | None = None) -> str:
    """Render the page from the JSON files and write it; returns the page. A chart or churn file that does not
    exist is left out."""
    results = json.loads(json_path.read_text())
    churn = json.loads(churn_path.read_text()) if churn_path is not None and churn_path.exists() else None
    chart = None
    if chart_path is not None and chart_path.exists():
        chart = Path(os.path.relpath(chart_path.resolve(), page_path.resolve().parent)).as_posix()
    page = render(results, churn=churn, chart=chart)
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_text(page)
    return page


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="the bench run's figures")
    parser.add_argument("--churn", type=Path, default=DEFAULT_CHURN, help="a `python -m bench.churn` run's figures "
                        "(left out when missing)")
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART, help="the run's chart (left out when missing)")
    parser.add_argument("--output", type=Path, help="the page (default: docs/benchmarks.md for the default JSON, "
                        "else beside the JSON)")
    args = parser.parse_args(argv)
    output = args.output or page_for(args.json)
    write(json_path=args.json, page_path=output, chart_path=args.chart, churn_path=args.churn)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
