"""A worker's backlog holds one item per pod: a newer version of a pod's work item (a later stream entry) takes the
place of the older one, ready or waiting for its retry, and the older is handed over to be acknowledged as stale;
an older version coming back from being decided gives the newer its place. The pod's backoff is kept throughout,
as kube-scheduler's queue updates a queued pod in place."""

from __future__ import annotations

import random

from hoss.queue import WorkItem
from workers.backlog import Backlog, stream_order
from workers.intake import Work


def version(uid: str, message_id: str) -> Work:
    return Work(message_id=message_id, item=WorkItem(uid=uid, namespace="team", name=uid, policy="default"))


def backlog(superseded: list[Work]) -> Backlog:
    return Backlog(backoff_initial=1.0, backoff_max=60.0, jitter=random.Random(3), superseded=superseded.append)


def test_stream_entries_are_ordered_by_time_then_sequence() -> None:
    assert stream_order("1700000000000-10") > stream_order("1700000000000-9") > stream_order("999-99")


def test_a_newer_version_takes_the_place_of_the_older_one_waiting_for_its_retry() -> None:
    dropped: list[Work] = []
    held = backlog(dropped)
    old, other = version("p", "10-0"), version("q", "11-0")
    held.retry(old)  # it fit nowhere: it waits out its backoff
    held.push(other)
    due, backoff = held.retries[0].due, held.backoff["p"]
    new = version("p", "12-0")
    held.push(new)
    assert dropped == [old]
    assert [retry.work for retry in held.retries] == [new] and held.retries[0].due == due
    assert [work.item.uid for work in held.ready] == ["q"]
    assert held.backoff["p"] == backoff and held.depth == 2 and held.holds("p")


def test_a_newer_version_of_a_ready_pod_keeps_its_place_in_line() -> None:
    dropped: list[Work] = []
    held = backlog(dropped)
    first, old, last = version("a", "1-0"), version("p", "2-0"), version("z", "3-0")
    for work in (first, old, last):
        held.push(work)
    new = version("p", "4-0")
    held.push(new)
    assert dropped == [old]
    assert held.take(10) == [first, new, last]
    assert not held.holds("p")


def test_an_older_version_back_from_being_decided_gives_the_newer_its_backoff() -> None:
    dropped: list[Work] = []
    held = backlog(dropped)
    old = version("p", "1-0")
    held.push(old)
    assert held.take(1) == [old]  # being decided when the new version arrives
    new = version("p", "2-0")
    held.push(new)
    held.retry(old)  # it fits nowhere: the pod backs off, in its newest version
    assert dropped == [old]
    assert not held.ready and [retry.work for retry in held.retries] == [new]
    assert held.backoff["p"] == 1.0


def test_an_older_version_that_lost_a_race_sends_the_newer_to_be_decided_now() -> None:
    dropped: list[Work] = []
    held = backlog(dropped)
    old, new = version("p", "1-0"), version("p", "2-0")
    held.push(old)
    held.take(1)
    held.push(new)
    held.push(old)  # lost a ledger race: straight back to the ready queue
    assert dropped == [old] and list(held.ready) == [new] and held.depth == 1
