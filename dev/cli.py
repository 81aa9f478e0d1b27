"""``python -m dev``: the developer's command line: the local control plane, the demo, the benchmark, and the
operator's ``status``, ``reschedule`` and ``why`` aimed at the local plane."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.argtypes import at_least
from dev import image
from dev.local import binaries
from dev.local.clean import clean
from dev.local.errors import PlaneError
from dev.local.plane import POLICIES_FILE, LocalPlane
from dev.local.state import default_directory


def _say(message: str) -> None:
    print(f"[hoss-dev] {message}", file=sys.stderr, flush=True)


def _plane(args: argparse.Namespace) -> LocalPlane:
    return LocalPlane(Path(args.dir) if args.dir else None)


def _local_up(args: argparse.Namespace) -> int:
    binaries.build_missing()
    plane = _plane(args)
    plane.up(
        apiserver_port=args.apiserver_port,
        redis_port=args.redis_port,
        scheduler=not args.no_scheduler,
        webhook=not args.no_webhook,
        client_auth=not args.no_client_auth,
        progress=_say,
    )
    if args.rescheduler and plane.running("hoss-rescheduler") is None:
        rescheduler = plane.start_rescheduler()
        _say(f"hoss-rescheduler is up: http://127.0.0.1:{rescheduler.port}/status")
    print("# paste into your shell to use the local plane:")
    print(plane.exports())
    return 0


def _local_down(args: argparse.Namespace) -> int:
    stopped = _plane(args).down()
    _say(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


BENCH_JSON = "bench/results/latest.json"


def _bench_plane(args: argparse.Namespace) -> LocalPlane:
    # A plane of its own, so that a running demo's workers do not take the benchmark's pods.
    return LocalPlane(Path(args.dir) if args.dir else default_directory().parent / "bench")


def _local_clean(args: argparse.Namespace) -> int:
    planes = [_plane(args)] if args.dir else [_plane(args), _bench_plane(args)]
    removed = clean(planes, go_caches=args.go_cache, progress=_say)
    if not removed:
        _say("nothing to remove")
    return 0


def _local_status(args: argparse.Namespace) -> int:
    plane = _plane(args)
    status = plane.status()
    if not status:
        print(f"no local plane in {plane.directory}")
        return 1
    state = plane.state()
    print(f"local plane in {plane.directory}")
    print(f"  apiserver  {state.apiserver_url}")
    print(f"  redis      {state.redis_url}")
    for process in state.processes:
        health = "healthy" if status.get(process.name) else "NOT RUNNING"
        print(f"  {process.name:<28} pid {process.pid:<8} {health:<12} log {process.log}")
    return 0 if all(status.values()) else 1


def _local_build(args: argparse.Namespace) -> int:
    paths = binaries.build_missing(force=args.force)
    for name, path in paths.items():
        print(f"{name:<16} {path}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    # Imported here, as the benchmark and the operator's CLI are where they are used: they import hoss's components,
    # and `local down` must still stop a plane while a component's code does not import.
    from dev.demo.run import run_demo  # noqa: PLC0415

    binaries.build_missing()
    return asyncio.run(
        run_demo(
            plane=_plane(args),
            nodes=args.nodes,
            pods=args.pods,
            workers=args.workers,
            as_json=args.json,
            progress=_say,
        )
    )


def _dispatcher_url(plane: LocalPlane) -> str:
    """The /status URL of the dispatcher running in a local plane."""
    for process in plane.state().processes:
        if process.name.startswith("hoss-dispatcher"):
            return f"http://127.0.0.1:{process.port}/status"
    raise PlaneError(f"no hoss-dispatcher runs in the plane in {plane.directory}; start one with `make demo`")


def _operator(args: argparse.Namespace, command: str, extra: list[str]) -> int:
    """The operator's ``hoss <command>``, aimed at the local plane."""
    from deploy import cli as operator_cli  # noqa: PLC0415 -- see _demo

    return operator_cli.main([command, *extra, *args.rest])


def _status(args: argparse.Namespace) -> int:
    return _operator(args, "status", ["--url", _dispatcher_url(_plane(args))])


def _reschedule(args: argparse.Namespace) -> int:
    plane = _plane(args)
    return _operator(args, "reschedule", ["--kubeconfig", str(plane.kubeconfig("admin")),
                                          "--redis-url", plane.state().redis_url])


def _why(args: argparse.Namespace) -> int:
    plane = _plane(args)
    return _operator(args, "why", ["--kubeconfig", str(plane.kubeconfig("admin")),
                                   "--redis-url", plane.state().redis_url, "--policies-file", str(POLICIES_FILE)])


def _node_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"node counts must be integers separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"node counts must be positive, got {text!r}")
    return counts


def _bench(args: argparse.Namespace) -> int:
    from bench.large_page import DEFAULT_JSON, DEFAULT_PAGE  # noqa: PLC0415 -- see _demo
    from bench.run import run_bench, run_large  # noqa: PLC0415 -- see _demo
    from bench.scenarios.large import LARGE, LargeSize  # noqa: PLC0415 -- see _demo

    binaries.build_missing()
    plane = _bench_plane(args)
    try:
        if args.large:
            custom = args.large_nodes is not None or args.large_pods is not None
            size = LargeSize(nodes=args.large_nodes or LARGE.nodes, pods=args.large_pods or LARGE.pods)
            json_path = Path(args.json) if args.json != BENCH_JSON else DEFAULT_JSON
            asyncio.run(run_large(plane=plane, size=size, json_path=json_path,
                                  page_path=None if custom else DEFAULT_PAGE))
            return 0
        asyncio.run(run_bench(plane=plane, quick=args.quick, json_path=Path(args.json),
                              chart_path=Path(args.chart), plane_kept=args.keep))
    finally:
        if not args.keep:
            plane.down()
    return 0


def _image_build(args: argparse.Namespace) -> int:
    image.build(args.image or image.default_image(), refresh_base=args.refresh_base, progress=_say)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dev",
                                     description="hoss development tools: local plane, demo, benchmark")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_dir(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument("--dir", help="state directory of the local plane (default $HOSS_LOCAL_DIR or "
                         "~/.local/state/hoss/local)")
        return sub

    local = commands.add_parser(
        "local", help="a real local control plane (etcd, kube-apiserver, kube-controller-manager, kwok, redis)")
    local_commands = local.add_subparsers(dest="local_command", required=True)
    up = with_dir(local_commands.add_parser("up", help="start the plane (idempotent) and print shell exports"))
    up.add_argument("--apiserver-port", type=int, help="fixed kube-apiserver port (default: a free one)")
    up.add_argument("--redis-port", type=int, help="fixed redis-server port (default: a free one)")
    up.add_argument("--no-scheduler", action="store_true", help="do not start the default kube-scheduler")
    up.add_argument("--no-webhook", action="store_true", help="do not start hoss-resolver nor register its webhook")
    up.add_argument("--no-client-auth", action="store_true",
                    help="as a managed control plane: the apiserver takes no admission configuration, so it presents "
                         "no client certificate to webhooks, and hoss-resolver authenticates no review")
    up.add_argument("--rescheduler", action="store_true",
                    help="also start hoss-rescheduler (GPU defragmentation) with its default settings")
    up.set_defaults(run=_local_up)
    with_dir(local_commands.add_parser("down", help="stop everything the plane started")).set_defaults(
        run=_local_down
    )
    with_dir(local_commands.add_parser("status", help="show the plane's processes and health")).set_defaults(
        run=_local_status
    )
    clean_command = with_dir(local_commands.add_parser(
        "clean", help="stop the plane (and the benchmark's, without --dir); remove their state directories and the "
        "control-plane binaries hoss built"))
    clean_command.add_argument("--go-cache", action="store_true",
                               help="also run `go clean -cache -modcache` (Go's build and module caches, which the "
                               "build filled; shared with any other Go work of this user)")
    clean_command.set_defaults(run=_local_clean)
    build = local_commands.add_parser("build", help="build (or find) the control-plane binaries")
    build.add_argument("--force", action="store_true", help="rebuild even when binaries are present")
    build.set_defaults(run=_local_build)

    demo = with_dir(commands.add_parser("demo", help="the whole system on the local plane, with a report"))
    demo.add_argument("--nodes", type=at_least(1), default=100, help="fake nodes to create (default 100)")
    demo.add_argument("--pods", type=at_least(1), default=1000, help="pods to schedule (default 1000)")
    demo.add_argument("--workers", type=at_least(1), default=3, help="hoss workers to run (default 3)")
    demo.add_argument("--json", action="store_true", help="print the final report as one JSON object")
    demo.set_defaults(run=_demo)

    status = with_dir(commands.add_parser(
        "status", help="`hoss status` of the local plane's dispatcher (more arguments go to it)"))
    status.set_defaults(run=_status)
    resched = with_dir(commands.add_parser(
        "reschedule", help="`hoss reschedule` on the local plane (more arguments, e.g. --dry-run, go to it)"))
    resched.set_defaults(run=_reschedule)
    explain = with_dir(commands.add_parser(
        "why", help="`hoss why` on the local plane: why a pod waits (more arguments, e.g. <namespace>/<pod> or "
        "--what-if FILE, go to it)"))
    explain.set_defaults(run=_why)

    image_command = commands.add_parser(
        "image", help="hoss's container image, built with buildah from a Debian root filesystem (no base image pulled)")
    image_commands = image_command.add_subparsers(dest="image_command", required=True)
    image_build = image_commands.add_parser("build", help="build deploy/Containerfile into buildah's storage")
    image_build.add_argument("--image", help="name:tag of the image (default ghcr.io/hoss-sched/hoss:<version>)")
    image_build.add_argument("--refresh-base", action="store_true",
                             help=f"make the Debian base again even when it is younger than "
                             f"{image.BASE_MAX_AGE_DAYS:.0f} days")
    image_build.set_defaults(run=_image_build)

    bench = with_dir(commands.add_parser("bench", help="benchmark hoss against kube-scheduler on the local plane"))
    bench.add_argument("--quick", action="store_true", help="a small version of every scenario (a few minutes)")
    bench.add_argument("--json", default=BENCH_JSON, help="where to write the figures (JSON)")
    bench.add_argument("--chart", default="bench/results/latest.png", help="where to write the chart (PNG)")
    bench.add_argument("--keep", action="store_true", help="leave the benchmark's plane running afterwards")
    bench.add_argument("--large", action="store_true",
                       help="only the large-cluster scenario (5,000 and 20,000 kwok nodes; about an hour): "
                            "bench/results/large.json and docs/benchmarks-large.md")
    bench.add_argument("--large-nodes", type=_node_counts, default=None, metavar="N,N",
                       help="with --large: these node counts instead (then the page is not written)")
    bench.add_argument("--large-pods", type=int, default=None, metavar="N",
                       help="with --large: pods per run instead of 5,000 (then the page is not written)")
    bench.set_defaults(run=_bench)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.run not in (_status, _reschedule, _why):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    try:
        return int(args.run(args))
    except (PlaneError, binaries.BinaryError, image.ImageError) as error:
        _say(f"error: {error}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
