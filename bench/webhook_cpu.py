"""CPU the resolver's webhook process spends per review, measured from outside the process.

``python bench/webhook_cpu.py --reviews 20000`` starts a redis-server of its own on a free port, loads the ledger
with a few roomy nodes and one reservation per review (as hoss's workers hold them before they bind), starts the
real webhook process on a self-signed serving certificate (deploy/pki.py) with client-certificate authentication
on, as in a cluster, and sends it binding AdmissionReviews shaped as the apiserver sends them, from hoss's worker
user, over a few kept-alive HTTPS connections (one review in flight on each, as the apiserver's HTTP/1.1 client
does). It reports the webhook process's user+system CPU seconds per review (from /proc/<pid>/stat, read before and
after, after a warm-up) and the reviews per second. Every review must be answered 200 and allowed (its reservation
confirmed): anything else fails the run, so the figure is always that of the hot path.

Only CPU of the webhook process is counted, so a busy machine slows the run but changes the figure little; reviews
per second depend on the machine and on this process, which is the client.

The tree measured is the one ``resolver`` imports from: set ``PYTHONPATH`` to an older checkout to measure that
checkout's webhook (``python -m resolver.webhook`` there, ``python -m resolver.main`` since the webhook was split;
the flags used exist in both). Hence this script imports nothing from the tree but the ledger and the certificate
helpers, found in either layout, and keeps its own few lines for /proc and free ports.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis
from redis.exceptions import RedisError

WORKER = "system:serviceaccount:hoss-system:hoss-worker"
"""The user the reviews come from: hoss's worker, whose bindings the ledger confirms by reservation."""
CLIENT_NAME = "kube-apiserver"
NAMESPACE = "bench"
NODE_ROOM = {"cpu": 10**9, "memory": 1 << 50, "pods": 10**9}
POD_REQUEST = {"cpu": 100, "memory": 128 << 20, "pods": 1}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def resolver_directory() -> Path:
    """The directory of the ``resolver`` package that imports here (PYTHONPATH's, else the installed tree's)."""
    spec = importlib.util.find_spec("resolver")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the resolver package cannot be imported: is PYTHONPATH a checkout of hoss?")
    return Path(next(iter(spec.submodule_search_locations)))


def webhook_module(package: Path) -> str:
    """The module that runs the webhook in that package. Looked for on disk: an import would fall back to the
    installed tree for a module the older tree lacks."""
    return "resolver.main" if (package / "main.py").exists() else "resolver.webhook"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def binding_review(index: int, *, node: str) -> bytes:
    """An AdmissionReview of a pods/binding CREATE by hoss's worker, as the apiserver sends it."""
    name, uid = pod_identity(index)
    return json.dumps({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "requestKind": {"group": "", "version": "v1", "kind": "Binding"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "binding",
            "name": name,
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {
                "username": WORKER,
                "uid": "3c5b8a4e-0d7e-4d0c-9a8e-1f2b3c4d5e6f",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:hoss-system", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["hoss-worker-0"],
                          "authentication.kubernetes.io/pod-uid": ["8a7b6c5d-4e3f-2a1b-0c9d-8e7f6a5b4c3d"]},
            },
            "object": {
                "kind": "Binding", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "creationTimestamp": None,
                             "labels": {"hoss.io/lane": str(index % 8)}},
                "target": {"kind": "Node", "name": node},
            },
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }).encode()


def pod_identity(index: int) -> tuple[str, str]:
    return f"pod-{index}", f"00000000-0000-4000-8000-{index:012d}"


@contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A redis-server of its own, without persistence; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no"], cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


async def load_ledger(url: str, *, package: Path, nodes: list[str], pods: int) -> None:
    """Roomy nodes, and a reservation by hoss's worker of pod i on node i mod len(nodes), for each review; with the
    ledger client of the tree measured (``package``: its resolver package; older trees keep it there)."""
    client_module = importlib.import_module("resolver.ledger" if (package / "ledger.py").exists()
                                            else "hoss.ledger.client")
    async with Redis.from_url(url) as admin:
        for _ in range(100):
            try:
                await admin.ping()
                break
            except (OSError, RedisError):
                await asyncio.sleep(0.05)
    ledger: Any = client_module.Ledger.from_url(url)
    try:
        await ledger.rebuild(nodes=[(node, NODE_ROOM, {}) for node in nodes], bound=[])
        for start in range(0, pods, 32):
            results = await asyncio.gather(*(
                ledger.reserve(uid=pod_identity(i)[1], pod=f"{NAMESPACE}/{pod_identity(i)[0]}",
                               node=nodes[i % len(nodes)], request=POD_REQUEST, owner=WORKER, ttl_seconds=3600)
                for i in range(start, min(start + 32, pods))
            ))
            refused = [result for result in results if type(result).__name__ != "Reserved"]
            if refused:
                raise SystemExit(f"the ledger refused a reservation: {refused[0]!r}")
    finally:
        await ledger.close()


def certificates(directory: Path) -> dict[str, Path]:
    """The serving certificate (for 127.0.0.1), the client CA and the apiserver's client certificate."""
    try:
        pki: Any = importlib.import_module("deploy.pki")
    except ModuleNotFoundError:  # older trees
        pki = importlib.import_module("deploy.local.pki")
    server_ca = pki.ensure_ca(directory / "server-ca")
    serving = pki.issue(server_ca, directory=directory, name="serving", common_name="hoss-resolver",
                        ip_addresses=("127.0.0.1",), server=True)
    client_ca = pki.ensure_ca(directory / "client-ca", common_name="webhook-client-ca")
    client = pki.issue(client_ca, directory=directory, name="apiserver", common_name=CLIENT_NAME)
    return {"server_ca": server_ca.cert, "cert": serving.cert, "key": serving.key, "client_ca": client_ca.cert,
            "client_cert": client.cert, "client_key": client.key}


def kubeconfig(directory: Path) -> Path:
    """A kubeconfig naming an apiserver that is not there: the webhook judges reviews by reservation without one,
    and its Lease election and namespace informer retry in the background (the same in every tree measured)."""
    path = directory / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
    }))
    return path


class WebhookDown(Exception):
    """The webhook exited, or did not get ready."""


async def wait_ready(session: aiohttp.ClientSession, url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise WebhookDown(f"the webhook exited with status {process.returncode}")
        try:
            async with session.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.1)
    raise WebhookDown("the webhook was not ready within 60 s")


async def send(session: aiohttp.ClientSession, url: str, bodies: list[bytes], *, connections: int) -> Counter[str]:
    """POST every body, ``connections`` at a time (one in flight per connection); the answers' outcomes."""
    outcomes: Counter[str] = Counter()
    queue = iter(bodies)

    async def one_connection() -> None:
        for body in queue:
            async with session.post(f"{url}/validate-binding", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                answer = await response.read()
            if response.status != 200:
                outcomes[f"HTTP {response.status}"] += 1
                continue
            verdict = json.loads(answer)["response"]
            outcomes["allowed" if verdict["allowed"] else verdict.get("status", {}).get("message", "denied")] += 1

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return outcomes


@contextmanager
def webhook_process(directory: Path, *, module: str, port: int, redis_url: str,
                    files: dict[str, Path]) -> Iterator[subprocess.Popen[bytes]]:
    """The webhook, logging to webhook.log in ``directory``, stopped (SIGTERM) on exit."""
    argv = [sys.executable, "-m", module, f"--kubeconfig={kubeconfig(directory)}", "--host=127.0.0.1",
            f"--port={port}", f"--tls-cert-file={files['cert']}", f"--tls-key-file={files['key']}",
            f"--client-ca-file={files['client_ca']}", f"--client-names={CLIENT_NAME}", "--log-level=WARNING",
            "--identity=bench-webhook-cpu"]
    # cwd is the scratch directory, so that `-m` finds the webhook where PYTHONPATH (or the install) says.
    with (directory / "webhook.log").open("wb") as log:
        process = subprocess.Popen(argv, cwd=directory, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "HOSS_REDIS_URL": redis_url})
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def drive(args: argparse.Namespace, *, package: Path, process: subprocess.Popen[bytes], port: int,
                redis_url: str, nodes: list[str], files: dict[str, Path]) -> tuple[Counter[str], float, float]:
    """Load the ledger, wait for the webhook, warm it up, then send the measured reviews: every outcome, the
    webhook's CPU seconds and the wall seconds of the measured reviews."""
    warmup = min(args.warmup, args.reviews)
    await load_ledger(redis_url, package=package, nodes=nodes, pods=warmup + args.reviews)
    context = ssl.create_default_context(cafile=str(files["server_ca"]))
    context.load_cert_chain(files["client_cert"], files["client_key"])
    url = f"https://127.0.0.1:{port}"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=args.connections)) as session:
        await wait_ready(session, url, process)
        bodies = [binding_review(i, node=nodes[i % len(nodes)]) for i in range(warmup + args.reviews)]
        outcomes = await send(session, url, bodies[:warmup], connections=args.connections)
        before = cpu_seconds(process.pid)
        started = time.perf_counter()
        outcomes += await send(session, url, bodies[warmup:], connections=args.connections)
        wall = time.perf_counter() - started
        used = cpu_seconds(process.pid) - before
    return outcomes, used, wall


def measure(args: argparse.Namespace, directory: Path) -> int:
    package = resolver_directory()
    module = webhook_module(package)
    nodes = [f"node-{i}" for i in range(args.nodes)]
    files = certificates(directory)
    port = free_port()
    print(f"webhook:     python -m {module} (from {package.parent})")
    with redis_server(directory) as redis_url, webhook_process(directory, module=module, port=port,
                                                                  redis_url=redis_url, files=files) as process:
        try:
            outcomes, used, wall = asyncio.run(drive(args, package=package, process=process, port=port,
                                                     redis_url=redis_url, nodes=nodes, files=files))
        except WebhookDown as error:
            outcomes, used, wall = Counter({str(error): 1}), 0.0, 0.0
    warmup = min(args.warmup, args.reviews)
    wrong = outcomes - Counter({"allowed": warmup + args.reviews})
    if wrong:
        log = (directory / "webhook.log").read_text(errors="replace")[-3000:]
        print(f"FAILED: not every review was allowed: {dict(wrong)}; the webhook's log ends:\n{log}", file=sys.stderr)
        return 1
    print(f"reviews:     {args.reviews} after {warmup} to warm up, over {args.connections} kept-alive HTTPS connections"
          f" with a client certificate; {args.nodes} nodes in the ledger")
    print(f"webhook CPU: {used / args.reviews * 1e6:.1f} us per review ({used:.2f} s in all)")
    print(f"throughput:  {args.reviews / wall:.0f} reviews/s ({wall:.2f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/webhook_cpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--reviews", type=int, default=20000, help="reviews measured (default 20000)")
    parser.add_argument("--warmup", type=int, default=1000, help="reviews sent first, not measured (default 1000)")
    parser.add_argument("--connections", type=int, default=4, help="kept-alive HTTPS connections (default 4)")
    parser.add_argument("--nodes", type=int, default=4, help="nodes in the ledger (default 4)")
    args = parser.parse_args(argv)
    if args.reviews < 1 or args.connections < 1 or args.nodes < 1 or args.warmup < 0:
        parser.error("--reviews, --connections and --nodes must be at least 1, --warmup at least 0")
    with tempfile.TemporaryDirectory(prefix="hoss-webhook-cpu-") as directory:
        return measure(args, Path(directory))


if __name__ == "__main__":
    sys.exit(main())
