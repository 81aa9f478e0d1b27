"""Who may reach the guarantee's parts, on the real plane (issue 33, items 7 to 9): the webhook's port against a
flood of parked connections and malformed requests, each component's Redis user against writes it has no business
making, and a dispatcher leader paused past its Lease against the queues its successor now owns.

The dispatcher test runs two dispatchers of its own on a Lease and a scheduler name of their own (so that the
session's dispatcher, if one runs, neither competes nor sees the test's pods), and one worker simulated by its
heartbeat, whose stream nobody reads: what each leader wrote there stays to be counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from redis.exceptions import NoPermissionError

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.kube.client import KubeError, request_json
from hoss.ledger.arguments import MoveHold
from hoss.ledger.client import Ledger
from hoss.ledger.keys import KEY_PREFIX, READY_KEY
from hoss.model.objects import Json
from hoss.queue import WorkerInfo, WorkItem, WorkQueue, queue_key, worker_key
from tests.e2e.guard import one_node, pod_on
from tests.e2e.hoss import metric_total, metrics_text
from tests.e2e.proxy import FreezableProxy
from tests.waiting import until


async def ledger_knows(ledger: Ledger, node: str) -> None:
    async def known() -> tuple[bool, str]:
        return node in await ledger.node_usage([node]), "not in the ledger yet"

    await until(known, timeout=30, what=f"the sync to add node {node} to the ledger")


# -- item 7: the webhook's port ---------------------------------------------------------------------------------

HANDSHAKING = 2400
"""Connections that start a TLS handshake and never finish it (the start of a ClientHello)."""
SLOW_BODIES = 600
"""TLS connections without a client certificate that post a review announced at 1 MiB, send 64 KiB of it and then
a byte now and then."""
GROWTH_BOUND = 96 << 20
"""What the parked connections may add to the resolver's memory at most: the anonymous connections it keeps open
(--max-anonymous-connections, 128, at up to some 300 KiB each), not one connection's buffers (some 60 KiB in a
handshake, 200 KiB with a body on its way) per connection a client opens: the 3,000 here grew it by 240 MiB."""
CLIENT_HELLO_START = bytes.fromhex("160301020001" "0001fc0303")


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def resolver_tls(plane: LocalPlane, *, as_apiserver: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    if as_apiserver:
        context.load_cert_chain(plane.webhook_client_dir / "apiserver.crt",
                                plane.webhook_client_dir / "apiserver.key")
    return context


class Parked:
    """One parked connection, ``settled`` once it has sent its start (or the resolver refused it); ``closed`` once
    the resolver closed it."""

    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.settled = asyncio.Event()
        self.closed = False

    async def park(self, port: int, context: ssl.SSLContext | None) -> None:
        """Without ``context``: a handshake that stops after the first bytes of its ClientHello; with it: a slow
        body."""
        try:
            if context is None:
                reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
                self.writer.write(CLIENT_HELLO_START)
            else:
                reader, self.writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
                self.writer.write(b"POST /validate-binding HTTP/1.1\r\nHost: resolver\r\n"
                                  b"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
                                  + b" " * (64 << 10))
            await self.writer.drain()
        except (OSError, ssl.SSLError):
            self.closed = True
            return
        finally:
            self.settled.set()
        with contextlib.suppress(OSError, ssl.SSLError):
            while await reader.read(65536):  # whatever the resolver answers, until it closes the connection
                pass
        self.closed = True

    async def trickle(self) -> None:
        """One more byte, as a slow client sends them."""
        if self.writer is not None and not self.closed:
            with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
                self.writer.write(b" ")
                await self.writer.drain()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@contextlib.asynccontextmanager
async def parked_connections(port: int, context: ssl.SSLContext) -> AsyncIterator[list[Parked]]:
    """`HANDSHAKING` connections stuck in their handshake, then `SLOW_BODIES` slow bodies, opened in bursts; yields
    once every one has sent its start and a probe opened after them all is answered (so the resolver has taken
    them all in), and keeps the open ones trickling until the block ends."""
    parked = [Parked() for _ in range(HANDSHAKING + SLOW_BODIES)]
    tasks: list[asyncio.Task[None]] = []
    for start in range(0, len(parked), 100):
        burst = parked[start:start + 100]
        tasks += [asyncio.create_task(p.park(port, None if start + i < HANDSHAKING else context))
                  for i, p in enumerate(burst)]
        await asyncio.gather(*(p.settled.wait() for p in burst))

    async def trickling() -> None:
        while True:
            await asyncio.gather(*(p.trickle() for p in parked))
            await asyncio.sleep(0.5)  # the pace of a slow client, not a wait for a condition

    feeder = asyncio.create_task(trickling())
    try:
        async with aiohttp.ClientSession() as session, session.get(f"https://127.0.0.1:{port}/healthz",
                                                                   ssl=context) as probe:
            assert probe.status == 200
        yield parked
    finally:
        feeder.cancel()
        for p in parked:
            p.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(feeder, *tasks, return_exceptions=True)


async def test_parked_connections_neither_grow_the_resolver_nor_stop_it_judging(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    """Thousands of connections that park, in their TLS handshake or sending a review's body slowly without a client
    certificate, hold the resolver's memory for as long as they stay. They must not grow it by more than the few
    it keeps, and the apiserver's reviews go on being judged meanwhile: a pod that fits is admitted, one that does
    not is refused."""
    resolver = plane.running("hoss-resolver")
    assert resolver is not None and resolver.port is not None
    node = await one_node(cluster, "g7-parked", "2")
    try:
        before = resident_bytes(resolver.pid)
        async with parked_connections(resolver.port, resolver_tls(plane)) as parked:
            grown = resident_bytes(resolver.pid) - before
            still_open = sum(1 for p in parked if not p.closed)
            await request_json(cluster.core.create_namespaced_pod, namespace, pod_on("fits", node, "1500m"))
            with pytest.raises(KubeError) as refused:
                await request_json(cluster.core.create_namespaced_pod, namespace, pod_on("over", node, "1"))
            assert "has no room" in str(refused.value)
        assert grown < GROWTH_BOUND, (
            f"{len(parked)} parked connections ({still_open} still open) grew the resolver by {grown >> 20} MiB")
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


def log_size(log: Path) -> int:
    return log.stat().st_size


def log_since(log: Path, offset: int) -> str:
    with log.open("rb") as text:
        text.seek(offset)
        return text.read().decode(errors="replace")


async def test_a_content_length_that_is_no_number_gets_400_and_no_traceback(plane: LocalPlane) -> None:
    """``Content-Length: ²`` (a digit to str.isdigit, not to int) and its kin are answered 400, and the resolver's
    log gets no traceback for them."""
    resolver = plane.running("hoss-resolver")
    assert resolver is not None and resolver.port is not None
    log = Path(resolver.log)
    logged = log_size(log)
    for length in ("²".encode(), b"12a", b"-1", b"1, 2", b"99999999999999999999999"):
        reader, writer = await asyncio.open_connection("127.0.0.1", resolver.port,
                                                       ssl=resolver_tls(plane, as_apiserver=True))
        writer.write(b"POST /validate-binding HTTP/1.1\r\nHost: resolver\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + length + b"\r\n\r\n{}")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", (length, answer[:200])
    written = log_since(log, logged)
    assert "Traceback" not in written, written[-3000:]


DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"


def test_the_base_admits_to_the_resolvers_port_only_the_apiservers_source_and_the_scrapers(
    plane: LocalPlane, tmp_path: Path
) -> None:
    """deploy/'s NetworkPolicy selects the resolver's pods and opens their port to two sources only: the apiserver's
    (an address block the operator fills in, a documentation address until then) and the monitoring namespace;
    the apiserver accepts it."""
    base = [doc for doc in yaml.safe_load_all(plane.kubectl("kustomize", str(DEPLOY_DIR))) if doc]
    (policy,) = [o for o in base if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "hoss-resolver"]
    (resolver,) = [o for o in base if o["kind"] == "Deployment" and o["metadata"]["name"] == "hoss-resolver"]
    pod_labels = resolver["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (port,) = [p for c in resolver["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    assert rule["ports"] == [{"port": port["containerPort"], "protocol": "TCP"}]
    assert rule["from"] == [{"ipBlock": {"cidr": "192.0.2.1/32"}},
                            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    plane.kubectl("apply", "--dry-run=server", "-f", str(tmp_path / "policy.yaml"))


# -- item 8: each component's Redis user --------------------------------------------------------------------------


async def denied(url: str, writes: Sequence[tuple[str, ...]]) -> list[str]:
    """Each of ``writes`` tried under the user of ``url``: those Redis let through."""
    allowed = []
    async with aioredis.Redis.from_url(url, decode_responses=True) as client:
        command: Any = client.execute_command  # redis-py leaves it untyped
        for write in writes:
            try:
                await command(*write)
            except NoPermissionError:
                continue
            allowed.append(" ".join(write[:2]))
    return allowed


async def test_the_rescheduler_and_the_workers_cannot_free_a_node_or_touch_the_ready_flag(
    plane: LocalPlane, cluster: Cluster
) -> None:
    """On the plane's own Redis and ACL file: the rescheduler's user holds and drops room (what it is for) but may
    not write a node's used total, an entry or the ready flag; the workers' user may not write the ready flag or a
    node's allocatable. The writes tried change nothing if they pass (an increment by 0, the flag set to what it
    is), so a failing run leaves the ledger as it was."""
    state = plane.state()
    node = await one_node(cluster, "g8-acl", "2")
    admin = aioredis.Redis.from_url(state.redis_url_for("admin"), decode_responses=True)
    try:
        async with Ledger.from_url(state.redis_url_for("admin")) as ledger:
            await ledger_knows(ledger, node)
        flag = await admin.get(READY_KEY)
        assert flag is not None
        ready = str(flag)
        async with Ledger.from_url(state.redis_url_for("hoss-rescheduler")) as rescheduler:
            assert await rescheduler.hold_moves([MoveHold(key="g8-pending", node=node, request={"cpu": 500})],
                                                ttl_seconds=30) is None
            assert await rescheduler.unnominate("g8-pending")
        node_keys = f"{KEY_PREFIX}:node:{node}"
        rescheduler_may = await denied(state.redis_url_for("hoss-rescheduler"), [
            ("HINCRBY", f"{node_keys}:used", "cpu", "0"), ("SET", READY_KEY, ready),
            ("HINCRBY", f"{node_keys}:alloc", "cpu", "0"), ("SREM", f"{node_keys}:bound", "no-such-uid"),
        ])
        worker_may = await denied(state.redis_url_for("hoss-worker"), [
            ("SET", READY_KEY, ready), ("HINCRBY", f"{node_keys}:alloc", "cpu", "0"),
        ])
        assert (rescheduler_may, worker_may) == ([], []), "writes the users' ACL should refuse"
    finally:
        # The refusals above are in Redis's ACL log; anything else there is a component's, and the conftest's check
        # must still see it.
        entries = await admin.acl_log(count=100)
        ours = [e for e in entries if e["username"] in ("hoss-rescheduler", "hoss-worker")
                and e["object"] in (f"{KEY_PREFIX}:node:{node}:used", READY_KEY, f"{KEY_PREFIX}:node:{node}:alloc",
                                    f"{KEY_PREFIX}:node:{node}:bound")]
        if len(ours) == len(entries):
            await admin.acl_log_reset()
        await admin.aclose()
        await cluster.delete_nodes([node])


# -- item 9: fencing the dispatcher leader ------------------------------------------------------------------------

FENCE_LEASE = "hoss-dispatcher-fence"
FENCE_SCHEDULER = "hoss-fence"
FENCE_POLICY = "fence"
FENCE_WORKER = "fence-w"


def fence_dispatcher_args(redis_url: str | None = None) -> list[str]:
    """A dispatcher on the test's Lease (a short one: a paused leader loses it in 4 s) and scheduler name; full
    rounds only when it takes over (new pods are sent as they come), and no worker declared stalled in the test's
    time (the simulated worker never reads)."""
    args = [f"--lease-name={FENCE_LEASE}", "--lease-duration-seconds=4", "--renew-deadline-seconds=3",
            "--renew-interval-seconds=1", f"--scheduler-names={FENCE_SCHEDULER}", "--reclaim-interval-seconds=3600",
            "--stall-seconds=3600"]
    return args + ([f"--redis-url={redis_url}"] if redis_url is not None else [])


async def leads(dispatcher: Process) -> bool:
    text = await metrics_text(f"http://127.0.0.1:{dispatcher.port}/metrics")
    return metric_total(text, "hoss_dispatcher_leader") == 1


async def stream_uids(admin: aioredis.Redis, worker_id: str) -> list[str]:
    """The pod uids of every item in a worker's stream, in order."""
    entries: Any = await admin.xrange(queue_key(worker_id))
    return [WorkItem.decode(fields).uid for _id, fields in entries]


def fence_pod(name: str) -> Json:
    return pod_manifest(name, requests={"cpu": "100m"}, scheduler_name=FENCE_SCHEDULER,
                        labels={"hoss.io/policy": FENCE_POLICY})


async def test_a_paused_dispatcher_leader_cannot_write_the_queues_after_another_took_over(
    plane: LocalPlane, cluster: Cluster, namespace: str
) -> None:
    """Leader A reaches Redis through a proxy. A pod arrives and A sends it to the (one) worker, but its write is
    held on the way; A is paused (SIGSTOP) until its Lease lapses and B takes over and sends the pod itself. Then
    A's write arrives, and A resumes: the write carries A's term, which B's supersedes, so Redis refuses it and the
    worker's stream holds the pod once, B's."""
    state = plane.state()
    admin = aioredis.Redis.from_url(state.redis_url_for("admin"), decode_responses=True)
    queue = WorkQueue(admin)
    proxy = FreezableProxy(state.redis_port, hold="requests")
    started: list[str] = []
    paused: Process | None = None
    try:
        await queue.ensure_group(FENCE_WORKER)
        await queue.heartbeat(WorkerInfo(id=FENCE_WORKER, policies=[FENCE_POLICY]), ttl_seconds=600)
        proxy_port = await proxy.start()
        via_proxy = state.redis_url_for("hoss-dispatcher").replace(f":{state.redis_port}/", f":{proxy_port}/")
        first = plane.start_dispatcher(name="hoss-dispatcher-fence-a", extra_args=fence_dispatcher_args(via_proxy))
        started.append(first.name)
        await until(lambda: leads(first), timeout=30, what="dispatcher A to lead")
        second = plane.start_dispatcher(name="hoss-dispatcher-fence-b", extra_args=fence_dispatcher_args())
        started.append(second.name)

        warm = await request_json(cluster.core.create_namespaced_pod, namespace, fence_pod("warm-up"))

        async def sent(uid: str, times: int) -> tuple[bool, str]:
            uids = await stream_uids(admin, FENCE_WORKER)
            return uids.count(uid) >= times, f"stream {uids}"

        await until(lambda: sent(warm["metadata"]["uid"], 1), timeout=30, what="leader A to send the first pod")

        proxy.freeze()
        late = await request_json(cluster.core.create_namespaced_pod, namespace, fence_pod("late"))
        uid = late["metadata"]["uid"]

        def held() -> tuple[bool, str]:
            return proxy.holding(uid.encode()) is not None, f"{sum(len(link.held) for link in proxy.links)} bytes held"

        await until(held, timeout=30, what="leader A's write of the new pod to reach the proxy")
        os.kill(first.pid, signal.SIGSTOP)
        paused = first
        await until(lambda: leads(second), timeout=30, what="dispatcher B to take over")
        await until(lambda: sent(uid, 1), timeout=30, what="leader B to send the new pod")

        link = proxy.holding(uid.encode())
        assert link is not None
        proxy.thaw()
        await until(link.answered.is_set, timeout=30, what="Redis to answer A's late write")
        os.kill(first.pid, signal.SIGCONT)
        paused = None
        await until(lambda: not_leading(first), timeout=30, what="dispatcher A to step down")
        uids = await stream_uids(admin, FENCE_WORKER)
        assert uids.count(uid) == 1, f"the pod was queued {uids.count(uid)} times: {uids}"
        assert await admin.hget(f"{KEY_PREFIX}:dispatched", uid) == FENCE_WORKER
        text = await metrics_text(f"http://127.0.0.1:{first.port}/metrics")
        assert metric_total(text, "hoss_dispatcher_fenced_writes_total") >= 1, "A never saw its write refused"
    finally:
        if paused is not None:
            os.kill(paused.pid, signal.SIGCONT)
        plane.stop_processes(started)
        await proxy.close()
        plane.kubectl("-n", "hoss-system", "delete", "lease", FENCE_LEASE, "--ignore-not-found")
        await cluster.delete_pods(namespace)
        dispatched = await admin.hgetall(f"{KEY_PREFIX}:dispatched")
        ours = [u for u, owner in dispatched.items() if owner == FENCE_WORKER]
        if ours:
            await admin.hdel(f"{KEY_PREFIX}:dispatched", *ours)
        await admin.delete(queue_key(FENCE_WORKER), worker_key(FENCE_WORKER))
        await admin.srem(f"{KEY_PREFIX}:workers", FENCE_WORKER)
        terms = [key async for key in admin.scan_iter(match=f"{KEY_PREFIX}:term:*{FENCE_LEASE}")]
        if terms:
            await admin.delete(*terms)
        await admin.aclose()


async def not_leading(dispatcher: Process) -> bool:
    return not await leads(dispatcher)
