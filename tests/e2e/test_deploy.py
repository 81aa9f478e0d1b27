"""Deploying hoss to a cluster: the kustomize base and `hoss certs`, checked against the real local plane.

The base is rendered with the plane's kubectl and judged by its apiserver (server-side dry run). `hoss certs` is run
as the operator runs it; its certificate serves a second resolver that a webhook configuration of the test's own
calls over TLS, so a binding in the test's namespace really goes through that certificate and caBundle. The
plane's own `hoss-resolver` registration is left alone.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from cryptography import x509
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from redis.exceptions import NoPermissionError

from deploy import certs, lockdown, pki
from dev.local.cluster import Cluster, pod_manifest
from dev.local.credentials import HOSS_NAMESPACE
from dev.local.plane import DEPLOY_DIR, POLICIES_FILE, WEBHOOK_MANIFEST, LocalPlane
from dev.local.ports import free_port
from dev.local.state import Process
from hoss.framework.profiles import load_profiles
from hoss.model.admission import BINDING_LANES, lane_path
from tests.waiting import until

Json = dict[str, Any]

OVERLAY_DIR = DEPLOY_DIR / "overlays" / "cert-manager"
IMAGE = "ghcr.io/hoss-sched/hoss:0.1.0"
NODE_CAPACITY = {"cpu": "2", "memory": "4Gi", "pods": "10"}
NOBODY = "hoss-e2e-nobody"  # a scheduler name no scheduler serves: the tests bind by hand


# --- rendering --------------------------------------------------------------------------------------------------


def render(plane: LocalPlane, directory: Path) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(plane.kubectl("kustomize", str(directory))) if doc]


def named(objects: list[Json], kind: str) -> dict[str, Json]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def config_map(objects: list[Json], prefix: str) -> Json:
    """The generated ConfigMap whose name is ``prefix`` plus kustomize's content-hash suffix."""
    found = [o for name, o in named(objects, "ConfigMap").items() if re.fullmatch(rf"{prefix}-[a-z0-9]{{10}}", name)]
    assert len(found) == 1, f"one generated ConfigMap {prefix}-<hash>, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def env_of(container: Json) -> dict[str, Json]:
    return {e["name"]: e for e in container.get("env", [])}


def flags(container: Json) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"][1:])


@pytest.fixture(scope="module")
def base(plane: LocalPlane) -> list[Json]:
    return render(plane, DEPLOY_DIR)


def test_webhook_of_the_base_fails_closed_on_bindings_and_calls_the_resolver_service(base: list[Json]) -> None:
    entries = named(base, "ValidatingWebhookConfiguration")["hoss-resolver"]["webhooks"]
    lanes = [f"binding-lane-{lane}.resolver.hoss.io" for lane in range(1, BINDING_LANES)]
    assert [e["name"] for e in entries] == ["binding.resolver.hoss.io", *lanes, "pods.resolver.hoss.io",
                                            "system.resolver.hoss.io", "system-pods.resolver.hoss.io",
                                            "claims.resolver.hoss.io"]
    # ResourceClaim allocations, whoever writes them, fail closed outside the system namespaces; only a write that
    # gives a claim its allocation reaches the resolver
    claims = entries.pop()
    assert (claims["failurePolicy"], claims["clientConfig"]["service"]["path"]) == ("Fail", "/validate-claim")
    assert [(r["apiGroups"], r["operations"], r["resources"]) for r in claims["rules"]] == [
        (["resource.k8s.io"], ["UPDATE"], ["resourceclaims/status"])]
    assert [c["name"] for c in claims["matchConditions"]] == ["a-new-allocation"]
    assert claims["namespaceSelector"]["matchExpressions"][0]["operator"] == "NotIn"
    lane_policies = ("Fail",) * BINDING_LANES
    lane_paths = tuple(lane_path(lane) for lane in range(BINDING_LANES))
    for entry, policy, path, operator in zip(entries, (*lane_policies, "Fail", "Ignore", "Ignore"),
                                             (*lane_paths, "/validate-binding", "/validate-system",
                                              "/validate-system"), ("NotIn",) * (BINDING_LANES + 1) + ("In", "In"),
                                             strict=True):
        assert entry["failurePolicy"] == policy
        assert entry["sideEffects"] == "NoneOnDryRun"
        if entry["name"].endswith("pods.resolver.hoss.io"):
            create, resize = entry["rules"]
            assert (create["operations"], create["resources"]) == (["CREATE"], ["pods"])
            assert (resize["operations"], resize["resources"]) == (["UPDATE"], ["pods/resize"])
            assert [c["name"] for c in entry["matchConditions"]] == ["on-a-node-or-a-resize",
                                                                     "not-a-nodes-own-mirror-pod"]
        else:
            # bindings need no matchConditions, so the apiserver evaluates no CEL for them
            (create,) = entry["rules"]
            assert (create["operations"], set(create["resources"])) == (["CREATE"], {"pods/binding", "bindings"})
            assert "matchConditions" not in entry
        assert entry["clientConfig"] == {
            "service": {"name": "hoss-resolver", "namespace": HOSS_NAMESPACE, "path": path, "port": 443}
        }
        # The resolver's own pods, Redis and CoreDNS must be bindable while no resolver answers: in their
        # namespaces the entry fails open.
        (selected,) = entry["namespaceSelector"]["matchExpressions"]
        assert selected["key"] == "kubernetes.io/metadata.name"
        assert selected["operator"] == operator
        assert set(selected["values"]) == {HOSS_NAMESPACE, "kube-system"}

    service = named(base, "Service")["hoss-resolver"]
    (port,) = service["spec"]["ports"]
    resolver = named(base, "Deployment")["hoss-resolver"]["spec"]["template"]
    (container,) = resolver["spec"]["containers"]
    assert port["port"] == 443
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == 8443
    assert service["spec"]["selector"].items() <= resolver["metadata"]["labels"].items()


def test_every_workload_of_the_base_is_probed_bounded_and_locked_down(base: list[Json]) -> None:
    workloads = {**named(base, "Deployment"), **named(base, "StatefulSet")}
    assert set(workloads) == {"hoss-resolver", "hoss-dispatcher", "hoss-worker-default", "hoss-worker-gpu",
                              "hoss-rescheduler", "hoss-redis"}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for container in pod["containers"]:
            where = f"{name}/{container['name']}"
            for kind in ("requests", "limits"):
                assert set(container["resources"][kind]) >= {"cpu", "memory"}, f"{where} {kind}"
            security = container["securityContext"]
            assert security["runAsNonRoot"] is True, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            assert "readinessProbe" in container, where
            assert "livenessProbe" in container, where
            if name != "hoss-redis":
                assert container["image"] == IMAGE, where


def test_components_run_as_their_service_accounts_with_their_replicas_and_probes(base: list[Json]) -> None:
    deployments = named(base, "Deployment")
    bound_accounts = {s["name"] for b in named(base, "ClusterRoleBinding").values() for s in b["subjects"]}
    expected = {
        "hoss-resolver": ("hoss-resolver", 2),
        "hoss-dispatcher": ("hoss-dispatcher", 2),
        "hoss-worker-default": ("hoss-worker", 3),
        "hoss-worker-gpu": ("hoss-worker", 2),
    }
    for name, (account, replicas) in expected.items():
        spec = deployments[name]["spec"]
        assert spec["template"]["spec"]["serviceAccountName"] == account, name
        assert account in bound_accounts, f"{account} must be bound by rbac.yaml"
        assert spec["replicas"] == replicas, name

    (resolver,) = deployments["hoss-resolver"]["spec"]["template"]["spec"]["containers"]
    assert resolver["args"][0] == "hoss-resolver"
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert resolver[probe]["httpGet"]["scheme"] == "HTTPS"
        assert resolver[probe]["httpGet"]["path"] == path
    tls_mount = flags(resolver)["tls-cert-file"].rsplit("/", 1)[0]
    (mount,) = [m for m in resolver["volumeMounts"] if m["mountPath"] == tls_mount]
    volumes = {v["name"]: v for v in deployments["hoss-resolver"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == certs.DEFAULT_SECRET

    budget = named(base, "PodDisruptionBudget")["hoss-resolver"]["spec"]
    assert budget["minAvailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= (
        deployments["hoss-resolver"]["spec"]["template"]["metadata"]["labels"].items()
    )

    (dispatcher,) = deployments["hoss-dispatcher"]["spec"]["template"]["spec"]["containers"]
    (port,) = named(base, "Service")["hoss-dispatcher"]["spec"]["ports"]
    assert port["port"] == 80
    assert {p["name"]: p["containerPort"] for p in dispatcher["ports"]}[port["targetPort"]] == 8080
    assert flags(dispatcher)["port"] == "8080"
    assert dispatcher["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_workers_serve_their_policy_groups_from_the_profiles_config_map(base: list[Json], tmp_path: Path) -> None:
    policies = config_map(base, "hoss-policies")
    assert policies["data"]["policies.yaml"] == POLICIES_FILE.read_text(), "the ConfigMap is configs/policies.yaml"
    served = tmp_path / "policies.yaml"
    served.write_text(policies["data"]["policies.yaml"])
    profiles, _default = load_profiles(str(served))

    deployments = named(base, "Deployment")
    groups = {"hoss-worker-default": ["default", "binpack"], "hoss-worker-gpu": ["gpu", "gang-topology"]}
    for name, group in groups.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        (worker,) = pod["containers"]
        assert worker["args"][0] == "hoss-worker"
        assert flags(worker)["policies"].split(",") == group
        assert set(group) <= set(profiles), f"{name} serves profiles that configs/policies.yaml must define"
        assert env_of(worker)["HOSS_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        policies_dir = flags(worker)["policies-file"].rsplit("/", 1)[0]
        (mount,) = [m for m in worker["volumeMounts"] if m["mountPath"] == policies_dir]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mount["name"]]["configMap"]["name"] == policies["metadata"]["name"]


def test_every_service_reads_the_shared_settings_and_its_own_redis_user(base: list[Json]) -> None:
    settings = config_map(base, "hoss-config")
    assert "HOSS_REDIS_URL" not in settings["data"], "the Redis URL carries a password: it comes from a Secret"
    assert named(base, "StatefulSet")["hoss-redis"]["spec"]["serviceName"] == "hoss-redis"
    accounts = {"hoss-resolver": "hoss-resolver", "hoss-dispatcher": "hoss-dispatcher",
                "hoss-worker-default": "hoss-worker", "hoss-worker-gpu": "hoss-worker",
                "hoss-rescheduler": "hoss-rescheduler"}
    assert set(named(base, "Deployment")) == set(accounts)
    for name, deployment in named(base, "Deployment").items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert {"configMapRef": {"name": settings["metadata"]["name"]}} in container["envFrom"], name
        reference = env_of(container)["HOSS_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert reference == {"name": lockdown.REDIS_URLS_SECRET, "key": accounts[name]}, name
        assert "optional" not in reference, f"{name} must not start without its Redis user"


def test_the_resolver_of_the_base_needs_nothing_from_the_control_plane(base: list[Json]) -> None:
    """As shipped, the resolver mounts no client CA: a managed apiserver, which presents no client certificate to
    webhooks, can reach it (what an unauthenticated review may hold is the resolver's to bound)."""
    deployment = named(base, "Deployment")["hoss-resolver"]["spec"]["template"]["spec"]
    (resolver,) = deployment["containers"]
    assert not {"client-ca-file", "client-names"} & set(flags(resolver))
    mounted = {v.get("configMap", {}).get("name") for v in deployment["volumes"]}
    assert lockdown.WEBHOOK_CLIENT_CA_CONFIGMAP not in mounted


def test_the_client_auth_component_makes_the_resolver_answer_only_the_apiserver(plane: LocalPlane,
                                                                                 tmp_path: Path) -> None:
    own = tmp_path / "cluster"
    own.mkdir()
    (own / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY_DIR, own)],
        "components": [os.path.relpath(DEPLOY_DIR / "overlays" / "client-auth", own)]}))
    deployment = named(render(plane, own), "Deployment")["hoss-resolver"]["spec"]["template"]["spec"]
    (resolver,) = deployment["containers"]
    given = flags(resolver)
    assert given["client-names"] == lockdown.WEBHOOK_CLIENT_NAME
    ca_dir = given["client-ca-file"].rsplit("/", 1)[0]
    (mount,) = [m for m in resolver["volumeMounts"] if m["mountPath"] == ca_dir]
    volumes = {v["name"]: v for v in deployment["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == lockdown.WEBHOOK_CLIENT_CA_CONFIGMAP


def test_the_bundled_redis_runs_with_acl_users_and_protected_mode(base: list[Json]) -> None:
    pod = named(base, "StatefulSet")["hoss-redis"]["spec"]["template"]["spec"]
    (redis_container,) = pod["containers"]
    args = redis_container["args"]
    assert args[args.index("--protected-mode") + 1] == "yes"
    acl_dir = args[args.index("--aclfile") + 1].rsplit("/", 1)[0]
    (mount,) = [m for m in redis_container["volumeMounts"] if m["mountPath"] == acl_dir]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == lockdown.REDIS_USERS_SECRET


def read_lockdown_files(out: Path) -> dict[str, Json]:
    """Check the control-plane files of `hoss lockdown` in ``out``; its manifests by name."""
    key = out / "control-plane" / "webhook-client.key"
    assert key.stat().st_mode & 0o077 == 0 and (out / "manifests.yaml").stat().st_mode & 0o077 == 0
    admission = yaml.safe_load((out / "control-plane" / "admission-configuration.yaml").read_text())
    kubeconfig_path = Path(admission["plugins"][0]["configuration"]["kubeConfigFile"])
    (user,) = yaml.safe_load(kubeconfig_path.read_text())["users"]
    assert user["name"] == f"hoss-resolver.{HOSS_NAMESPACE}.svc"
    manifests = yaml.safe_load_all((out / "manifests.yaml").read_text())
    objects: dict[str, Json] = {o["metadata"]["name"]: o for o in manifests}
    ca_pem = objects[lockdown.WEBHOOK_CLIENT_CA_CONFIGMAP]["data"]["ca.crt"].encode()
    client_cert = x509.load_pem_x509_certificate(Path(user["user"]["client-certificate"]).read_bytes())
    client_cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    assert client_cert.subject.rfc4514_string() == f"CN={lockdown.WEBHOOK_CLIENT_NAME}"
    return objects


async def test_hoss_lockdown_writes_what_the_apiserver_and_redis_accept(plane: LocalPlane, tmp_path: Path) -> None:
    """The files of `hoss lockdown`: the AdmissionConfiguration and kubeconfig parse as the apiserver reads them,
    the client certificate verifies against the ConfigMap's CA, a real redis-server loads the ACL, and each
    component's URL from the Secret logs in as its user."""
    out = tmp_path / "lockdown"
    await hoss("lockdown", "--output", str(out), "--control-plane-dir", str(out / "control-plane"),
               "--redis-host", "127.0.0.1")
    objects = await asyncio.to_thread(read_lockdown_files, out)
    # Server-side dry run: the apiserver accepts the ConfigMap and Secrets as they are.
    plane.kubectl("apply", "--dry-run=server", "-f", str(out / "manifests.yaml"))

    acl = base64.b64decode(objects[lockdown.REDIS_USERS_SECRET]["data"]["users.acl"])
    (out / "users.acl").write_bytes(acl)
    port = free_port()
    redis_server = await asyncio.create_subprocess_exec(
        "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--protected-mode", "yes",
        "--aclfile", str(out / "users.acl"), stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        urls = {k: base64.b64decode(v).decode() for k, v in objects[lockdown.REDIS_URLS_SECRET]["data"].items()}
        assert set(urls) == set(lockdown.COMPONENTS)
        for component, url in urls.items():
            assert url.startswith(f"redis://{component}:")
            client = aioredis.Redis.from_url(url.replace(":6379/", f":{port}/"))
            try:
                async def answers(client: aioredis.Redis = client) -> tuple[bool, str]:
                    try:
                        return bool(await client.ping()), "PONG"
                    except aioredis.ConnectionError as error:
                        return False, str(error)

                # Logged in as its user: PING answers; a key outside {hoss} is refused.
                await until(answers, timeout=10, what=f"the lockdown ACL's redis-server to answer {component}")
                with pytest.raises(NoPermissionError):
                    await client.get("elsewhere")
            finally:
                await client.aclose()
        probe = aioredis.Redis(port=port, username="probe", password="probe")
        assert await probe.ping()
        with pytest.raises(aioredis.ResponseError):
            await probe.get("{hoss}:ready")
        await probe.aclose()
    finally:
        redis_server.terminate()
        await redis_server.wait()


def test_apiserver_accepts_every_object_of_the_base(plane: LocalPlane, base: list[Json]) -> None:
    # Client-side apply computes its patch against the plane's own hoss-resolver registration (URL, not Service);
    # a dry run changes nothing.
    output = plane.kubectl("apply", "--dry-run=server", "-k", str(DEPLOY_DIR))
    accepted = set(re.findall(r"^(\S+) \S+ \(server dry run\)$", output, flags=re.MULTILINE))
    for obj in base:
        group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
        resource = f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()
        assert f"{resource}/{obj['metadata']['name']}" in accepted, f"{resource}/{obj['metadata']['name']}\n{output}"


def test_cert_manager_component_issues_the_resolver_secret_and_injects_its_ca(
    plane: LocalPlane, base: list[Json], tmp_path: Path
) -> None:
    # A kustomization of the operator's own, outside deploy/, enables the component on top of the base.
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(DEPLOY_DIR, tmp_path)],
        "components": [os.path.relpath(OVERLAY_DIR, tmp_path)],
    }))
    objects = render(plane, tmp_path)

    certificates = named(objects, "Certificate")
    issuers = named(objects, "Issuer")
    serving = certificates["hoss-resolver"]["spec"]
    assert serving["secretName"] == certs.DEFAULT_SECRET
    assert tuple(serving["dnsNames"]) == certs.serving_names().dns_names, "the names `hoss certs` puts in"
    assert "server auth" in serving["usages"]
    ca_secret = issuers[serving["issuerRef"]["name"]]["spec"]["ca"]["secretName"]
    (ca_certificate,) = [c["spec"] for c in certificates.values() if c["spec"]["secretName"] == ca_secret]
    assert ca_certificate["isCA"] is True
    assert issuers[ca_certificate["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}

    webhook = named(objects, "ValidatingWebhookConfiguration")["hoss-resolver"]
    annotation = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{HOSS_NAMESPACE}/hoss-resolver"
    assert certificates["hoss-resolver"]["metadata"]["namespace"] == HOSS_NAMESPACE
    assert set(named(objects, "Deployment")) == set(named(base, "Deployment")), "the whole base, plus cert-manager"


# --- `hoss certs` against the apiserver ---------------------------------------------------------------------------


async def hoss(*args: str) -> str:
    """Run the `hoss` CLI as the operator does; its stdout, or a failure that shows its stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, f"hoss {' '.join(args)} exited {process.returncode}: {err.decode()}"
    return out.decode()


@dataclass
class Resolver:
    """A second hoss-resolver on the plane's Redis, serving the certificate files in ``tls``."""

    process: Process
    tls: pki.KeyPair

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.process.port}/validate-binding"

    async def verdicts(self) -> dict[str, float]:
        """Binding verdicts this resolver gave, by allowed true/false (from its Prometheus /metrics)."""
        async with aiohttp.ClientSession() as session, session.get(
            f"https://127.0.0.1:{self.process.port}/metrics", ssl=False
        ) as response:
            text = await response.text()
        counts = {"true": 0.0, "false": 0.0}
        for allowed, value in re.findall(r'^hoss_resolver_verdicts_total\{allowed="(\w+)",[^}]*\} (\S+)$', text,
                                         flags=re.MULTILINE):
            counts[allowed] += float(value)
        return counts

    async def served_certificate(self) -> x509.Certificate:
        pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", self.process.port))
        return x509.load_pem_x509_certificate(pem.encode())


@pytest.fixture
async def resolver(plane: LocalPlane, tmp_path: Path) -> AsyncIterator[Resolver]:
    """A resolver started with the files that `hoss certs --output` wrote (names: the Service's and 127.0.0.1)."""
    directory = tmp_path / "certs"
    await hoss("certs", "--output", str(directory), "--san", "127.0.0.1")
    name = f"hoss-resolver-e2e-{uuid.uuid4().hex[:6]}"
    pair = pki.KeyPair(cert=directory / "tls.crt", key=directory / "tls.key")
    process = await asyncio.to_thread(plane.start_resolver, name=name, serving=pair)
    try:
        yield Resolver(process=process, tls=pair)
    finally:
        await asyncio.to_thread(plane.stop_process, name)


@pytest.fixture
def webhook_name() -> str:
    return f"hoss-e2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def registered(cluster: Cluster, webhook_name: str) -> AsyncIterator[Any]:
    """Deletes the test's ValidatingWebhookConfiguration afterwards; yields the admissionregistration client."""
    api: Any = client.AdmissionregistrationV1Api(cluster.api)
    yield api
    try:
        await api.delete_validating_webhook_configuration(webhook_name)
    except ApiException as error:
        if error.status != 404:
            raise


def webhook_configuration(*, name: str, url: str, namespace: str, ca_bundle: bytes | None) -> Json:
    """deploy/webhook.yaml, renamed, calling ``url`` and only for bindings in ``namespace``."""
    configuration: Json = yaml.safe_load(WEBHOOK_MANIFEST.read_text())
    configuration["metadata"] = {"name": name}
    configuration["webhooks"] = configuration["webhooks"][:1]  # the system namespaces' entry is not wanted here
    for hook in configuration["webhooks"]:
        hook.pop("objectSelector", None)  # one entry for every lane
        hook["name"] = f"binding.{name}.hoss.io"
        hook["clientConfig"] = {"url": url}
        if ca_bundle is not None:
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode()
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return configuration


@dataclass(frozen=True)
class Refusal:
    """A binding the apiserver refused: its HTTP status and the apiserver's message."""

    status: int
    body: str


@dataclass
class Scene:
    """A node and pods in the test's namespace that nobody schedules, so the test decides each binding."""

    cluster: Cluster
    namespace: str
    node: str
    uids: dict[str, str]

    async def try_bind(self, pod: str, *, dry_run: bool = True) -> Refusal | None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod, "uid": self.uids[pod]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        }
        extra = {"dry_run": "All"} if dry_run else {}
        # Not preloaded: the generated client cannot parse the Status a binding answers with, and it then raises
        # on nothing, so the status is checked here.
        response = await self.cluster.core.create_namespaced_pod_binding(
            pod, self.namespace, body, _preload_content=False, **extra
        )
        text = (await response.read()).decode(errors="replace")
        return None if 200 <= response.status < 300 else Refusal(status=response.status, body=text)

    async def bind(self, pod: str) -> None:
        refusal = await self.try_bind(pod, dry_run=False)
        assert refusal is None, f"binding {pod} to {self.node} refused: {refusal}"


@pytest.fixture
async def scene(cluster: Cluster, namespace: str, request: pytest.FixtureRequest) -> AsyncIterator[Scene]:
    prefix = f"deploy-{request.node.name[5:25].replace('_', '-')}"
    (node,) = await cluster.create_nodes(1, prefix=prefix, capacity=NODE_CAPACITY)
    try:
        await cluster.wait_nodes_ready([node])
        # 1.5 of 2 cpus fit; after that, one more cpu does not.
        pods = [pod_manifest("fits", requests={"cpu": "1500m"}, scheduler_name=NOBODY),
                pod_manifest("too-big", requests={"cpu": "1"}, scheduler_name=NOBODY)]
        await cluster.create_pods(pods, namespace=namespace)
        uids = {p.metadata.name: p.metadata.uid for p in await cluster.pods(namespace)}
        yield Scene(cluster=cluster, namespace=namespace, node=node, uids=uids)
    finally:
        await cluster.delete_pods(namespace)
        await cluster.delete_nodes([node])


async def wait_for_binding_to_pass(scene: Scene, what: str) -> None:
    """Dry-run bindings until one passes every webhook (a new configuration takes a moment to be in force)."""

    async def passes() -> tuple[bool, str]:
        refusal = await scene.try_bind("fits")
        return refusal is None, str(refusal or "passed")

    await until(passes, timeout=30, what=what)


async def test_certificate_from_hoss_certs_output_is_trusted_by_the_apiserver_and_serves_bindings(
    resolver: Resolver, scene: Scene, registered: Any, webhook_name: str, plane: LocalPlane
) -> None:
    # First the plane's CA as caBundle: the apiserver must refuse the resolver's certificate.
    wrong_ca = (plane.pki_dir / "ca.crt").read_bytes()
    await registered.create_validating_webhook_configuration(
        webhook_configuration(name=webhook_name, url=resolver.url, namespace=scene.namespace, ca_bundle=wrong_ca)
    )

    async def distrusted() -> tuple[bool, str]:
        refusal = await scene.try_bind("fits")
        seen = str(refusal or "passed")
        return refusal is not None and "x509" in refusal.body and webhook_name in refusal.body, seen

    await until(distrusted, timeout=30, what="the apiserver to reject a certificate from another CA")

    # Then the CA that `hoss certs` wrote: the same certificate is now trusted.
    ca_crt = resolver.tls.cert.parent / "ca.crt"
    bundle = base64.b64encode(ca_crt.read_bytes()).decode()
    await registered.patch_validating_webhook_configuration(
        webhook_name, [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]
    )
    await wait_for_binding_to_pass(scene, "the apiserver to trust the certificate from hoss certs")

    before = await resolver.verdicts()
    await scene.bind("fits")
    denied = await scene.try_bind("too-big", dry_run=False)
    after = await resolver.verdicts()

    assert denied is not None, "a pod that does not fit must not be bound"
    assert denied.status == 409, denied
    assert f"node {scene.node}" in denied.body, denied
    assert after["true"] - before["true"] >= 1, "our resolver allowed the binding that fits"
    assert after["false"] - before["false"] >= 1, "our resolver judged (and denied) the one that does not"
    (bound,) = [p for p in await scene.cluster.pods(scene.namespace) if p.spec.node_name]
    assert bound.metadata.name == "fits"


async def test_hoss_certs_installs_the_secret_and_the_ca_bundle_and_rotates_without_a_gap(
    resolver: Resolver, scene: Scene, registered: Any, webhook_name: str, plane: LocalPlane
) -> None:
    secret_name = f"{webhook_name}-tls"
    core: Any = scene.cluster.core
    await registered.create_validating_webhook_configuration(
        webhook_configuration(name=webhook_name, url=resolver.url, namespace=scene.namespace, ca_bundle=None)
    )
    # The test's own router configuration (deploy/router.yaml, called for no namespace): its caBundle must follow
    # (--router), and the plane's router, which the plane's resolver serves, must stay as it is.
    router_name = f"{webhook_name}-router"
    router: Json = yaml.safe_load((DEPLOY_DIR / "router.yaml").read_text())
    router["metadata"] = {"name": router_name}
    for hook in router["webhooks"]:
        hook["clientConfig"] = {"url": f"{resolver.url.rsplit('/', 1)[0]}/mutate-pod"}
        hook["namespaceSelector"] = {"matchExpressions": [{"key": "hoss-e2e/none", "operator": "Exists"}]}
    await registered.create_mutating_webhook_configuration(router)
    plane_router = (await registered.read_mutating_webhook_configuration("hoss-router")).webhooks[0]

    async def install() -> tuple[Json, bytes]:
        await hoss("certs", f"--kubeconfig={plane.kubeconfig('admin')}", f"--webhook={webhook_name}",
                   f"--secret={secret_name}", "--san=127.0.0.1", f"--router={router_name}")
        secret = await core.read_namespaced_secret(secret_name, HOSS_NAMESPACE)
        configuration = await registered.read_validating_webhook_configuration(webhook_name)
        (hook,) = configuration.webhooks
        (routed,) = (await registered.read_mutating_webhook_configuration(router_name)).webhooks
        assert routed.client_config.ca_bundle == hook.client_config.ca_bundle, "the router's caBundle follows"
        untouched = (await registered.read_mutating_webhook_configuration("hoss-router")).webhooks[0]
        assert untouched.client_config.ca_bundle == plane_router.client_config.ca_bundle
        return {k: base64.b64decode(v) for k, v in secret.data.items()} | {"type": secret.type}, base64.b64decode(
            hook.client_config.ca_bundle)

    async def act_as_kubelet(secret: Json) -> None:
        """Refresh the resolver's mounted files from the Secret, and wait until it serves the new certificate."""
        resolver.tls.key.write_bytes(secret["tls.key"])
        resolver.tls.cert.write_bytes(secret["tls.crt"])

        async def reloaded() -> tuple[bool, str]:
            served = await resolver.served_certificate()
            return served == x509.load_pem_x509_certificate(secret["tls.crt"]), f"serving {served.subject}"

        await until(reloaded, timeout=30, what="the resolver to reload its certificate")

    try:
        first, first_bundle = await install()
        assert first["type"] == "kubernetes.io/tls"
        assert set(first) == {"type", "tls.crt", "tls.key", "ca.crt"}
        assert first_bundle == first["ca.crt"], "a first install trusts exactly the Secret's CA"
        served = x509.load_pem_x509_certificate(first["tls.crt"])
        served.verify_directly_issued_by(x509.load_pem_x509_certificate(first["ca.crt"]))
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(certs.serving_names().dns_names) <= set(names.get_values_for_type(x509.DNSName))

        await act_as_kubelet(first)
        await wait_for_binding_to_pass(scene, "the apiserver to trust the installed certificate")

        # Rotation: the new CA joins the bundle before the Secret changes, and the old one stays in it.
        second, second_bundle = await install()
        assert second["ca.crt"] != first["ca.crt"]
        bundled = x509.load_pem_x509_certificates(second_bundle)
        assert bundled == [x509.load_pem_x509_certificate(second["ca.crt"]),
                           x509.load_pem_x509_certificate(first["ca.crt"])]
        assert await scene.try_bind("fits") is None, "the certificate served until now is still trusted"
        await act_as_kubelet(second)
        await wait_for_binding_to_pass(scene, "the apiserver to trust the rotated certificate")

        before = await resolver.verdicts()
        await scene.bind("fits")
        assert (await resolver.verdicts())["true"] - before["true"] >= 1, "the binding went through our resolver"
    finally:
        await registered.delete_mutating_webhook_configuration(router_name)
        try:
            await core.delete_namespaced_secret(secret_name, HOSS_NAMESPACE)
        except ApiException as error:
            if error.status != 404:
                raise


async def test_hoss_certs_says_which_webhook_configuration_is_missing(plane: LocalPlane) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", "certs", f"--kubeconfig={plane.kubeconfig('admin')}",
        "--webhook=hoss-e2e-absent", "--secret=hoss-e2e-absent-tls",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _out, err = await process.communicate()
    assert process.returncode == 2
    assert "ValidatingWebhookConfiguration hoss-e2e-absent not found" in err.decode()
