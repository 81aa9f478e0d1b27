"""What a binding's error answer means for the room the webhook admitted (issue 33, item 5): only an answer that
proves the apiserver will not write the binding (a 4xx) puts the entry first in line for the sync's check, which
then drops it when the pod is unbound; a 5xx or no answer at all leaves the entry to the check after the write
timeout, since the binding may still commit. An entry still only assumed (the webhook never saw the binding) is
released whatever the answer: a binding the webhook sees later is judged from scratch. And what the answers mean
for the work item: a binding refused because the pod changed since the version it named (item 1) makes the item
out of date, not the pod unschedulable; unless only its resourceVersion moved on (its status was written), when it
is bound at the version it has now."""

from __future__ import annotations

from typing import Any

import pytest

from hoss.framework.pod import PodView, parse_pod
from hoss.kube.client import KubeError
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed
from hoss.model import compact
from hoss.model.objects import Json
from tests.kube_objects import raw_pod
from workers.binding import Bindings, Outcome, proves_failure, verdict
from workers.bindlimit import BindLimit
from workers.metrics import Tally
from workers.notices import Notices

REQUEST = {"cpu": 1000, "pods": 1}


class Answering:
    """A binder the apiserver (or a proxy before it) answers with `status`, or not at all (None: the connection
    reset)."""

    def __init__(self, status: int | None, message: str = "the answer") -> None:
        self.status = status
        self.message = message

    async def bind(self, pod: PodView, node: str) -> None:
        if self.status is None:
            raise ConnectionResetError("reset by peer")
        raise KubeError(f"{self.status}: {self.message}", status=self.status)


def bindings(ledger: Ledger, status: int | None, message: str = "the answer") -> Bindings:
    return Bindings(Answering(status, message), ledger, limit=BindLimit(4), tally=Tally(),
                    notices=Notices(None, None, component="w1"), scheduled_events=False, default_policy="default")


async def reserved_and_admitted(ledger: Ledger, pod: PodView | None = None) -> PodView:
    pod = pod or parse_pod(raw_pod("p", {"cpu": "1"}, uid="u-p"))
    await ledger.reserve(uid=pod.uid, pod=pod.key, node="n1", request=REQUEST, owner="w1", ttl_seconds=30)
    assert await ledger.confirm(uid=pod.uid, pod=pod.key, node="n1", request=None, owner="w1",
                                verify_after_seconds=60) == Confirmed(node="n1", foreign=False)
    return pod


@pytest.mark.parametrize("status", [400, 403, 404, 409, 422, 429])
async def test_an_answer_that_proves_the_binding_failed_has_the_sync_check_at_once(ledger: Ledger,
                                                                                  status: int) -> None:
    pod = await reserved_and_admitted(ledger)
    assert await bindings(ledger, status).bind(pod, "n1") == Outcome(False, status)
    (entry,) = (await ledger.verify_due()).entries
    assert (entry.uid, entry.answered) == ("u-p", True)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, None])
async def test_a_server_error_or_no_answer_leaves_the_admitted_room_to_the_check_after_the_write_timeout(
    ledger: Ledger, status: int | None,
) -> None:
    pod = await reserved_and_admitted(ledger)
    assert await bindings(ledger, status).bind(pod, "n1") == Outcome(False, status)
    assert (await ledger.verify_due()).entries == [], "not due before its verify time"
    ((uid, state),) = [(e.uid, e.state) for e in await ledger.entries()]
    assert (uid, state) == ("u-p", "admitted")


@pytest.mark.parametrize("status", [409, 503, None])
async def test_a_reservation_the_webhook_never_admitted_is_released_whatever_the_answer(
    ledger: Ledger, status: int | None,
) -> None:
    pod = parse_pod(raw_pod("p", {"cpu": "1"}, uid="u-p"))
    await ledger.reserve(uid=pod.uid, pod=pod.key, node="n1", request=REQUEST, owner="w1", ttl_seconds=30)
    await bindings(ledger, status).bind(pod, "n1")
    assert await ledger.entries() == []


def test_only_a_4xx_but_408_proves_failure() -> None:
    assert [s for s in (None, 200, 400, 404, 408, 409, 429, 499, 500, 503, 504) if proves_failure(s)] == [
        400, 404, 409, 429, 499]


CHANGED = ('Operation cannot be fulfilled on pods "p": StorageError: invalid object, Code: 4, '
           "Key: /registry/pods/team/p, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
           "ResourceVersion in precondition: 41, ResourceVersion in object meta: 42")
"""The apiserver's answer to a binding whose resourceVersion precondition no longer holds (as the local plane gives
it)."""


async def test_a_binding_refused_because_the_pod_changed_frees_its_room_and_says_the_item_is_out_of_date(
    ledger: Ledger,
) -> None:
    pod = await reserved_and_admitted(ledger)
    binds = bindings(ledger, 409, CHANGED)
    assert await binds.bind(pod, "n1") == Outcome(False, 409, changed=True)
    (entry,) = (await ledger.verify_due()).entries
    assert entry.answered, "the write is over: the sync checks the room at once"
    assert (binds.tally.counters["stale"], binds.tally.counters["denied"]) == (1, 0)
    # another 409 (the webhook's denial, a pod bound already) is a refusal, not a changed pod
    other = bindings(ledger, 409, 'admission webhook "binding.resolver.hoss.io" denied the request: no room')
    assert await other.bind(pod, "n1") == Outcome(False, 409)


def test_what_the_outcomes_mean_for_the_work_item() -> None:
    bound, changed, lost, gone = Outcome(True, 200), Outcome(False, 409, changed=True), Outcome(False, 409), \
        Outcome(False, 404)
    assert verdict([bound], gang=False) == "bound"
    assert verdict([gone], gang=False) == "gone"
    assert verdict([changed], gang=False) == "changed"
    assert verdict([bound, changed, lost], gang=True) == "changed"
    assert verdict([bound, lost], gang=True) == "retry soon"
    assert verdict([Outcome(False, 503)], gang=False) == "retry"


class Versioned:
    """The apiserver's pod store for one pod: a binding that names another resourceVersion than the pod's is refused
    (the precondition); `written` moves the version on before the first binding arrives, as a status write does."""

    def __init__(self, raw: Json, *, written: Json | None = None, writes_between: int = 0) -> None:
        self.raw = raw
        self.now = written or raw
        self.writes_between = writes_between
        self.bound_at: list[str] = []

    async def bind(self, pod: PodView, node: str) -> None:
        current = self.now["metadata"]["resourceVersion"]
        if pod.resource_version != current:
            raise KubeError(f"409: {CHANGED.replace('41', pod.resource_version).replace('42', current)}", status=409)
        self.bound_at.append(current)

    async def get_pod(self, namespace: str, name: str) -> Json:
        read = self.now
        if self.writes_between:  # written again before the binding that follows the read
            self.writes_between -= 1
            version = str(int(self.now["metadata"]["resourceVersion"]) + 1)
            self.now = {**self.now, "metadata": {**self.now["metadata"], "resourceVersion": version}}
        return read


def pod_at(version: str, **changes: Any) -> Json:
    raw = raw_pod("p", {"cpu": "1"}, uid="u-p", **changes)
    raw["metadata"]["resourceVersion"] = version
    return raw


def status_written(raw: Json, version: str) -> Json:
    """`raw` after a worker wrote its PodScheduled=False condition: a new resourceVersion, nothing else new that
    scheduling reads."""
    return {**raw, "metadata": {**raw["metadata"], "resourceVersion": version},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}


def rebinding(ledger: Ledger, store: Versioned) -> Bindings:
    return Bindings(store, ledger, limit=BindLimit(4), tally=Tally(), notices=Notices(None, None, component="w1"),
                    scheduled_events=False, default_policy="default", reader=store)


async def test_a_pod_whose_status_alone_was_written_since_its_item_is_bound_at_its_current_version(
    ledger: Ledger,
) -> None:
    item = pod_at("41")
    store = Versioned(item, written=status_written(item, "42"))
    pod = await reserved_and_admitted(ledger, parse_pod(item))
    binds = rebinding(ledger, store)
    assert await binds.bind(pod, "n1", form=compact.compact_pod(item)) == Outcome(True, 200)
    assert store.bound_at == ["42"]
    assert [(e.uid, e.state) for e in await ledger.entries()] == [("u-p", "admitted")], "the room stayed held"
    assert (binds.tally.counters["bound"], binds.tally.counters["stale"]) == (1, 0)


async def test_a_pod_that_changed_in_what_scheduling_reads_is_not_bound_again_its_item_is_out_of_date(
    ledger: Ledger,
) -> None:
    item = pod_at("41")
    store = Versioned(item, written=status_written(pod_at("41", labels={"app": "other"}), "42"))
    pod = await reserved_and_admitted(ledger, parse_pod(item))
    binds = rebinding(ledger, store)
    assert await binds.bind(pod, "n1", form=compact.compact_pod(item)) == Outcome(False, 409, changed=True)
    assert store.bound_at == []
    (entry,) = (await ledger.verify_due()).entries
    assert entry.answered, "the write is over: the sync checks the room at once"
    assert binds.tally.counters["stale"] == 1


async def test_a_pod_written_again_between_the_read_and_the_binding_is_tried_again_soon_not_out_of_date(
    ledger: Ledger,
) -> None:
    item = pod_at("41")
    store = Versioned(item, written=status_written(item, "42"), writes_between=1)
    pod = await reserved_and_admitted(ledger, parse_pod(item))
    outcome = await rebinding(ledger, store).bind(pod, "n1", form=compact.compact_pod(item))
    assert outcome == Outcome(False, 409) and verdict([outcome], gang=False) == "retry soon"
    assert store.bound_at == [], "read once, posted again once"
