"""Fixtures for end-to-end tests: one real local plane per test session, a client and a fresh namespace per test."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from dev.local.cluster import Cluster, devices_allocated_twice, oversold_nodes
from dev.local.plane import LocalPlane
from dev.local.state import Process
from hoss.ledger.client import Ledger
from tests.e2e.browser import CHROMIUM, MISSING, Page, chromium

_namespaces = itertools.count()
PODGROUP_CRD = Path(__file__).resolve().parents[2] / "deploy" / "crds" / "podgroups.yaml"


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPlane]:
    """A real etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok + redis-server, started once
    for the session."""
    local = LocalPlane(tmp_path_factory.mktemp("plane"))
    try:
        local.up(audit=True)
        yield local
        denied = redis_acl_denials(local)
        assert not denied, f"Redis refused hoss components commands or keys their ACL lacks: {denied}"
    finally:
        local.down()


@pytest.fixture(autouse=True)
def no_redis_acl_denial(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test on the session's plane: Redis refused no hoss component a command or key (its ACL LOG is
    empty); the log is emptied again so that the next test starts clean."""
    yield
    if "plane" not in request.fixturenames:
        return
    plane: LocalPlane = request.getfixturevalue("plane")
    denied = redis_acl_denials(plane, reset=True)
    assert not denied, f"Redis refused hoss components commands or keys their ACL lacks: {denied}"


def redis_acl_denials(plane: LocalPlane, *, reset: bool = False) -> list[str]:
    """Redis's ACL LOG of the plane (admin user): each entry as 'user: reason object'."""
    client = redis.Redis.from_url(plane.state().redis_url, decode_responses=True)
    try:
        entries: Any = client.acl_log(count=100)
        if reset and entries:
            client.acl_log_reset()
    finally:
        client.close()
    return [f"{e['username']}: {e['reason']} {e['object']} ({e['context']})" for e in entries]


@pytest.fixture
async def cluster(plane: LocalPlane) -> AsyncIterator[Cluster]:
    async with await Cluster.connect(plane.kubeconfig("admin")) as connected:
        yield connected


@pytest.fixture
async def namespace(cluster: Cluster, plane: LocalPlane, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A namespace of the test's own; its pods are deleted afterwards, then the namespace itself (the plane's
    kube-controller-manager finishes deleting it, with any workload the test left)."""
    name = f"t{next(_namespaces)}-{request.node.name[:40].lower().replace('_', '-')}".rstrip("-")
    await cluster.ensure_namespace(name)
    yield name
    await cluster.delete_pods(name)
    plane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


OVERSELL_CHECK_SKIPPED_MODULES = frozenset({"test_deploy", "test_bench", "test_chaos", "test_managed_install"})
"""Modules whose tests run planes or webhooks of their own (test_chaos and test_managed_install check oversell
themselves)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every e2e test that makes pods in its namespace ends with `no_node_oversold`."""
    here = Path(__file__).parent
    for item in items:
        if not isinstance(item, pytest.Function) or item.path.parent != here:
            continue  # the hook sees the whole session's items; only the e2e tests get the check
        module = item.path.stem
        fixturenames = getattr(item, "fixturenames", None)
        if (module not in OVERSELL_CHECK_SKIPPED_MODULES and isinstance(fixturenames, list)
                and "namespace" in fixturenames and "no_node_oversold" not in fixturenames):
            fixturenames.append("no_node_oversold")


@pytest.fixture
async def no_node_oversold(request: pytest.FixtureRequest, cluster: Cluster, namespace: str) -> AsyncIterator[None]:
    """After the test (before its namespace's pods are deleted): the independent oversell check, from the
    apiserver alone -- the requests of the pods on each node against its allocatable (less the extended resources
    a node without them leaves to DRA devices), every namespace -- and no DRA device in two ResourceClaims'
    allocations. A test that oversells on purpose is marked
    ``oversells``."""
    yield
    if request.node.get_closest_marker("oversells") is not None:
        return
    pods = await cluster.raw_list("list_pod_for_all_namespaces")
    oversold = oversold_nodes(await cluster.raw_list("list_node"), pods, dra=await cluster.dra_resources())
    assert oversold == {}, "a node is oversold"
    assert devices_allocated_twice(await cluster.resource_claims()) == {}, "a device is allocated twice"


@pytest.fixture(scope="session")
def dispatcher(plane: LocalPlane) -> Iterator[Process]:
    """One hoss-dispatcher for the session (workers come and go with the tests), on a plane that has the
    scheduler-plugins PodGroup CRD (deploy/crds), so gangs may name a PodGroup."""
    plane.kubectl("apply", "-f", str(PODGROUP_CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io", "--timeout=60s")
    process = plane.start_dispatcher()
    yield process
    plane.stop_process(process.name)


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Page]:
    """A headless Chromium tab (tests/e2e/browser.py) for the dashboard's page tests."""
    if not CHROMIUM.exists():
        pytest.fail(MISSING)
    async with chromium(tmp_path) as page:
        yield page


@pytest.fixture
async def ledger(plane: LocalPlane) -> AsyncIterator[Ledger]:
    """The plane's ledger, read (and in some tests written) as its components do."""
    client = aioredis.Redis.from_url(plane.state().redis_url, decode_responses=True)
    yield Ledger(client)
    await client.aclose()
