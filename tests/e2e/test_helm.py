"""The Helm chart on the real local plane: `helm install`, `helm upgrade` and `helm uninstall` as an operator runs
them, with the helm that `python -m dev local build` made from pinned Go modules.

The plane has no kubelet: kwok marks the pods of a fake node Running and Ready, so the Deployments become Available
without running a container. The certificate hook's pod is the exception this test makes real: acting as the
kubelet, it runs that pod's container command (the image's `hoss certs`, here the same package's console script)
with a token of the pod's ServiceAccount bound to the pod, and reports its exit as the pod's status, so the
Job completes, Helm goes on, and the Secret and caBundle are what `hoss certs` made under the chart's own RBAC.
A binding in another namespace shows whether the apiserver calls the chart's webhook: while it is installed with
failurePolicy Fail, the call to its Service (which no resolver answers here) refuses the binding; with Ignore, or
once uninstalled, the binding passes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from kubernetes_asyncio import client

from deploy import lockdown
from dev.local import binaries
from dev.local.cluster import Cluster, pod_manifest
from dev.local.plane import LocalPlane
from tests.waiting import until

Json = dict[str, Any]

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "hoss"
HOSS = Path(sys.executable).with_name("hoss")
"""The operator's CLI of the package under test: what the image's `hoss` is."""
NOBODY = "hoss-e2e-nobody"  # a scheduler name no scheduler serves: the test binds by hand
NODE_CAPACITY = {"cpu": "32", "memory": "64Gi", "pods": "110"}
RELEASE_KINDS = {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "ConfigMap", "Secret",
                 "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                 "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
"""Every kind of object the chart installs (with its default values); the hook adds a Job."""
HELM_TIMEOUT = "3m"


@dataclass
class Helm:
    """helm against the plane as its admin, with its caches and release-repository config in the test's directory."""

    binary: Path
    env: dict[str, str]

    def start(self, *args: str) -> asyncio.Task[str]:
        return asyncio.create_task(self.run(*args))

    async def run(self, *args: str) -> str:
        process = await asyncio.create_subprocess_exec(str(self.binary), *args, env=self.env,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await process.communicate()
        assert process.returncode == 0, f"helm {' '.join(args)} failed:\n{err.decode()}"
        return out.decode()


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str

    @property
    def resolver(self) -> str:
        """The prefix of every object's name is the release name (it contains 'hoss')."""
        return f"{self.name}-resolver"


@pytest.fixture
def helm(plane: LocalPlane, tmp_path: Path) -> Helm:
    home = tmp_path / "helm"
    env = dict(os.environ, KUBECONFIG=str(plane.kubeconfig("admin")), HELM_CACHE_HOME=str(home / "cache"),
               HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
    return Helm(binaries.require("helm"), env)


@pytest.fixture
async def node(cluster: Cluster) -> AsyncIterator[str]:
    (name,) = await cluster.create_nodes(1, prefix=f"helm-{uuid.uuid4().hex[:6]}", capacity=NODE_CAPACITY)
    await cluster.wait_nodes_ready([name])
    yield name
    await cluster.delete_nodes([name])


# --- acting as the kubelet for the certificate hook -------------------------------------------------------------


async def hook_pod(cluster: Cluster, release: Release, helm_running: asyncio.Task[str]) -> Any:
    """The certificate Job's pod once kwok runs it on the node; fails if helm ends first."""
    job = f"{release.name}-certs"

    async def running() -> tuple[bool, str]:
        if helm_running.done():
            pytest.fail(f"helm ended before the certificate hook ran: {helm_running.result()}")
        pods = await cluster.pods(release.namespace, label_selector=f"job-name={job}")
        started = [p for p in pods if p.spec.node_name and p.status.phase == "Running"]
        return bool(started), f"pods of Job {job}: {[(p.metadata.name, p.status.phase) for p in pods]}"

    await until(running, timeout=120, what=f"the pod of the hook Job {job} to run")
    pods = await cluster.pods(release.namespace, label_selector=f"job-name={job}")
    (pod,) = [p for p in pods if p.status.phase == "Running"]
    return pod


async def run_as_kubelet(cluster: Cluster, plane: LocalPlane, pod: Any, workdir: Path) -> str:
    """Run the pod's one container command as its ServiceAccount, then record its exit in the pod's status."""
    (container,) = pod.spec.containers
    command, *arguments = container.args
    assert command == "hoss", f"the hook runs the image's hoss CLI, not {container.args}"
    token = await cluster.core.create_namespaced_service_account_token(
        pod.spec.service_account_name, pod.metadata.namespace,
        {"spec": {"expirationSeconds": 600,
                  "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                     "uid": pod.metadata.uid}}},
    )
    kubeconfig = workdir / f"{pod.metadata.name}.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "plane", "cluster": {"server": plane.state().apiserver_url,
                                                   "certificate-authority": str(plane.pki_dir / "ca.crt")}}],
        "users": [{"name": "pod", "user": {"token": token.status.token}}],
        "contexts": [{"name": "pod", "context": {"cluster": "plane", "user": "pod"}}],
    }))
    process = await asyncio.create_subprocess_exec(
        str(HOSS), *arguments, env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    code = process.returncode
    now = pod.status.start_time.isoformat()
    await cluster.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"},
                       {"type": "ContainersReady", "status": "False", "reason": "PodCompleted"}],
        "containerStatuses": [{
            "name": container.name, "image": container.image, "imageID": "", "ready": False, "restartCount": 0,
            "started": False,
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "startedAt": now, "finishedAt": now}},
        }],
    }})
    assert code == 0, f"hoss {' '.join(arguments)} failed in the hook pod:\n{err.decode()}"
    return out.decode()


async def with_hook(cluster: Cluster, plane: LocalPlane, release: Release, workdir: Path,
                    helm_running: asyncio.Task[str], *, before: Any = None) -> tuple[str, Any]:
    """Wait for the hook's pod, see what ``before`` reads then, run the pod, and wait for helm to finish."""
    try:
        pod = await hook_pod(cluster, release, helm_running)
        seen = await before() if before is not None else None
        await run_as_kubelet(cluster, plane, pod, workdir)
        return await helm_running, seen
    finally:
        if not helm_running.done():
            helm_running.cancel()


# --- what the apiserver holds -----------------------------------------------------------------------------------


def manifest_objects(text: str) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def exists(plane: LocalPlane, o: Json, namespace: str) -> bool:
    group = o["apiVersion"].split("/")[0] if "/" in o["apiVersion"] else ""
    resource = f"{o['kind'].lower()}.{group}" if group else o["kind"].lower()
    scope = ["-n", namespace] if o["metadata"].get("namespace") else []
    found = plane.kubectl("get", resource, o["metadata"]["name"], *scope, "--ignore-not-found", "-o", "name")
    return bool(found.strip())


async def webhooks(cluster: Cluster, release: Release) -> tuple[Json, Json]:
    admission: Any = client.AdmissionregistrationV1Api(cluster.api)
    validating = await admission.read_validating_webhook_configuration(release.resolver, _preload_content=False)
    mutating = await admission.read_mutating_webhook_configuration(f"{release.name}-router", _preload_content=False)
    return json.loads(await validating.read()), json.loads(await mutating.read())


async def tls_secret(cluster: Cluster, release: Release) -> Json:
    secret = await cluster.core.read_namespaced_secret(f"{release.resolver}-tls", release.namespace,
                                                       _preload_content=False)
    body: Json = json.loads(await secret.read())
    return body


def bundle_of(configuration: Json) -> bytes:
    """The caBundle every entry of ``configuration`` carries (they must all carry the same)."""
    bundles = {entry["clientConfig"].get("caBundle", "") for entry in configuration["webhooks"]}
    assert len(bundles) == 1, f"{configuration['metadata']['name']}: entries with different caBundles"
    return base64.b64decode(bundles.pop())


def assert_trusted(secret: Json, bundle: bytes, *, service_host: str) -> x509.Certificate:
    """The Secret's serving certificate names ``service_host`` and chains to a CA of ``bundle``; returns the CA."""
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert service_host in names.get_values_for_type(x509.DNSName)
    issuers = [ca for ca in x509.load_pem_x509_certificates(bundle) if ca.subject == served.issuer]
    assert issuers, "no CA of the caBundle issued the served certificate"
    served.verify_directly_issued_by(issuers[0])
    return issuers[0]


@dataclass
class Witness:
    """A pod in another namespace that nobody schedules: a dry-run binding of it shows which webhooks the apiserver
    calls."""

    cluster: Cluster
    namespace: str
    pod: str
    uid: str
    node: str

    async def refusal(self) -> str | None:
        """None when a dry-run binding passes every webhook, else the apiserver's message."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": self.pod, "uid": self.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}
        response = await self.cluster.core.create_namespaced_pod_binding(
            self.pod, self.namespace, body, dry_run="All", _preload_content=False)
        text: str = (await response.read()).decode(errors="replace")
        if 200 <= response.status < 300:
            return None
        try:
            return str(json.loads(text)["message"])
        except (ValueError, KeyError):
            return text

    async def wait_refused_by(self, release: Release) -> str:
        host = f"{release.resolver}.{release.namespace}.svc"

        async def refused() -> tuple[bool, str]:
            answer = await self.refusal()
            return answer is not None and host in answer, answer or "bound (dry run)"

        return await until(refused, timeout=60, what=f"the apiserver to call {host} for a binding")

    async def wait_passes(self, what: str) -> None:
        async def passes() -> tuple[bool, str]:
            answer = await self.refusal()
            return answer is None, answer or "bound (dry run)"

        await until(passes, timeout=60, what=what)


@pytest.fixture
async def witness(cluster: Cluster, namespace: str, node: str) -> Witness:
    (name,) = await cluster.create_pods([pod_manifest("witness", requests={"cpu": "100m"}, scheduler_name=NOBODY)],
                                        namespace=namespace)
    (pod,) = await cluster.pods(namespace)
    return Witness(cluster=cluster, namespace=namespace, pod=name, uid=pod.metadata.uid, node=node)


async def available(cluster: Cluster, namespace: str, name: str, replicas: int) -> None:
    apps: Any = client.AppsV1Api(cluster.api)

    async def ready() -> tuple[bool, str]:
        status = (await apps.read_namespaced_deployment(name, namespace)).status
        return status.available_replicas == replicas, f"{status.available_replicas} of {replicas} available"

    await until(ready, timeout=120, what=f"Deployment {name} to have {replicas} available replicas")


# --- the test ---------------------------------------------------------------------------------------------------


async def test_helm_install_upgrade_and_uninstall_on_a_real_control_plane(
    plane: LocalPlane, cluster: Cluster, helm: Helm, node: str, witness: Witness, tmp_path: Path,
) -> None:
    release = Release(name=f"hoss-e2e-{uuid.uuid4().hex[:6]}", namespace=f"helm-{uuid.uuid4().hex[:6]}")
    await witness.wait_passes("a binding to pass before hoss is installed")
    # What an operator does first (the chart's README): the namespace and `hoss lockdown`'s Secrets.
    await cluster.ensure_namespace(release.namespace)
    locked = tmp_path / "lockdown"
    await checked(asyncio.create_subprocess_exec(
        str(HOSS), "lockdown", "--output", str(locked), "--namespace", release.namespace,
        "--redis-host", f"{release.name}-redis.{release.namespace}.svc", "--control-plane-dir", str(locked / "cp")))
    plane.kubectl("apply", "-f", str(locked / "manifests.yaml"))
    installed_objects: list[Json] = []
    try:
        # --- install: the hook makes the certificate; every object is there; the webhook is in force ----------
        await with_hook(cluster, plane, release, tmp_path, helm.start(
            "install", release.name, str(CHART), "--namespace", release.namespace, "--timeout", HELM_TIMEOUT))
        installed_objects = manifest_objects(await helm.run("get", "manifest", release.name, "-n", release.namespace))
        assert {o["kind"] for o in installed_objects} == RELEASE_KINDS
        hooks = manifest_objects(await helm.run("get", "hooks", release.name, "-n", release.namespace))
        assert [(o["kind"], o["metadata"]["name"]) for o in hooks] == [("Job", f"{release.name}-certs")]
        missing = [f"{o['kind']} {o['metadata']['name']}" for o in installed_objects
                   if not exists(plane, o, release.namespace)]
        assert not missing, f"objects of the release not in the apiserver: {missing}"
        assert not exists(plane, hooks[0], release.namespace), "the hook Job is deleted once it succeeded"
        status = json.loads(await helm.run("status", release.name, "-n", release.namespace, "-o", "json"))
        assert status["info"]["status"] == "deployed"
        for deployment, replicas in ((release.resolver, 2), (f"{release.name}-dispatcher", 2),
                                     (f"{release.name}-worker-default", 3), (f"{release.name}-worker-gpu", 2),
                                     (f"{release.name}-rescheduler", 1)):
            await available(cluster, release.namespace, deployment, replicas)

        validating, mutating = await webhooks(cluster, release)
        service = {"name": release.resolver, "namespace": release.namespace, "port": 443}
        for entry in (*validating["webhooks"], *mutating["webhooks"]):
            called = dict(entry["clientConfig"]["service"])
            assert called.pop("path").startswith(("/validate-", "/mutate-pod")), entry["name"]
            assert called == service, entry["name"]
        host = f"{release.resolver}.{release.namespace}.svc"
        first_secret = await tls_secret(cluster, release)
        first_bundle = bundle_of(validating)
        assert bundle_of(mutating) == first_bundle, "the router trusts the same CA"
        first_ca = assert_trusted(first_secret, first_bundle, service_host=host)
        assert first_secret["metadata"]["annotations"]["meta.helm.sh/release-name"] == release.name, (
            "the Secret belongs to the release, so that uninstalling removes it")
        refused = await witness.wait_refused_by(release)
        assert 'failed calling webhook "binding.resolver.hoss.io"' in refused

        # --- upgrade: new values take effect, the certificate of the install is kept until the hook renews it ----
        async def before_the_hook() -> tuple[Json, Json]:
            return await tls_secret(cluster, release), (await webhooks(cluster, release))[0]

        _, (secret_then, validating_then) = await with_hook(cluster, plane, release, tmp_path, helm.start(
            "upgrade", release.name, str(CHART), "--namespace", release.namespace, "--reuse-values",
            "--set", "dispatcher.replicas=3", "--set", "webhook.failurePolicy=Ignore", "--timeout", HELM_TIMEOUT,
        ), before=before_the_hook)
        assert secret_then["data"] == first_secret["data"], "the upgrade kept the certificate that hoss certs wrote"
        assert bundle_of(validating_then) == first_bundle, "the upgrade kept the caBundle"
        outside = [e for e in validating_then["webhooks"] if not e["name"].startswith("system")]
        assert {e["failurePolicy"] for e in outside} == {"Ignore"}
        await available(cluster, release.namespace, f"{release.name}-dispatcher", 3)
        validating, mutating = await webhooks(cluster, release)
        renewed = await tls_secret(cluster, release)
        bundle = bundle_of(validating)
        assert renewed["data"]["tls.crt"] != first_secret["data"]["tls.crt"]
        new_ca = assert_trusted(renewed, bundle, service_host=host)
        assert x509.load_pem_x509_certificates(bundle) == [new_ca, first_ca], (
            "the new CA first, and the one served until the resolver reloads")
        await witness.wait_passes("the binding to pass once the webhook ignores its failures (the upgrade)")
        history = json.loads(await helm.run("history", release.name, "-n", release.namespace, "-o", "json"))
        assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

        # --- uninstall: nothing of the release is left ------------------------------------------------------------
        await helm.run("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout",
                       HELM_TIMEOUT)
        left = [f"{o['kind']} {o['metadata']['name']}" for o in [*installed_objects, *hooks]
                if exists(plane, o, release.namespace)]
        assert not left, f"helm uninstall left {left}"
        await nothing_of_the_release_in(cluster, release)
        assert not json.loads(await helm.run("list", "-n", release.namespace, "-a", "-o", "json"))
        await witness.wait_passes("a binding to pass once the chart's webhook is gone")
    finally:
        if installed_objects:
            await helm.run("uninstall", release.name, "--namespace", release.namespace, "--ignore-not-found")
        plane.kubectl("delete", "namespace", release.namespace, "--wait=false", "--ignore-not-found")


async def nothing_of_the_release_in(cluster: Cluster, release: Release) -> None:
    """No pod of the release (the garbage collector deletes them after their ReplicaSets), no Helm release record,
    and no other Secret, ConfigMap or ServiceAccount than `hoss lockdown`'s and the namespace's default account."""
    async def gone() -> tuple[bool, str]:
        pods = await cluster.pods(release.namespace)
        return not pods, f"pods: {[p.metadata.name for p in pods]}"

    await until(gone, timeout=60, what="the release's pods to be deleted")
    secrets = await cluster.core.list_namespaced_secret(release.namespace)
    assert {s.metadata.name for s in secrets.items} == {lockdown.REDIS_URLS_SECRET, lockdown.REDIS_USERS_SECRET}
    config_maps = await cluster.core.list_namespaced_config_map(release.namespace)
    assert {c.metadata.name for c in config_maps.items} - {"kube-root-ca.crt"} == {
        lockdown.WEBHOOK_CLIENT_CA_CONFIGMAP}
    accounts = await cluster.core.list_namespaced_service_account(release.namespace)
    assert {a.metadata.name for a in accounts.items} <= {"default"}
    rbac: Any = client.RbacAuthorizationV1Api(cluster.api)
    cluster_wide = [*(await rbac.list_cluster_role()).items, *(await rbac.list_cluster_role_binding()).items]
    assert not [o.metadata.name for o in cluster_wide if o.metadata.name.startswith(release.name)]


async def checked(started: Awaitable[asyncio.subprocess.Process]) -> None:
    process = await started
    assert await process.wait() == 0
