"""Only the replica holding the resolver's Lease runs the ledger sync: it starts on leading, stops the moment the
Lease is lost, starts afresh on leading again, and a sync that fails ends the role with its error."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Literal, cast

import fakeredis
import pytest

from hoss.kube.client import raise_if_cancelled
from hoss.kube.leader import LeaderElector
from hoss.ledger.client import Ledger
from hoss.settings import SettingsError, load_settings
from resolver.main import sync_while_leading
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.sync import LedgerSync
from tests.waiting import until


class FakeSync:
    def __init__(self, fail: BaseException | None = None, *, stubborn: bool = False) -> None:
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.fail = fail
        self.stubborn = stubborn

    async def run(self) -> None:
        self.started.set()
        try:
            if self.fail is not None:
                raise self.fail
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not self.stubborn:
                    raise
                await asyncio.sleep(3600)  # a cancellation swallowed, as asyncio.wait_for can on Python 3.11
        finally:
            self.stopped.set()


class Awaited(asyncio.Event):
    """An event that counts the waits on it: a role waiting for the Lease has had its chance to act."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    async def wait(self) -> Literal[True]:
        self.waits += 1
        return await super().wait()


class NoLease:
    name = "hoss-resolver-sync"
    namespace = "hoss-system"

    async def read(self) -> None:
        raise AssertionError("the test drives leading/following by hand")


def elector() -> LeaderElector:
    return LeaderElector(cast(Any, NoLease()), identity="me", lease_duration_seconds=15,
                         renew_deadline_seconds=10, renew_interval_seconds=2)


def lead(e: LeaderElector) -> None:
    e.following.clear()
    e.leading.set()


def follow(e: LeaderElector) -> None:
    e.leading.clear()
    e.following.set()


@pytest.fixture
def state(tmp_path: Path, fake_redis: fakeredis.FakeAsyncRedis) -> WebhookState:
    settings = ResolverSettings(tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k"))
    return WebhookState(settings=settings, ledger=Ledger(fake_redis))


async def test_the_sync_runs_only_while_leading_and_afresh_each_term(state: WebhookState) -> None:
    e = elector()
    e.leading = leading = Awaited()
    syncs: list[FakeSync] = []
    made = asyncio.Event()

    def make() -> LedgerSync:
        syncs.append(FakeSync())
        made.set()
        return cast(LedgerSync, syncs[-1])

    async def started(count: int) -> None:
        while len(syncs) < count:
            made.clear()
            await made.wait()
        await syncs[count - 1].started.wait()

    role = asyncio.create_task(sync_while_leading(state, e, make))
    try:
        await until(lambda: leading.waits == 1, timeout=10, what="the role to wait for the Lease")
        assert syncs == [] and state.sync is None, "a follower does not sync"
        lead(e)
        await asyncio.wait_for(started(1), 1)
        assert state.sync is cast(LedgerSync, syncs[0])
        follow(e)
        await asyncio.wait_for(syncs[0].stopped.wait(), 1)
        assert state.sync is None
        lead(e)
        await asyncio.wait_for(started(2), 1)
        assert not syncs[1].stopped.is_set()
    finally:
        role.cancel()
        await asyncio.gather(role, return_exceptions=True)
    assert syncs[1].stopped.is_set()


async def test_a_failing_sync_ends_the_role_with_its_error(state: WebhookState) -> None:
    e = elector()
    lead(e)
    with pytest.raises(RuntimeError, match="informer exploded"):
        await asyncio.wait_for(
            sync_while_leading(state, e, lambda: cast(LedgerSync, FakeSync(RuntimeError("informer exploded")))), 1
        )
    assert state.sync is None


async def test_a_sync_that_does_not_stop_when_the_lease_is_lost_ends_the_role(state: WebhookState) -> None:
    e = elector()
    lead(e)
    stubborn = FakeSync(stubborn=True)
    role = asyncio.create_task(
        sync_while_leading(state, e, lambda: cast(LedgerSync, stubborn), stop_timeout_seconds=0.05)
    )
    await asyncio.wait_for(stubborn.started.wait(), 1)
    follow(e)
    with pytest.raises(RuntimeError, match="did not stop"):
        await asyncio.wait_for(role, 1)
    assert state.sync is None


async def test_a_swallowed_cancellation_is_raised_at_the_next_turn_of_a_loop() -> None:
    turns = 0

    async def loop() -> None:
        nonlocal turns
        while True:
            raise_if_cancelled()
            turns += 1
            with contextlib.suppress(asyncio.CancelledError):  # swallowed
                await asyncio.sleep(3600)

    task = asyncio.create_task(loop())
    await until(lambda: turns == 1, timeout=10, what="the loop's first turn")
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 1)
    assert task.cancelled()
    assert turns == 1


def test_lease_settings_have_defaults_and_must_be_ordered() -> None:
    settings = ResolverSettings(tls_cert_file="c", tls_key_file="k")
    assert (settings.lease_name, settings.lease_namespace) == ("hoss-resolver-sync", "hoss-system")
    assert settings.identity
    with pytest.raises(SettingsError, match="lease timing"):
        load_settings(ResolverSettings, ["--tls-cert-file=c", "--tls-key-file=k", "--renew-deadline-seconds=20"],
                      prog="hoss-resolver", description="")
