"""Configuration files reloaded when they change (hoss/reload.py): a worker's policies and the resolver's routing rules
take a file that parses, keep the old content for one that does not and say why once, see a ConfigMap's symlink swap,
and a worker never decides one batch with half old, half new profiles. Every poll is called by the test: no sleeps."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from hoss.framework.cycle import Placement, Profile, Unschedulable
from hoss.kube.events import EventTarget
from hoss.model import compact
from hoss.model.objects import Json
from hoss.queue import WorkItem
from hoss.reload import (
    FAILURE,
    KEPT,
    RELOADED,
    SUCCESS,
    ConfigFile,
    ConfigFileError,
    Reload,
    Reporter,
    follow,
    reload_counter,
)
from resolver.router import Rule, policy_for, rules_from_text
from tests.kube_objects import raw_pod
from tests.unit.webhooks import Webhook, start
from workers.core import Worker
from workers.deciding import Policies, Shared, parse_policies
from workers.intake import Work, parse_work
from workers.server import build_app
from workers.settings import WorkerSettings

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def policies_text(**edit: Any) -> str:
    """configs/policies.yaml with top-level keys replaced."""
    config = yaml.safe_load(POLICIES.read_text())
    config.update(edit)
    return yaml.safe_dump(config)


def bad_weight() -> str:
    config = yaml.safe_load(POLICIES.read_text())
    config["profiles"][0]["scores"][4]["weight"] = 1000
    return yaml.safe_dump(config)


def policies_file(path: Path, *, served: tuple[str, ...] = ("default",), clock: Clock | None = None) \
        -> ConfigFile[Policies]:
    return ConfigFile(str(path), what="policies", clock=clock or Clock(),
                      parse=functools.partial(parse_policies, source=str(path), served=served))


# --- the file --------------------------------------------------------------------------------------------------


def test_a_changed_file_that_parses_is_the_new_content_and_an_unchanged_one_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    clock = Clock()
    file = policies_file(path, clock=clock)
    first = file.load()
    assert file.poll() is None
    clock.now = 1060.0
    path.write_text(policies_text(namespacePools={"team": "pool-a"}))
    reload = file.poll()
    assert reload is not None and reload.result == SUCCESS
    assert file.config is not first and file.config.profiles["default"] is not first.profiles["default"]
    status = file.status()
    assert status["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert reload.message == f"reloaded the policies from {path} (sha256 {status['sha256'][:12]})"
    assert (status["loaded_unix"], status["reloads"], status["refused"]) == (1060.0, 1, False)
    assert file.poll() is None


def test_a_bad_file_keeps_the_old_content_and_says_why_naming_the_field_once(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    file = policies_file(path)
    before = file.load()
    path.write_text(bad_weight())
    reload = file.poll()
    assert reload is not None and reload.result == FAILURE
    assert reload.message.startswith("kept the old policies: ")
    assert "scores[4].weight" in reload.message and "1000" in reload.message
    assert file.config is before
    assert file.poll() is None, "the same refused content is reported once, not at every poll"
    status = file.status()
    assert status["refused"] and status["failures"] == 1 and "scores[4].weight" in status["last_error"]
    # The edit is undone: the file is the content in use again, nothing to reload or report.
    path.write_text(policies_text())
    assert file.poll() is None
    assert file.config is before and not file.status()["refused"]


def test_a_reload_that_drops_a_profile_the_worker_serves_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    file = policies_file(path, served=("default", "gpu"))
    before = file.load()
    config = yaml.safe_load(POLICIES.read_text())
    config["profiles"] = [p for p in config["profiles"] if p["name"] != "gpu"]
    path.write_text(yaml.safe_dump(config))
    reload = file.poll()
    assert reload is not None and reload.result == FAILURE
    assert "field 'profiles'" in reload.message and "this worker serves gpu (--policies)" in reload.message
    assert file.config is before


def test_a_file_that_goes_missing_keeps_the_old_content_until_it_is_back(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    file = policies_file(path)
    before = file.load()
    path.unlink()
    reload = file.poll()
    assert reload is not None and reload.result == FAILURE and "cannot read" in reload.message
    assert file.poll() is None
    path.write_text(policies_text(namespacePools={"team": "pool-a"}))
    reload = file.poll()
    assert reload is not None and reload.result == SUCCESS and file.config is not before


def test_a_configmap_update_is_seen_through_its_symlink_swap_even_with_the_same_mtime(tmp_path: Path) -> None:
    # The kubelet's atomic writer: policies.yaml -> ..data/policies.yaml, ..data -> ..<timestamp>/, and an update
    # writes a new timestamped directory and renames a new ..data link over the old one.
    mount = tmp_path / "mount"
    mount.mkdir()

    def version(name: str, text: str) -> None:
        directory = mount / name
        directory.mkdir()
        (directory / "policies.yaml").write_text(text)
        os.utime(directory / "policies.yaml", (1_700_000_000, 1_700_000_000))  # the same mtime every time
        (mount / "..data_tmp").symlink_to(name)
        os.replace(mount / "..data_tmp", mount / "..data")

    version("..2026_01_01", policies_text())
    (mount / "policies.yaml").symlink_to("..data/policies.yaml")
    file = policies_file(mount / "policies.yaml")
    file.load()
    assert file.status()["resolved"] == str(mount / "..2026_01_01" / "policies.yaml")
    version("..2026_01_02", policies_text(namespacePools={"team": "pool-a"}))
    reload = file.poll()
    assert reload is not None and reload.result == SUCCESS
    assert file.status()["resolved"] == str(mount / "..2026_01_02" / "policies.yaml")


def test_whatever_the_parser_raises_the_old_content_stays(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("1")

    def parse(text: str) -> int:
        if text == "boom":
            raise RuntimeError("a plugin's constructor failed")
        return int(text)

    file = ConfigFile(str(path), what="numbers", parse=parse)
    assert file.load() == 1
    path.write_text("boom")
    reload = file.poll()
    assert reload == Reload(FAILURE, "kept the old numbers: a plugin's constructor failed") and file.config == 1
    path.write_bytes(b"\xff\xfe")
    reload = file.poll()
    assert reload is not None and reload.result == FAILURE and "utf-8" in reload.message and file.config == 1


def test_a_file_that_cannot_be_read_at_start_stops_the_component_naming_it(tmp_path: Path) -> None:
    file = ConfigFile(str(tmp_path / "missing.yaml"), what="routing rules", parse=str)
    with pytest.raises(ConfigFileError, match=r"cannot read the routing rules file .*missing\.yaml"):
        file.load()


# --- reporting ---------------------------------------------------------------------------------------------------


class Posted:
    def __init__(self) -> None:
        self.events: list[Json] = []

    async def __call__(self, event: Json) -> None:
        self.events.append(event)


def counted(registry: CollectorRegistry, component: str, result: str) -> float:
    return registry.get_sample_value(f"hoss_{component}_config_reloads_total", {"result": result}) or 0.0


async def test_a_reload_is_logged_counted_and_posted_on_the_components_own_pod() -> None:
    registry = CollectorRegistry()
    counter = reload_counter(registry, "worker")
    assert counted(registry, "worker", FAILURE) == 0 and \
        registry.get_sample_value("hoss_worker_config_reloads_total", {"result": SUCCESS}) == 0
    posted = Posted()
    target = EventTarget.from_env({"POD_NAME": "hoss-worker-default-7f9-abcde", "POD_NAMESPACE": "hoss-system",
                                   "POD_UID": "1234"})
    reporter = Reporter(counter=counter, target=target, component="hoss-worker/w1", post=posted)
    await reporter.report(Reload(SUCCESS, "reloaded the policies from p (sha256 abc)"))
    await reporter.report(Reload(FAILURE, "kept the old policies: policies.yaml: field 'defaultProfile': ..."))
    assert counted(registry, "worker", SUCCESS) == 1 and counted(registry, "worker", FAILURE) == 1
    reloaded, kept = posted.events
    assert reloaded["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "hoss-system",
                                          "name": "hoss-worker-default-7f9-abcde", "uid": "1234"}
    assert (reloaded["reason"], reloaded["type"]) == (RELOADED, "Normal")
    assert (kept["reason"], kept["type"], kept["message"]) == (
        KEPT, "Warning", "kept the old policies: policies.yaml: field 'defaultProfile': ...")
    assert kept["metadata"]["namespace"] == "hoss-system" and kept["source"] == {"component": "hoss-worker/w1"}


def test_without_a_pod_name_the_event_is_about_the_namespace() -> None:
    event = EventTarget.from_env({"POD_NAMESPACE": "team-ops"}).event(reason=KEPT, message="m", component="c",
                                                                     warning=True)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Namespace", "namespace": "team-ops",
                                       "name": "team-ops"}
    assert event["metadata"]["namespace"] == "team-ops"
    assert EventTarget.from_env({}).event(reason=KEPT, message="m", component="c",
                                          warning=True)["metadata"]["namespace"] == "default"


class Polls:
    """`follow`'s sleep: each call is one poll interval; it stops the loop after `count` polls, and the test
    changes the file between them through `between`."""

    class Done(Exception):
        pass

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.waited: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waited.append(seconds)
        if not self.steps:
            raise Polls.Done
        self.steps.pop(0)()


async def test_follow_hands_a_new_content_to_apply_and_reports_every_change_once(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("rules: []\n")
    file = ConfigFile(str(path), what="routing rules", parse=functools.partial(rules_from_text, source=str(path)))
    in_use: list[list[Rule]] = [file.load()]
    reported: list[Reload] = []

    async def report(reload: Reload) -> None:
        reported.append(reload)

    rule = ("rules:\n- namespaceSelector: {matchLabels: {team: ml}}\n  podSelector: {matchLabels: {app: train}}\n"
            "  policy: binpack\n")
    polls = Polls(lambda: None,
                  lambda: path.write_text(rule),
                  lambda: path.write_text(rule + "- policy: ''\n"),
                  lambda: None)
    with pytest.raises(Polls.Done):
        await follow(file, every=5.0, apply=in_use.append, report=report, sleep=polls)
    assert polls.waited == [5.0] * 5
    assert [r.result for r in reported] == [SUCCESS, FAILURE]
    assert "rules[1].policy" in reported[1].message
    assert len(in_use) == 2 and in_use[-1] is file.config
    # A pod of a namespace the new rule matches is routed with its policy; before the reload it was not.
    assert policy_for({"app": "train"}, {"team": "ml"}, in_use[0]) is None
    assert policy_for({"app": "train"}, {"team": "ml"}, in_use[1]) == "binpack"


# --- the worker --------------------------------------------------------------------------------------------------


def pending(name: str) -> Work:
    raw = raw_pod(name)
    return parse_work("1-0", WorkItem(uid=raw["metadata"]["uid"], namespace="team", name=name, policy="default",
                                      pod=compact.encode(compact.compact_pod(raw)).decode()))


class NoBinder:
    async def bind(self, *_args: object) -> None:
        raise AssertionError("nothing fits: nothing is bound")


async def test_a_reload_while_a_batch_is_decided_takes_effect_from_the_next_batch_only(
    tmp_path: Path, fake_redis: fakeredis.FakeAsyncRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    worker = Worker(WorkerSettings(id="w", policies_file=str(path), port=0), redis=fake_redis, rest=None,
                    binder=NoBinder())
    old = worker.decider.policies
    decided_with: list[Profile] = []
    decide = worker.decider.decide

    async def deciding(profile: Profile, work: Work, shared: Shared) -> Placement | Unschedulable:
        decided_with.append(profile)
        if len(decided_with) == 1:  # the file changes, and the watch polls it, while this batch awaits
            path.write_text(policies_text(namespacePools={"team": "pool-a"}))
            reload = worker.policies_file.poll()
            assert reload is not None and reload.result == SUCCESS
            worker._policies_reloaded(worker.policies_file.config)
        return await decide(profile, work, shared)

    monkeypatch.setattr(worker.decider, "decide", deciding)
    await worker.schedule([pending("a"), pending("b"), pending("c")])
    assert decided_with == [old.profiles["default"]] * 3, "one batch, one set of profiles"
    assert worker.decider.policies is old
    worker._adopt_policies()  # what the schedule loop does before its next batch
    decided_with.clear()
    await worker.schedule([pending("d")])
    new = worker.policies_file.config
    assert decided_with == [new.profiles["default"]] and worker.decider.policies is new


async def test_after_a_reload_the_pods_that_wait_are_tried_again_soon(
    tmp_path: Path, fake_redis: fakeredis.FakeAsyncRedis
) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    worker = Worker(WorkerSettings(id="w", policies_file=str(path), port=0, backoff_initial_seconds=60),
                    redis=fake_redis, rest=None, binder=NoBinder())
    worker.backlog.retry(pending("a"))
    due = worker.backlog.retries[0].due
    path.write_text(policies_text(namespacePools={"team": "pool-a"}))
    assert worker.policies_file.poll() is not None
    worker._policies_reloaded(worker.policies_file.config)
    assert worker.backlog.retries[0].due < due - 30



async def test_the_workers_status_shows_the_file_in_use_and_why_an_edit_was_refused(
    tmp_path: Path, fake_redis: fakeredis.FakeAsyncRedis
) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(policies_text())
    worker = Worker(WorkerSettings(id="w", policies_file=str(path), port=0), redis=fake_redis, rest=None,
                    binder=NoBinder())
    in_use = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(bad_weight())
    assert worker.policies_file.poll() is not None
    async with TestClient(TestServer(build_app(worker))) as http:
        status = (await (await http.get("/status")).json())["policies_file"]
    assert (status["path"], status["sha256"], status["refused"], status["reloads"]) == (str(path), in_use, True, 0)
    assert "scores[4].weight" in status["last_error"]


async def routed_policy(webhook: Webhook) -> object:
    """The policy the router gives a pod labelled app=train created in namespace team (None: not routed)."""
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r1", "namespace": "team", "object": {
                  "metadata": {"name": "p", "labels": {"app": "train"}},
                  "spec": {"containers": [{"name": "c", "image": "i"}]}}}}
    _code, answer = await webhook.post(review, path="/mutate-pod")
    patch = answer["response"].get("patch")
    return None if patch is None else json.loads(base64.b64decode(patch))[-1]["value"]


async def test_the_router_routes_new_pods_by_the_reloaded_rules_and_its_status_says_which(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("rules: []\n")
    async for webhook in start(tmp_path):
        state = webhook.state
        state.routing_file = ConfigFile(str(path), what="routing rules",
                                        parse=functools.partial(rules_from_text, source=str(path)))
        state.routing_rules = state.routing_file.load()
        assert await routed_policy(webhook) is None
        path.write_text("rules:\n- podSelector: {matchLabels: {app: train}}\n  policy: binpack\n")
        reload = state.routing_file.poll()
        assert reload is not None and reload.result == SUCCESS
        state.routing_rules = state.routing_file.config  # what follow_routing's apply does
        assert await routed_policy(webhook) == "binpack"
        async with webhook.session.get(f"{webhook.url}/status") as response:
            status = (await response.json())["routing_file"]
        assert status["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() and status["reloads"] == 1
