"""Policies and routing rules edited while hoss runs, on the real plane: the files are published as the kubelet
publishes a mounted ConfigMap (a new timestamped directory, then the ``..data`` link swapped), a worker places a pod
that fit nowhere under its old profiles once the new ones say where it may go, the resolver routes new pods by a rule
added to its file, and a bad edit is refused with an Event naming the field while the old behaviour goes on, all
without a restart."""

from __future__ import annotations

import hashlib
import itertools
import os
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import POLICIES_FILE, LocalPlane
from dev.local.state import Process
from hoss.reload import KEPT, RELOADED
from tests.e2e.hoss import hoss_pods, metric_total, metrics_text, node_set, wait_all_bound, worker_tries_again, workers
from tests.waiting import until

RELOAD_SECONDS = "0.5"
_versions = itertools.count()


class ConfigMapMount:
    """A directory laid out as the kubelet mounts a ConfigMap with one key: ``<key>`` links to ``..data/<key>``,
    ``..data`` to a timestamped directory; `publish` writes a new directory and swaps the link in one rename."""

    def __init__(self, directory: Path, key: str, text: str) -> None:
        self.directory = directory
        self.key = key
        directory.mkdir()
        self.publish(text)
        (directory / key).symlink_to(f"..data/{key}")

    @property
    def path(self) -> Path:
        return self.directory / self.key

    def publish(self, text: str) -> str:
        """Publish `text` as the new content; its SHA-256."""
        version = f"..2026_01_01_00_00_{next(_versions):02d}"
        (self.directory / version).mkdir()
        (self.directory / version / self.key).write_text(text)
        (self.directory / "..data_tmp").symlink_to(version)
        os.replace(self.directory / "..data_tmp", self.directory / "..data")
        return hashlib.sha256(text.encode()).hexdigest()


def policies(**edit: Any) -> str:
    """configs/policies.yaml with top-level keys replaced."""
    config = yaml.safe_load(POLICIES_FILE.read_text())
    config.update(edit)
    return yaml.safe_dump(config)


async def reload_events(cluster: Cluster, namespace: str, reason: str) -> list[Any]:
    """The events about the namespace itself with `reason`: a component outside a Pod records its reloads there
    (env POD_NAMESPACE, no POD_NAME)."""
    events = await cluster.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Namespace,involvedObject.name={namespace},reason={reason}")
    return list(events.items)


async def event_says(cluster: Cluster, namespace: str, reason: str, *words: str) -> str:
    """Wait for an event with `reason` about the namespace whose message has every one of `words`; its message."""
    async def posted() -> tuple[bool, str]:
        messages = [str(e.message) for e in await reload_events(cluster, namespace, reason)]
        found = [m for m in messages if all(word in m for word in words)]
        return bool(found), "; ".join(messages) or "none"

    await until(posted, timeout=30, what=f"a {reason} event saying {words}")
    return next(str(e.message) for e in await reload_events(cluster, namespace, reason)
                if all(word in str(e.message) for word in words))


async def worker_status(worker: Process) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{worker.port}/status") as response:
        status: dict[str, Any] = await response.json()
        return status


def still_running(plane: LocalPlane, process: Process) -> bool:
    """The same process as was started: no restart."""
    current = plane.running(process.name)
    return current is not None and current.pid == process.pid


async def test_a_policy_edit_places_a_waiting_pod_without_a_restart_and_a_bad_edit_is_refused_with_an_event(
    plane: LocalPlane, dispatcher: Process, cluster: Cluster, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", namespace)  # the worker's events about itself: on the test's namespace
    # The test's namespace is confined to pool reload-a, where there is no node: its pod fits nowhere.
    mount = ConfigMapMount(tmp_path / "policies", "policies.yaml",
                           policies(namespacePools={namespace: "reload-a"}))
    first = hashlib.sha256(mount.path.read_bytes()).hexdigest()
    extra = [f"--policies-file={mount.path}", f"--config-reload-seconds={RELOAD_SECONDS}"]
    async with node_set(cluster, 2, labels={"hoss.io/pool": "reload-b"}) as pool_b, \
            workers(plane, [("reload-1", ["default"])], extra_args=extra) as [worker]:
        await cluster.create_pods(hoss_pods("wait", 1), namespace=namespace)
        await worker_tries_again(worker)
        assert not (await cluster.raw_list("list_namespaced_pod", namespace))[0]["spec"].get("nodeName")

        # A bad edit: refused, naming the field; the profiles in use stay, and decide the pod's next tries.
        bad = yaml.safe_load(policies(namespacePools={namespace: "reload-b"}))
        bad["profiles"][0]["scores"][4]["weight"] = 1000
        mount.publish(yaml.safe_dump(bad))
        message = await event_says(cluster, namespace, KEPT, "kept the old policies", "scores[4].weight")
        print(f"refused: {message}")
        status = (await worker_status(worker))["policies_file"]
        assert status["sha256"] == first and status["refused"] and "scores[4].weight" in status["last_error"]
        await worker_tries_again(worker)
        assert not (await cluster.raw_list("list_namespaced_pod", namespace))[0]["spec"].get("nodeName")

        # A good edit: the namespace moves to pool reload-b, which has nodes; the waiting pod is placed there.
        second = mount.publish(policies(namespacePools={namespace: "reload-b"}))
        pods = await wait_all_bound(cluster, namespace, 1, timeout=60)
        assert pods[0]["spec"]["nodeName"] in pool_b
        await event_says(cluster, namespace, RELOADED, "reloaded the policies", second[:12])
        status = (await worker_status(worker))["policies_file"]
        assert (status["sha256"], status["refused"], status["reloads"], status["failures"]) == (second, False, 1, 1)
        assert status["resolved"].startswith(str(mount.directory / "..2026"))
        text = await metrics_text(f"http://127.0.0.1:{worker.port}/metrics")
        assert metric_total(text, "hoss_worker_config_reloads_total", result="success") == 1
        assert metric_total(text, "hoss_worker_config_reloads_total", result="failure") == 1
        assert still_running(plane, worker), "the worker was restarted"


async def routed_policy(cluster: Cluster, namespace: str, labels: dict[str, str]) -> str | None:
    """The policy the router gives a pod with `labels` created now in `namespace` (a dry run: nothing is stored)."""
    created: Any = await cluster.core.create_namespaced_pod(namespace, pod_manifest("probe", labels=labels),
                                                          dry_run="All")
    if created.spec.scheduler_name != "hoss":
        return None
    return str((created.metadata.labels or {}).get("hoss.io/policy"))


async def routes(cluster: Cluster, namespace: str, labels: dict[str, str], policy: str | None) -> None:
    async def routed() -> tuple[bool, str]:
        found = await routed_policy(cluster, namespace, labels)
        return found == policy, f"routed with {found}"

    await until(routed, timeout=30, what=f"a pod labelled {labels} to be routed with {policy}")


async def resolver_status(plane: LocalPlane, resolver: Process) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(plane.pki_dir / "ca.crt"))
    async with aiohttp.ClientSession() as session, session.get(
        f"https://127.0.0.1:{resolver.port}/status", ssl=context
    ) as response:
        status: dict[str, Any] = await response.json()
        return status


def rules(*rule: dict[str, Any]) -> str:
    return yaml.safe_dump({"rules": list(rule)})


TRAIN_TO_BINPACK = {"namespaceSelector": {"matchLabels": {"team": "ml"}},
                    "podSelector": {"matchLabels": {"app": "train"}}, "policy": "binpack"}


async def test_a_routing_rule_added_to_the_file_routes_new_pods_and_a_bad_rule_keeps_the_old_ones(
    plane: LocalPlane, cluster: Cluster, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    mount = ConfigMapMount(tmp_path / "routing", "routing.yaml", rules())
    plane.stop_resolver()
    try:
        resolver = plane.start_resolver(
            extra_args=[f"--routing-file={mount.path}", f"--config-reload-seconds={RELOAD_SECONDS}"])
        plane.register_webhook()
        plane.kubectl("label", "namespace", namespace, "hoss.io/policy=default", "team=ml")
        train = {"app": "train"}
        await routes(cluster, namespace, train, "default")  # the namespace's label: no rule yet

        added = mount.publish(rules(TRAIN_TO_BINPACK))
        await routes(cluster, namespace, train, "binpack")
        assert await routed_policy(cluster, namespace, {"app": "web"}) == "default"
        await event_says(cluster, namespace, RELOADED, "reloaded the routing rules", added[:12])

        mount.publish(rules(TRAIN_TO_BINPACK, {"podSelector": {"matchExpressions": [
            {"key": "app", "operator": "Matches", "values": ["x"]}]}, "policy": "gpu"}))
        message = await event_says(cluster, namespace, KEPT, "kept the old routing rules",
                                   "rules[1].podSelector.matchExpressions[0].operator")
        print(f"refused: {message}")
        assert await routed_policy(cluster, namespace, train) == "binpack"
        status = (await resolver_status(plane, resolver))["routing_file"]
        assert (status["sha256"], status["refused"], status["reloads"], status["failures"]) == (added, True, 1, 1)
        assert still_running(plane, resolver), "the resolver was restarted"
    finally:
        plane.stop_resolver()
        plane.ensure_resolver()

