"""``hoss``: the operator's command line: the webhook's certificates, lock-down files, status, one rescheduling
round, why a pod waits. The local plane, the demo and the benchmark are development tools (``python -m dev``), not
installed with hoss."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy import certs, lockdown, why
from deploy import status as status_view
from deploy.argtypes import at_least
from rescheduler.oneshot import run_once
from rescheduler.settings import DEFAULT_MIN_STRANDED_GPUS


class UsageError(Exception):
    """A command was called without something it needs (what, in the message)."""


def _say(message: str) -> None:
    print(f"[hoss] {message}", file=sys.stderr, flush=True)


def _status(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("HOSS_STATUS_URL")
    if not url:
        raise UsageError("hoss status needs --url (or $HOSS_STATUS_URL): the dispatcher's /status URL")
    token = args.token or os.environ.get("HOSS_TOKEN")
    print(status_view.render(status_view.fetch(url, token=token), url=url))
    return 0


def _reschedule(args: argparse.Namespace) -> int:
    kubeconfig, redis_url = args.kubeconfig, args.redis_url or os.environ.get("HOSS_REDIS_URL")
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig is None or redis_url is None:
        raise UsageError("hoss reschedule needs --kubeconfig (or $KUBECONFIG) and --redis-url (or $HOSS_REDIS_URL)")
    text, code = asyncio.run(run_once(kubeconfig=kubeconfig, redis_url=redis_url, dry_run=args.dry_run,
                                      node_selector=args.node_selector, max_moves=args.max_moves,
                                      min_stranded_gpus=args.min_stranded_gpus, as_json=args.json))
    print(text)
    return code


def _why(args: argparse.Namespace) -> int:
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG")
    redis_url = args.redis_url or os.environ.get("HOSS_REDIS_URL")
    if kubeconfig is None or redis_url is None:
        raise UsageError("hoss why needs --kubeconfig (or $KUBECONFIG) and --redis-url (or $HOSS_REDIS_URL)")
    if (args.pod is None) == (args.what_if is None):
        raise UsageError("hoss why needs one pod: <namespace>/<pod>, or --what-if FILE")
    print(asyncio.run(why.run(kubeconfig=kubeconfig, redis_url=redis_url, policies_file=args.policies_file,
                              target=args.pod, manifest=Path(args.what_if) if args.what_if else None,
                              as_json=args.json, each_node=args.each_node, top=args.top)))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hoss", description="hoss: concurrent Kubernetes scheduling")
    commands = parser.add_subparsers(dest="command", required=True)

    status = commands.add_parser("status", help="the dispatcher's /status as a table")
    status.add_argument("--url", help="a dispatcher's /status URL (default $HOSS_STATUS_URL)")
    status.add_argument("--token", help="bearer token for a dispatcher with --access=kubernetes (default $HOSS_TOKEN;"
                        " e.g. $(kubectl create token <a ServiceAccount bound to hoss-viewer>))")
    status.set_defaults(run=_status)

    resched = commands.add_parser(
        "reschedule", help="one round of the GPU defragmenting rescheduler: print the plan and carry it out")
    resched.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    resched.add_argument("--kubeconfig", help="kubeconfig (default $KUBECONFIG)")
    resched.add_argument("--redis-url", help="Redis of the ledger (default $HOSS_REDIS_URL)")
    resched.add_argument("--node-selector", default="", help="only nodes with these labels (key=value,...)")
    resched.add_argument("--max-moves", type=at_least(1), default=4, help="most pods one plan moves (default 4)")
    resched.add_argument("--min-stranded-gpus", type=at_least(0), default=DEFAULT_MIN_STRANDED_GPUS,
                         help="the periodic pass (no pending pod) looks for a plan when this many GPUs are free on "
                              f"partly used nodes (default {DEFAULT_MIN_STRANDED_GPUS}; 0: pending pods only)")
    resched.add_argument("--json", action="store_true", help="print the plan (and its outcome) as JSON")
    resched.set_defaults(run=_reschedule)

    explain = commands.add_parser(
        "why", help="why a pod waits: each node (or class of nodes) and the first rule that rejects it there, with the "
        "figures, and where it would go")
    explain.add_argument("pod", nargs="?", help="the pending pod, <namespace>/<pod>")
    explain.add_argument("--what-if", metavar="FILE", help="explain a Pod manifest not yet created instead")
    explain.add_argument("--kubeconfig", help="kubeconfig (default $KUBECONFIG)")
    explain.add_argument("--redis-url", help="Redis of the ledger (default $HOSS_REDIS_URL; the dispatcher's "
                         "read-only user suffices)")
    explain.add_argument("--policies-file", default="configs/policies.yaml",
                         help="the workers' policies file (default configs/policies.yaml)")
    explain.add_argument("--each-node", action="store_true", help="one line per node instead of per class of nodes")
    explain.add_argument("--top", type=at_least(1), default=5, help="how many of the best nodes to list (default 5)")
    explain.add_argument("--json", action="store_true", help="print the answer as JSON (every node's verdict)")
    explain.set_defaults(run=_why)

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
    except (UsageError, status_view.StatusUnreachable, certs.CertsError, why.WhyError) as error:
        _say(f"error: {error}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
