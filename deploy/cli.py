"""``hoss``: the operator's command line (local control plane, demo)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.run import run_bench
from deploy import certs, lockdown
from deploy import status as status_view
from deploy.demo import run_demo
from deploy.local import binaries
from deploy.local.clean import clean
from deploy.local.plane import LocalPlane, PlaneError, default_directory
from rescheduler.oneshot import run_once
from rescheduler.settings import DEFAULT_MIN_STRANDED_GPUS


def _say(message: str) -> None:
    print(f"[hoss] {message}", file=sys.stderr, flush=True)


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


def _status(args: argparse.Namespace) -> int:
    url = args.url or status_view.dispatcher_url(_plane(args))
    token = args.token or os.environ.get("HOSS_TOKEN")
    print(status_view.render(status_view.fetch(url, token=token), url=url))
    return 0


def _reschedule(args: argparse.Namespace) -> int:
    kubeconfig, redis_url = args.kubeconfig, args.redis_url or os.environ.get("HOSS_REDIS_URL")
    if kubeconfig is None or redis_url is None:
        state = _plane(args).state()
        kubeconfig = kubeconfig or str(_plane(args).kubeconfig("admin"))
        redis_url = redis_url or state.redis_url
    text, code = asyncio.run(run_once(kubeconfig=kubeconfig, redis_url=redis_url, dry_run=args.dry_run,
                                      node_selector=args.node_selector, max_moves=args.max_moves,
                                      min_stranded_gpus=args.min_stranded_gpus, as_json=args.json))
    print(text)
    return code


def _bench(args: argparse.Namespace) -> int:
    binaries.build_missing()
    plane = _bench_plane(args)
    try:
        asyncio.run(run_bench(plane=plane, quick=args.quick, json_path=Path(args.json),
                              chart_path=Path(args.chart), plane_kept=args.keep))
    finally:
        if not args.keep:
            plane.down()
    return 0


def _certs(args: argparse.Namespace) -> int:
    lines = certs.run(
        output=Path(args.output) if args.output else None,
        kubeconfig=args.kubeconfig,
        context=args.context,
        service=args.service,
        namespace=args.namespace,
        cluster_domain=args.cluster_domain,
        extra_names=args.san,
        secret=args.secret,
        webhook=args.webhook,
        router=args.router,
    )
    for line in lines:
        print(line)
    return 0


def _lockdown(args: argparse.Namespace) -> int:
    directory = Path(args.output)
    files = lockdown.write(
        directory, namespace=args.namespace, redis_host=args.redis_host, control_plane_dir=args.control_plane_dir
    )
    for path in files:
        print(f"wrote {path}")
    print(f"next: copy {directory / 'control-plane'}/* to {args.control_plane_dir}/ on every control-plane node, start"
          f" kube-apiserver with --admission-control-config-file={args.control_plane_dir}/admission-configuration.yaml,"
          f" then kubectl apply -f {directory / 'manifests.yaml'}")
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoss", description="hoss: concurrent Kubernetes scheduling")
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
    demo.add_argument("--nodes", type=_positive, default=100, help="fake nodes to create (default 100)")
    demo.add_argument("--pods", type=_positive, default=1000, help="pods to schedule (default 1000)")
    demo.add_argument("--workers", type=_positive, default=3, help="hoss workers to run (default 3)")
    demo.add_argument("--json", action="store_true", help="print the final report as one JSON object")
    demo.set_defaults(run=_demo)

    status = with_dir(commands.add_parser("status", help="the dispatcher's /status as a table"))
    status.add_argument("--url", help="a dispatcher's /status URL (default: the local plane's dispatcher)")
    status.add_argument("--token", help="bearer token for a dispatcher with --access=kubernetes (default $HOSS_TOKEN;"
                        " e.g. $(kubectl create token <a ServiceAccount bound to hoss-viewer>))")
    status.set_defaults(run=_status)

    resched = with_dir(commands.add_parser(
        "reschedule", help="one round of the GPU defragmenting rescheduler: print the plan and carry it out"))
    resched.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    resched.add_argument("--kubeconfig", help="kubeconfig (default: the local plane's admin)")
    resched.add_argument("--redis-url", help="Redis of the ledger (default $HOSS_REDIS_URL, else the local plane's)")
    resched.add_argument("--node-selector", default="", help="only nodes with these labels (key=value,...)")
    resched.add_argument("--max-moves", type=_positive, default=4, help="most pods one plan moves (default 4)")
    resched.add_argument("--min-stranded-gpus", type=_non_negative, default=DEFAULT_MIN_STRANDED_GPUS,
                         help="the periodic pass (no pending pod) looks for a plan when this many GPUs are free on "
                              "partly used nodes (default 8; 0: pending pods only)")
    resched.add_argument("--json", action="store_true", help="print the plan (and its outcome) as JSON")
    resched.set_defaults(run=_reschedule)

    bench = with_dir(commands.add_parser("bench", help="benchmark hoss against kube-scheduler on the local plane"))
    bench.add_argument("--quick", action="store_true", help="a small version of every scenario (a few minutes)")
    bench.add_argument("--json", default="bench/results/latest.json", help="where to write the figures (JSON)")
    bench.add_argument("--chart", default="bench/results/latest.png", help="where to write the chart (PNG)")
    bench.add_argument("--keep", action="store_true", help="leave the benchmark's plane running afterwards")
    bench.set_defaults(run=_bench)

    tls = commands.add_parser(
        "certs",
        help="serving certificate of the resolver webhook: install it (Secret + caBundle) or write it to files",
    )
    tls.add_argument("--kubeconfig", help="kubeconfig to install with (default $KUBECONFIG, else ~/.kube/config)")
    tls.add_argument("--context", help="kubeconfig context (default: the current one)")
    tls.add_argument("--output", metavar="DIR", help="only write ca.crt, ca.key, tls.crt, tls.key and secret.yaml "
                     "to DIR (reusing a CA already there); nothing is sent to a cluster")
    tls.add_argument("--namespace", default=certs.DEFAULT_NAMESPACE, help="namespace of the resolver's Service and "
                     f"Secret (default {certs.DEFAULT_NAMESPACE})")
    tls.add_argument("--service", default=certs.DEFAULT_SERVICE,
                     help=f"the resolver's Service (default {certs.DEFAULT_SERVICE})")
    tls.add_argument("--secret", default=certs.DEFAULT_SECRET,
                     help=f"TLS Secret the resolver mounts (default {certs.DEFAULT_SECRET})")
    tls.add_argument("--webhook", default=certs.DEFAULT_WEBHOOK, help="ValidatingWebhookConfiguration whose "
                     f"caBundle to set (default {certs.DEFAULT_WEBHOOK})")
    tls.add_argument("--router", default=certs.ROUTER_WEBHOOK, help="MutatingWebhookConfiguration of the router "
                     "whose caBundle follows, when it exists ('' leaves every router alone; default "
                     f"{certs.ROUTER_WEBHOOK})")
    tls.add_argument("--cluster-domain", default=certs.DEFAULT_CLUSTER_DOMAIN,
                     help=f"cluster DNS domain (default {certs.DEFAULT_CLUSTER_DOMAIN})")
    tls.add_argument("--san", action="append", default=[], metavar="NAME",
                     help="one more DNS name or IP address for the certificate (repeatable)")
    tls.set_defaults(run=_certs)

    lock = commands.add_parser(
        "lockdown",
        help="the apiserver's webhook client certificate and admission configuration, and Redis ACL users: files",
    )
    lock.add_argument("--output", metavar="DIR", required=True, help="write control-plane/ (certificate, key,"
                      " kubeconfig, AdmissionConfiguration) and manifests.yaml (ConfigMap and Secrets) to DIR")
    lock.add_argument("--namespace", default=certs.DEFAULT_NAMESPACE,
                      help=f"namespace of hoss (default {certs.DEFAULT_NAMESPACE})")
    lock.add_argument("--redis-host", default=lockdown.DEFAULT_REDIS_HOST,
                      help=f"host in the components' Redis URLs (default {lockdown.DEFAULT_REDIS_HOST})")
    lock.add_argument("--control-plane-dir", default=lockdown.DEFAULT_CONTROL_PLANE_DIR,
                      help="where the control-plane files will live on the apiserver's nodes (default"
                      f" {lockdown.DEFAULT_CONTROL_PLANE_DIR})")
    lock.set_defaults(run=_lockdown)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (PlaneError, binaries.BinaryError, certs.CertsError) as error:
        _say(f"error: {error}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
