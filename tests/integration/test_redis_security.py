"""Redis with ACL users and TLS, as a managed Redis is set up: a real redis-server on a TLS port that requires a
client certificate, an ACL user limited to ``{hoss}:*``, and every hoss client (redis-py for the sync, dispatcher and
workers; the resolver's pipelined client for the webhook) connecting with a ``rediss://user:password@`` URL."""

from __future__ import annotations

import importlib.resources
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hiredis
import pytest
import pytest_asyncio
import redis
import redis.asyncio
from redis.exceptions import AuthenticationError, ConnectionError, NoPermissionError, ResponseError

from deploy import lockdown, pki
from dev.local.ports import free_port
from dev.local.redis_server import redis_version
from hoss.ledger.arguments import MoveHold, Placement
from hoss.ledger.client import Ledger
from hoss.ledger.connection import HiredisConnection, HiredisSSLConnection, ledger_redis
from hoss.ledger.keys import CHANGES_KEY, EPOCH_KEY, KEY_PREFIX, READY_KEY, STATS_KEY
from hoss.ledger.redisclient import PipelinedRedis
from hoss.ledger.results import Reserved
from hoss.queue import WorkerInfo, WorkItem, WorkQueue
from hoss.settings import SettingsError, load_settings
from resolver.settings import ResolverSettings
from tests.integration.redis_server import redis_server_binary, start_redis_server, stop_redis_server
from tests.kube_objects import node_row

PASSWORD = "s3cret-for-the-test"


@dataclass(frozen=True)
class SecureRedis:
    port: int
    ca: pki.KeyPair
    client: pki.KeyPair

    def url(self, *, user: str = "hoss", password: str = PASSWORD, client_cert: bool = True) -> str:
        query = {"ssl_ca_certs": str(self.ca.cert)}
        if client_cert:
            query |= {"ssl_certfile": str(self.client.cert), "ssl_keyfile": str(self.client.key)}
        return f"rediss://{user}:{password}@127.0.0.1:{self.port}/0?{urllib.parse.urlencode(query)}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secure_redis(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SecureRedis]:
    workdir = tmp_path_factory.mktemp("redis-tls")
    ca = pki.ensure_ca(workdir, common_name="redis-test-ca")
    server = pki.issue(ca, directory=workdir, name="server", common_name="redis", ip_addresses=("127.0.0.1",),
                       server=True)
    client = pki.issue(ca, directory=workdir, name="client", common_name="hoss")
    acl = workdir / "users.acl"
    acl.write_text(
        "user default off resetkeys -@all\n"
        f"user hoss on >{PASSWORD} resetkeys ~{{hoss}}:* resetchannels -@all +@read +@write +@scripting"
        " -@dangerous +ping +time +hello +select +client|setname\n"
    )
    secure = SecureRedis(free_port(), ca, client)
    log = workdir / "redis.log"
    process = await start_redis_server(
        ["--bind", "127.0.0.1", "--port", "0", "--tls-port", str(secure.port), "--tls-cert-file", str(server.cert),
         "--tls-key-file", str(server.key), "--tls-ca-cert-file", str(ca.cert), "--tls-auth-clients", "yes",
         "--aclfile", str(acl), "--save", "", "--appendonly", "no", "--dir", str(workdir), "--logfile", str(log)],
        url=secure.url(), log=log)
    try:
        yield secure
    finally:
        await stop_redis_server(process)


async def test_the_ledger_works_over_tls_with_an_acl_user_through_both_clients(secure_redis: SecureRedis) -> None:
    sync_ledger = Ledger(ledger_redis(secure_redis.url()), owns_client=True)
    review_ledger = Ledger(PipelinedRedis(secure_redis.url()), owns_client=True)
    try:
        await sync_ledger.rebuild(nodes=[("n1", {"cpu": 2000, "pods": 10}, {})], bound=[])
        result = await review_ledger.confirm(uid="u1", pod="ns/p1", node="n1", request={"cpu": 500, "pods": 1},
                                             owner="foreign:someone", verify_after_seconds=30)
        assert type(result).__name__ == "Confirmed"
        assert await review_ledger.is_ready()
        usage = await sync_ledger.node_usage(["n1"])
        assert usage["n1"][1]["cpu"] == 500
    finally:
        await review_ledger.close()
        await sync_ledger.close()


async def test_the_ledgers_redis_py_client_packs_every_command_with_hiredis_over_plain_and_tls(
    redis_url: str, secure_redis: SecureRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ledger_redis's connections hand each command to hiredis's C packer, on a redis:// and on a rediss:// URL
    (whose connection stays TLS: the secure server listens on nothing else)."""
    packed: list[tuple[Any, ...]] = []
    pack = hiredis.pack_command

    def recording(command: Any) -> bytes:  # Any: hiredis's stub types a command as a 1-tuple
        packed.append(command)
        return bytes(pack(command))

    monkeypatch.setattr(hiredis, "pack_command", recording)
    for url, kind in ((redis_url, HiredisConnection), (secure_redis.url(), HiredisSSLConnection)):
        packed.clear()
        client = ledger_redis(url)
        try:
            assert client.connection_pool.connection_class is kind
            await client.set("{hoss}:probe", "packed")
            assert await client.get("{hoss}:probe") == "packed"
            await client.script_load("return 1")
        finally:
            await client.aclose()
        assert ("SET", "{hoss}:probe", "packed") in packed, url
        assert ("GET", "{hoss}:probe") in packed, url
        assert ("SCRIPT", "LOAD", "return 1") in packed, f"{url}: a two-word command goes as two words"


async def test_the_acl_user_is_confined_to_hoss_keys_and_its_commands(secure_redis: SecureRedis) -> None:
    async with redis.asyncio.Redis.from_url(secure_redis.url(), decode_responses=True) as client:
        await client.set("{hoss}:probe", "1")
        with pytest.raises(NoPermissionError):
            await client.set("elsewhere", "1")
        with pytest.raises(NoPermissionError):
            await client.flushall()
    pipelined = PipelinedRedis(secure_redis.url())
    try:
        with pytest.raises(ResponseError, match="NOPERM"):
            await pipelined.get("elsewhere")
        assert await pipelined.get("{hoss}:probe") == "1"
    finally:
        await pipelined.aclose()


async def test_a_wrong_password_or_no_client_certificate_gets_no_access(secure_redis: SecureRedis) -> None:
    wrong = secure_redis.url(password="guess")
    async with redis.asyncio.Redis.from_url(wrong) as client:
        with pytest.raises(AuthenticationError):
            await client.ping()
    pipelined = PipelinedRedis(wrong)
    with pytest.raises(ResponseError, match="WRONGPASS"):
        await pipelined.get("{hoss}:probe")
    await pipelined.aclose()
    no_cert = PipelinedRedis(secure_redis.url(client_cert=False))
    with pytest.raises(ConnectionError):
        await no_cert.get("{hoss}:probe")
    await no_cert.aclose()


def test_a_missing_tls_file_in_the_redis_url_stops_start_up_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    url = f"rediss://hoss:{PASSWORD}@redis:6380/0?ssl_ca_certs={missing}"
    with pytest.raises(SettingsError) as caught:
        load_settings(ResolverSettings, ["--tls-cert-file=c", "--tls-key-file=k", f"--redis-url={url}"],
                      prog="hoss-resolver", description="")
    message = str(caught.value)
    assert f"ssl_ca_certs={missing}: No such file or directory" in message
    assert "redis_url" in message
    assert PASSWORD not in message, "the password is never printed"
    with pytest.raises(SettingsError, match="ssl_certfile needs a rediss:// URL"):
        load_settings(ResolverSettings, ["--tls-cert-file=c", "--tls-key-file=k",
                                         f"--redis-url=redis://h:6379/0?ssl_certfile={missing}"],
                      prog="hoss-resolver", description="")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hoss_acl_redis(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, str]]:
    """A real redis-server loading the ACL file hoss deploys (deploy.lockdown.redis_acl: one user per component,
    the default user off); the Redis URL of each component."""
    workdir = tmp_path_factory.mktemp("redis-acl")
    passwords = lockdown.new_passwords((*lockdown.COMPONENTS, "admin"))
    acl = workdir / "users.acl"
    acl.write_text(lockdown.redis_acl(passwords, admin=True,
                                      client_setinfo=redis_version(redis_server_binary()) >= (7, 2)))
    port = free_port()
    log = workdir / "redis.log"
    urls = {user: f"redis://{user}:{password}@127.0.0.1:{port}/0" for user, password in passwords.items()}
    process = await start_redis_server(
        ["--bind", "127.0.0.1", "--port", str(port), "--aclfile", str(acl), "--save", "", "--appendonly", "no",
         "--dir", str(workdir), "--logfile", str(log)],
        url=urls["admin"], log=log)
    try:
        yield urls
    finally:
        await stop_redis_server(process)


async def test_the_dispatcher_reads_the_ledger_but_cannot_write_the_ready_flag(hoss_acl_redis: dict[str, str]) -> None:
    """The dispatcher's user may only read the ledger: its snapshot runs (EVALSHA_RO), but writing {hoss}:ready
    (which would make the webhook deny every binding) gets NOPERM, and so does the same script through plain
    EVALSHA, which Redis counts as writing its declared keys."""
    async with Ledger.from_url(hoss_acl_redis["hoss-resolver"]) as resolver:
        await resolver.rebuild(nodes=[("n1", {"cpu": 2000, "pods": 10}, {"zone": "a"})], bound=[])
    dispatcher = redis.asyncio.Redis.from_url(hoss_acl_redis["hoss-dispatcher"], decode_responses=True)
    try:
        ledger = Ledger(dispatcher)
        snapshot = await ledger.snapshot()
        assert snapshot.ready and set(snapshot.nodes) == {"n1"}
        assert snapshot.nodes["n1"].alloc["cpu"] == 2000
        assert await ledger.entries() == []
        for write in (dispatcher.set(READY_KEY, "0"), dispatcher.delete(READY_KEY), dispatcher.expire(READY_KEY, 1)):
            with pytest.raises(NoPermissionError):
                await write
        source = (importlib.resources.files("hoss.ledger") / "lua" / "common.lua").read_text() + "\n" + (
            importlib.resources.files("hoss.ledger") / "lua" / "snapshot.lua").read_text()
        sha = await dispatcher.script_load(source)
        with pytest.raises(NoPermissionError, match="key"):
            await dispatcher.evalsha(sha, 1, READY_KEY, KEY_PREFIX, 0)
        # What it does write still works: the work queues' keys.
        await dispatcher.hset(f"{KEY_PREFIX}:dispatched", "uid-1", "worker-1")
        assert await dispatcher.hget(f"{KEY_PREFIX}:dispatched", "uid-1") == "worker-1"
    finally:
        await dispatcher.aclose()
    async with redis.asyncio.Redis.from_url(hoss_acl_redis["admin"], decode_responses=True) as admin:
        assert await admin.get(READY_KEY) is not None, "the ready flag must have survived the dispatcher's attempts"


async def test_read_only_scripts_run_for_every_component_and_cannot_write(hoss_acl_redis: dict[str, str]) -> None:
    """Workers and the resolver's pipelined client run the read-only scripts too (EVALSHA_RO, loading them on
    NOSCRIPT); Redis refuses a write from a script run that way, whoever runs it."""
    async with redis.asyncio.Redis.from_url(hoss_acl_redis["admin"]) as admin:
        await admin.script_flush()
    async with Ledger.from_url(hoss_acl_redis["hoss-resolver"]) as resolver:
        await resolver.rebuild(nodes=[("n1", {"cpu": 2000, "pods": 10}, {})], bound=[])
    async with Ledger.from_url(hoss_acl_redis["hoss-worker"]) as worker:
        loaded = await worker.load()
        assert loaded.ready and set(loaded.nodes) == {"n1"}
        assert await worker.nominations() == {}
        assert (await worker.quotas()).quotas == []
    review = Ledger(PipelinedRedis(hoss_acl_redis["hoss-resolver"]), owns_client=True)
    try:
        assert (await review.snapshot()).ready
    finally:
        await review.close()
    async with redis.asyncio.Redis.from_url(hoss_acl_redis["admin"]) as admin:
        with pytest.raises(ResponseError, match=r"[Ww]rite commands are not allowed"):
            await admin.eval_ro("return redis.call('SET', KEYS[1], '0')", 1, READY_KEY)


async def test_the_work_queue_calls_run_under_each_components_user(hoss_acl_redis: dict[str, str]) -> None:
    """A worker beats (with and without bindings to post, sharing the budget), reads and acknowledges its work and
    deregisters; the dispatcher sends and reclaims a dead worker's items: each under its own ACL user."""
    worker_client = redis.asyncio.Redis.from_url(hoss_acl_redis["hoss-worker"], decode_responses=True)
    dispatcher_client = redis.asyncio.Redis.from_url(hoss_acl_redis["hoss-dispatcher"], decode_responses=True)
    try:
        worker, dispatcher = WorkQueue(worker_client), WorkQueue(dispatcher_client)
        for name in ("w1", "w2"):
            await worker.ensure_group(name)
            assert await worker.heartbeat(WorkerInfo(id=name, policies=["default"]), ttl_seconds=30,
                                          binding=True) in (True, False)
        assert worker.binding_workers == 2
        await dispatcher.enqueue_many([("w1", WorkItem(uid="u1", namespace="ns", name="p1", policy="default")),
                                       ("w2", WorkItem(uid="u2", namespace="ns", name="p2", policy="default"))])
        [(message_id, item)] = await worker.read("w1", count=10, block_ms=10)
        await worker.ack("w1", message_id, [item.uid])
        await worker.deregister("w1")
        assert [item.uid for item in await dispatcher.reclaim("w2")] == ["u2"]
        await worker.heartbeat(WorkerInfo(id="w3", policies=["default"]), ttl_seconds=30)
        assert worker.binding_workers == 1, "w1 deregistered and w2 reclaimed: neither holds a share"
    finally:
        await worker_client.aclose()
        await dispatcher_client.aclose()


LEDGER_WRITES_ONLY_THE_RESOLVER_MAKES = (
    ("DEL", READY_KEY), ("SET", EPOCH_KEY, "forged"), ("HSET", f"{KEY_PREFIX}:node:n1:alloc", "cpu", "999999"),
    ("HSET", f"{KEY_PREFIX}:node:n1:labels", "zone", "b"), ("SADD", f"{KEY_PREFIX}:nodes", "ghost"),
    ("HINCRBY", STATS_KEY, "overcommits", "-1"), ("HSET", f"{KEY_PREFIX}:quota:ns:team", "max:cpu", "1"),
)
"""Writes that would make the webhook admit what does not fit, or deny everything: the ready flag, the epoch, a node's
allocatable and labels, the node set, the counters, a quota's definition."""
ENTRY_WRITES = (("HSET", f"{KEY_PREFIX}:node:n1:used", "cpu", "0"), ("DEL", f"{KEY_PREFIX}:pod:u1"),
                ("SREM", f"{KEY_PREFIX}:node:n1:bound", "u1"))
"""Writes that free a node's room in the ledger: its used total, an entry, the set of its bound pods."""
QUEUE_WRITES = (("XADD", f"{KEY_PREFIX}:queue:w1", "*", "i", "{}"), ("HSET", f"{KEY_PREFIX}:dispatched", "u9", "w1"),
                ("DEL", f"{KEY_PREFIX}:workers"))


async def denied_everything(url: str, writes: Sequence[tuple[str, ...]]) -> list[str]:
    """Each of ``writes`` tried under the user of ``url``, as a command and from inside a script (declaring the change
    stream, which every ledger writer may write): those Redis let through."""
    allowed = []
    async with redis.asyncio.Redis.from_url(url, decode_responses=True) as client:
        sha = await client.script_load("return redis.call(unpack(ARGV))")
        command: Any = client.execute_command  # redis-py leaves it untyped
        for write in writes:
            for how in ("command", "script"):
                try:
                    if how == "command":
                        await command(*write)
                    else:
                        await client.evalsha(sha, 1, CHANGES_KEY, *write)
                except NoPermissionError:
                    continue
                except ResponseError as error:  # a script's refusal: "The user executing the script can't access"
                    if "can't access" in str(error) or "no permissions" in str(error):
                        continue
                    raise
                allowed.append(f"{' '.join(write[:2])} ({how})")
    return allowed


async def ledger_with_a_bound_pod(urls: dict[str, str]) -> None:
    async with redis.asyncio.Redis.from_url(urls["admin"]) as admin:
        await admin.flushdb()
    async with Ledger.from_url(urls["hoss-resolver"]) as resolver:
        await resolver.rebuild(nodes=[node_row("n1", {"cpu": 4000, "pods": 10}, labels={"zone": "a"})],
                               bound=[Placement(uid="u1", pod="ns/bound", node="n1", request={"cpu": 1000, "pods": 1})])


async def test_the_rescheduler_holds_room_but_cannot_free_a_node_or_stop_the_webhook(
    hoss_acl_redis: dict[str, str]
) -> None:
    """The rescheduler's user runs its own calls (the node usage, holds, nominations, their end) and nothing more:
    it cannot zero a node's used total, drop an entry, touch the ready flag or a node's description, or write the
    work queues, neither by a command nor from a script."""
    await ledger_with_a_bound_pod(hoss_acl_redis)
    async with Ledger.from_url(hoss_acl_redis["hoss-rescheduler"]) as rescheduler:
        assert (await rescheduler.node_usage(["n1"]))["n1"][1]["cpu"] == 1000
        assert await rescheduler.hold_moves([MoveHold(key="pending-1", node="n1", request={"cpu": 2000})],
                                            ttl_seconds=30) is None
        assert set(await rescheduler.nominations()) == {"pending-1"}
        assert await rescheduler.unnominate("pending-1")
    allowed = await denied_everything(hoss_acl_redis["hoss-rescheduler"],
                                      (*LEDGER_WRITES_ONLY_THE_RESOLVER_MAKES, *ENTRY_WRITES, *QUEUE_WRITES))
    assert allowed == [], f"the rescheduler's user may {allowed}"
    async with Ledger.from_url(hoss_acl_redis["admin"]) as admin:
        assert await admin.is_ready()
        assert (await admin.node_usage(["n1"]))["n1"][1]["cpu"] == 1000


async def test_a_worker_writes_entries_but_not_the_ready_flag_a_nodes_description_or_the_counters(
    hoss_acl_redis: dict[str, str]
) -> None:
    """The workers' user reserves and releases (its scripts declare the change stream, not the ready flag), and may
    not write what only the sync writes."""
    await ledger_with_a_bound_pod(hoss_acl_redis)
    async with Ledger.from_url(hoss_acl_redis["hoss-worker"]) as worker:
        assert isinstance(await worker.reserve(uid="u2", pod="ns/p2", node="n1", request={"cpu": 1000, "pods": 1},
                                               owner="w1", ttl_seconds=30), Reserved)
        assert await worker.nominate(uid="u3", node="n1", priority=10, request={"cpu": 500},
                                     ttl_seconds=30) == "nominated"
        assert await worker.unnominate("u3")
        assert await worker.release_assumed(uid="u2", node="n1")
        assert await worker.release_owner("w1") == 0
    allowed = await denied_everything(hoss_acl_redis["hoss-worker"], LEDGER_WRITES_ONLY_THE_RESOLVER_MAKES)
    assert allowed == [], f"the workers' user may {allowed}"


async def test_the_resolver_and_the_dispatcher_write_only_their_side(hoss_acl_redis: dict[str, str]) -> None:
    """The resolver's user writes no work queue; the dispatcher's writes no ledger entry or total."""
    await ledger_with_a_bound_pod(hoss_acl_redis)
    assert await denied_everything(hoss_acl_redis["hoss-resolver"], QUEUE_WRITES) == []
    allowed = await denied_everything(hoss_acl_redis["hoss-dispatcher"],
                                      (*LEDGER_WRITES_ONLY_THE_RESOLVER_MAKES, *ENTRY_WRITES))
    assert allowed == [], f"the dispatcher's user may {allowed}"
