"""The demo's report as text: one line per story with its figure, the pods each worker placed with why a worker placed
few or none, why pods wait, and how to look around the plane the demo leaves running. Every sentence is made from
the report's figures; a story that saw nothing to show says so instead of showing an example."""

from __future__ import annotations

from dev.demo.report import DemoReport
from dev.demo.stage import (
    DEMO_NAMESPACE,
    DEVICES_NAMESPACE,
    GANGS_NAMESPACE,
    GPU_NAMESPACE,
    RACE_NAMESPACE,
    TENANT_NAMESPACE,
    TENANT_POOL,
)
from dev.demo.stories.devices import DeviceStory
from dev.demo.stories.race import RaceStory
from dev.local.devices import DRIVER
from dev.local.plane import LocalPlane

INDENT = " " * 21


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def race_lines(r: RaceStory) -> list[str]:
    """The foreign-scheduler story: the race, the denials as counted, and a real example or a plain 'none'."""
    earlier = "the first round" if r.rounds == 2 else f"the first {r.rounds - 1} rounds"
    rounds = "" if r.rounds == 1 or r.denials == 0 else f" (round {r.rounds}; {earlier} had no conflicting binding)"
    if r.denials == 0:
        denied = (f"no binding was denied in {_plural(r.rounds, 'round', 'rounds')}: one scheduler took all the room "
                  "before the other bound, so nothing conflicted")
    else:
        denied = f"the webhook denied {_plural(r.denials, 'binding', 'bindings')} (counted by the apiserver)"
        if len(r.denied_by) == 1:
            denied += f", all {next(iter(r.denied_by))}'s"
        elif r.denied_by:
            ranked = sorted(r.denied_by.items(), key=lambda item: (-item[1], item[0]))
            denied += ", " + " and ".join(f"{who}'s {n}" for who, n in ranked)
    lines = [f"kube-scheduler and hoss raced {r.kube_pods}+{r.hoss_pods} pods created together for {r.cpu_capacity} "
             f"cores on {r.nodes} nodes{rounds}: kube-scheduler bound {r.kube_bound}, hoss {r.hoss_bound}; {denied}; "
             f"{r.oversold_nodes} oversold"]
    if r.denial_example:
        lines.append(f"for example, {r.denial_example}")
    elif r.denials:
        lines.append("(the resolver no longer remembers these denials, so none is shown)")
    return lines


def _listed(values: list[int] | list[str]) -> str:
    """Distinct values in order, in words: ``0``, ``0 and 1``."""
    distinct = [str(v) for v in dict.fromkeys(values)]
    return " and ".join(distinct) if len(distinct) < 3 else ", ".join(distinct[:-1]) + f" and {distinct[-1]}"


def device_lines(d: DeviceStory) -> list[str]:
    """The devices story: pods bound, the devices in two claims, then what each pod asked and got."""
    lines = [f"{d.bound}/{d.pods} pods asking fake GPUs bound on {d.nodes} nodes of {d.gpus_per_node} fake GPUs "
             f"({DRIVER}); {_plural(d.devices_in_two_claims, 'device', 'devices')} in two claims"]
    for pod, p in d.placements.items():
        domains = "NVLink domain" + ("s " if len(set(p.nvlink_domains)) > 1 else " ")
        lines.append(f"{pod} asked {p.asked}: got {', '.join(p.devices)} on {p.node} ({_listed(p.models)}, "
                     f"{domains}{_listed(p.nvlink_domains)})")
    return lines


def story_lines(report: DemoReport) -> list[tuple[str, str]]:
    """One line per story with its figure (a story may add lines under its own, with an empty label)."""
    waiting = "none wait" if report.pods_pending == 0 else f"{report.pods_pending} wait"
    if report.pods_pending and report.pending_reasons:
        waiting += " (why: below)"
    lines = [("throughput", f"{report.pods_bound} of {report.pods_total} pods bound in {report.seconds} s "
                            f"({report.pods_per_second} pods/s, {report.workers} workers, {report.ledger_conflicts} "
                            f"ledger conflicts retried); {waiting}")]
    if (g := report.gangs) is not None:
        lines.append(("gangs", f"{g.first_gang} held with {g.held_with} of {g.first_min_available} members "
                               f"({g.held_reason}), then {g.first_bound_when_complete}/{g.first_min_available} "
                               f"bound together; {g.second_gang} bound {g.second_bound_while_blocked} of "
                               f"{g.second_members} while only {g.second_fit_alone} fit, then "
                               f"{g.second_bound_after_room}/{g.second_members} {g.seconds_to_start_after_room} s "
                               f"after {g.first_gang} left"))
    if (gpu := report.gpu) is not None:
        p, s = gpu.packed, gpu.spread
        lines.append(("GPU packing", f"{gpu.gpus_requested} GPUs on {gpu.gpu_nodes} 8-GPU nodes: gpu policy left "
                                     f"{p.fully_free_nodes} nodes whole and {p.stranded_gpus} GPUs stranded, "
                                     f"spreading left {s.fully_free_nodes} whole and {s.stranded_gpus} stranded; "
                                     f"then an 8-GPU job {'is bound' if p.whole_node_job_bound else 'WAITS'} "
                                     f"(gpu) and {'is bound' if s.whole_node_job_bound else 'waits'} (spreading)"))
    if (pool := report.pools) is not None:
        lines.append(("pools", f"{pool.in_pool}/{pool.pods} tenant pods on {pool.pool}'s {pool.pool_nodes} nodes, "
                               f"{pool.elsewhere} elsewhere (hoss pods only: other schedulers ignore pools)"))
    if (r := report.race) is not None:
        first, *more = race_lines(r)
        lines += [("foreign scheduler", first), *(("", line) for line in more)]
    if (d := report.devices) is not None:
        first, *more = device_lines(d)
        lines += [("devices (DRA)", first), *(("", line) for line in more)]
    lines.append(("oversold nodes", f"{report.oversold_nodes} (every bound pod against its node's allocatable, "
                                    "from the apiserver)"))
    return lines


def worker_lines(report: DemoReport) -> list[tuple[str, str]]:
    """The pods each worker placed in the throughput story, then why a worker placed few or none."""
    asked = ", ".join(f"{policy} {n}" for policy, n in report.pods_by_policy.items())
    counts = ", ".join(f"{worker} {count}" for worker, count in report.per_worker.items())
    lines = [("pods per worker", f"{counts} (throughput story; its pods by policy: {asked})")]
    lines += [("", f"{worker} placed {report.per_worker.get(worker, 0)}: {why}")
              for worker, why in report.per_worker_why.items()]
    return lines


def print_report(report: DemoReport, plane: LocalPlane) -> None:
    print(f"\nhoss demo report ({report.demo_seconds} s from the first node to the last story)")
    for label, text in [*story_lines(report), *worker_lines(report)]:
        print(f"  {label:<18} {text}")
    if report.pending_reasons:
        print("  why pods wait (kubectl describe pod shows the same)")
        for message, count in report.pending_reasons.items():
            print(f"    {count:>4} x {message}")
    print(f"\ndashboard: {report.dashboard_url}   status: {report.status_url}   (or: .venv/bin/python -m dev status)")
    print("The plane keeps running. To look around from this shell:")
    print(plane.exports())
    print(f"kubectl get pods -n {GANGS_NAMESPACE} -o wide            # the gangs")
    print(f"kubectl get events -n {GANGS_NAMESPACE}                  # GangIncomplete, then Scheduled")
    print(f"kubectl get pods -n {GPU_NAMESPACE} -o wide --sort-by=.spec.nodeName")
    print(f"kubectl get pods -n {TENANT_NAMESPACE} -o wide           # all on hoss.io/pool={TENANT_POOL} nodes")
    print(f"kubectl get events -n {RACE_NAMESPACE} --field-selector reason=FailedScheduling   # denied bindings")
    print(f"kubectl describe pod -n {DEMO_NAMESPACE} | grep -A3 PodScheduled")
    print("kubectl get resourceslices                          # the fake DRA driver's GPUs, one slice per node")
    print(f"kubectl get resourceclaims -n {DEVICES_NAMESPACE}     # the devices story's claims and their state")
    print("Tear it down with: make down   (or .venv/bin/python -m dev local down)")
