"""The Helm chart (deploy/helm/hoss) against the kustomize base (deploy/): same objects for the same settings.

`helm template` and `kubectl kustomize` run as an operator runs them, with the helm and kubectl that
`python -m dev local build` made from pinned Go modules. Objects are compared whole, after the differences the
chart makes by design:

- kustomize's generated ConfigMaps carry a hash in their names, which rolls the Deployments when they change; the
  chart's are plain and the pods carry checksum/* annotations instead;
- the base creates the Namespace; a chart installs into the release's namespace (`--create-namespace`);
- the chart's shared settings also say where the release lives (HOSS_LEASE_NAMESPACE, HOSS_ACCESS_NAMESPACE,
  HOSS_HOSS_USERNAMES), which the base leaves to the components' hoss-system defaults;
- certificates.mode=hook adds the certificate Job (a post-install and post-upgrade hook), its ServiceAccount and
  permissions, and the Secret it fills (the base leaves that Secret to `hoss certs`).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from redis.connection import parse_url

from deploy import certs, lockdown
from deploy.cli import build_parser
from dev.local import binaries
from dispatcher.settings import DispatcherSettings
from hoss.model.admission import BINDING_LANES, lane_path
from rescheduler.settings import ReschedulerSettings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

Json = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "hoss"
NAMESPACE = "hoss-system"
GENERATED_CONFIG_MAPS = ("hoss-config", "hoss-policies", "hoss-routing")
CHART_SETTINGS = ("HOSS_LEASE_NAMESPACE", "HOSS_ACCESS_NAMESPACE", "HOSS_HOSS_USERNAMES")
ONLY_IN_KUSTOMIZE = {("Namespace", NAMESPACE)}
CERTIFICATE_HOOK = {("Secret", "hoss-resolver-tls"), ("Job", "hoss-certs"), ("ServiceAccount", "hoss-certs"),
                    ("Role", "hoss-certs"), ("RoleBinding", "hoss-certs"), ("ClusterRole", "hoss-certs"),
                    ("ClusterRoleBinding", "hoss-certs")}
SETTINGS_CLASSES = (ResolverSettings, DispatcherSettings, WorkerSettings, ReschedulerSettings)


# --- rendering --------------------------------------------------------------------------------------------------


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binaries.require("helm")), *args], capture_output=True, text=True, check=False,
                          timeout=120)


def template(*options: str, release: str = "hoss", namespace: str = NAMESPACE) -> list[Json]:
    rendered = helm("template", release, str(CHART), "--namespace", namespace, *options)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def refused(*options: str) -> str:
    """helm template's error for values it must refuse."""
    rendered = helm("template", "hoss", str(CHART), "--namespace", NAMESPACE, *options)
    assert rendered.returncode != 0, f"helm template accepted {options}"
    return rendered.stderr


def kustomize(directory: Path) -> list[Json]:
    rendered = subprocess.run([str(binaries.require("kubectl")), "kustomize", str(directory)], capture_output=True,
                              text=True, check=False, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def kustomization(directory: Path, **fields: Any) -> Path:
    """A kustomization of the operator's own over the base (as the README shows), in ``directory``; kustomize takes
    only relative paths to other kustomizations."""
    directory.mkdir(parents=True, exist_ok=True)
    body = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY, directory)], **fields}
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(body))
    return directory


def keyed(objects: Iterable[Json]) -> dict[tuple[str, str], Json]:
    found: dict[tuple[str, str], Json] = {}
    for o in objects:
        key = (o["kind"], o["metadata"]["name"])
        assert key not in found, f"{key} rendered twice"
        found[key] = o
    return found


def unhashed(objects: list[Json]) -> list[Json]:
    """kustomize's output with its generated ConfigMaps (and every reference to them) under their plain names."""
    text = json.dumps(objects)
    for name in GENERATED_CONFIG_MAPS:
        text = re.sub(rf'"{name}-[a-z0-9]{{10}}"', f'"{name}"', text)
    result: list[Json] = json.loads(text)
    return result


def pod_templates(o: Json) -> list[Json]:
    spec = o.get("spec", {})
    return [spec["template"]] if "template" in spec else []


def comparable(o: Json) -> Json:
    """``o`` without what the chart adds by design to an object both render."""
    o = copy.deepcopy(o)
    for pod in pod_templates(o):
        annotations = pod["metadata"].get("annotations", {})
        for key in [k for k in annotations if k.startswith("checksum/")]:
            del annotations[key]
        if "annotations" in pod["metadata"] and not annotations:
            del pod["metadata"]["annotations"]
    if (o["kind"], o["metadata"]["name"]) == ("ConfigMap", "hoss-config"):
        for key in CHART_SETTINGS:
            o["data"].pop(key, None)
    return o


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """Where ``left`` and ``right`` differ, as 'path: left != right'."""
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        for key in sorted(set(left) | set(right), key=str):
            where = f"{path}.{key}"
            if key not in right:
                found.append(f"{where}: only in kustomize")
            elif key not in left:
                found.append(f"{where}: only in the chart")
            else:
                found += differences(left[key], right[key], where)
        return found
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [d for index, (a, b) in enumerate(zip(left, right, strict=True))
                for d in differences(a, b, f"{path}[{index}]")]
    return [] if left == right else [f"{path}: {left!r} != {right!r}"]


def assert_same_objects(base: list[Json], chart: list[Json], *, only_in_chart: set[tuple[str, str]]) -> None:
    """The chart renders every object of ``base`` but the Namespace, identical but for the designed differences,
    and nothing else but ``only_in_chart``."""
    from_base, from_chart = keyed(unhashed(base)), keyed(chart)
    assert set(from_base) - set(from_chart) == ONLY_IN_KUSTOMIZE
    assert set(from_chart) - set(from_base) == only_in_chart
    found = [f"{kind} {name}{where}"
             for kind, name in sorted(set(from_base) & set(from_chart))
             for where in differences(comparable(from_base[kind, name]), comparable(from_chart[kind, name]))]
    assert not found, "the chart differs from the kustomize base:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def base() -> list[Json]:
    return kustomize(DEPLOY)


@pytest.fixture(scope="module")
def chart() -> list[Json]:
    return template()


def containers(objects: Iterable[Json]) -> dict[str, Json]:
    """Every container of every pod template, by '<object>/<container>'."""
    return {f"{o['metadata']['name']}/{c['name']}": c
            for o in objects for pod in pod_templates(o) for c in pod["spec"]["containers"]}


def env_of(container: Json) -> dict[str, Json]:
    return {e["name"]: e for e in container.get("env", [])}


def binding_entries(objects: Iterable[Json]) -> list[Json]:
    (configuration,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    entries: list[Json] = configuration["webhooks"]
    return entries


# --- the default values: the kustomize base ----------------------------------------------------------------------


def test_helm_lint_accepts_the_chart_with_its_defaults_and_other_modes() -> None:
    for options in ((), ("--set", "certificates.mode=cert-manager,webhook.router=false,webhook.lanes=1"),
                    ("--set", "redis.bundled=false,redis.external.host=redis.example.com,"
                              "redis.external.passwordsSecret=redis-passwords,redis.tls.enabled=true")):
        linted = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *options)
        assert linted.returncode == 0, linted.stdout + linted.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in linted.stdout


def test_default_values_render_the_objects_of_the_kustomize_base(base: list[Json], chart: list[Json]) -> None:
    assert_same_objects(base, chart, only_in_chart=CERTIFICATE_HOOK)


def test_the_settings_the_chart_adds_are_what_the_components_assume_in_hoss_system(chart: list[Json]) -> None:
    data = keyed(chart)["ConfigMap", "hoss-config"]["data"]
    for key in CHART_SETTINGS:
        field = key.removeprefix("HOSS_").lower()
        readers = [c for c in SETTINGS_CLASSES if field in c.model_fields]
        assert readers, f"no component reads {key}"
        for reader in readers:
            default = reader.model_fields[field].get_default(call_default_factory=True)
            given = data[key].split(",") if isinstance(default, list) else data[key]
            assert given == default, f"{reader.__name__}.{field}"


def test_the_certificate_hook_runs_hoss_certs_on_the_release_objects_with_no_more_rights(chart: list[Json]) -> None:
    objects = keyed(chart)
    job = objects["Job", "hoss-certs"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "hoss-certs"
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/hoss-sched/hoss:0.1.0"
    command, *arguments = container["args"]
    assert command == "hoss"
    parsed = build_parser().parse_args(arguments)
    assert parsed.run.__name__ == "_certs"
    assert parsed.kubeconfig is None, "inside the pod: its service account"
    assert ("Service", parsed.service) in objects
    assert parsed.namespace == NAMESPACE
    assert ("Secret", parsed.secret) in objects
    assert ("ValidatingWebhookConfiguration", parsed.webhook) in objects
    assert ("MutatingWebhookConfiguration", parsed.router) in objects
    names = certs.serving_names(service=parsed.service, namespace=parsed.namespace,
                                cluster_domain=parsed.cluster_domain)
    assert "hoss-resolver.hoss-system.svc" in names.dns_names

    (secrets,) = objects["Role", "hoss-certs"]["rules"]
    assert (secrets["resources"], secrets["resourceNames"]) == (["secrets"], [parsed.secret])
    assert sorted(secrets["verbs"]) == ["get", "patch"]
    webhooks = objects["ClusterRole", "hoss-certs"]["rules"]
    assert [(r["resources"], r["resourceNames"], sorted(r["verbs"])) for r in webhooks] == [
        (["validatingwebhookconfigurations"], [parsed.webhook], ["get", "patch"]),
        (["mutatingwebhookconfigurations"], [parsed.router], ["get", "patch"]),
    ]
    for binding in ("RoleBinding", "ClusterRoleBinding"):
        (subject,) = objects[binding, "hoss-certs"]["subjects"]
        assert (subject["name"], subject["namespace"]) == ("hoss-certs", NAMESPACE)


def test_until_the_hook_runs_the_resolver_serves_a_certificate_no_webhook_trusts(chart: list[Json]) -> None:
    """The installed Secret holds a key pair (so the resolver starts) under no caBundle (so nothing trusts it)."""
    objects = keyed(chart)
    secret = objects["Secret", "hoss-resolver-tls"]
    assert secret["type"] == "kubernetes.io/tls"
    certificate = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    key = load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), password=None)
    assert certificate.public_key() == key.public_key()
    for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"):
        (configuration,) = [o for o in chart if o["kind"] == kind]
        for entry in configuration["webhooks"]:
            assert "caBundle" not in entry["clientConfig"], entry["name"]


# --- values against the same settings of the base ----------------------------------------------------------------


def test_image_values_render_what_the_kustomize_images_transformer_does(tmp_path: Path) -> None:
    base = kustomize(kustomization(tmp_path, images=[
        {"name": "ghcr.io/hoss-sched/hoss", "newName": "registry.example.com/platform/hoss", "newTag": "1.2.3"},
        {"name": "redis", "newName": "mirror.example.com/redis", "newTag": "7.4"},
    ]))
    chart = template("--set", "image.registry=registry.example.com,image.repository=platform/hoss,image.tag=1.2.3,"
                              "redis.image.registry=mirror.example.com,redis.image.tag=7.4")
    assert_same_objects(base, chart, only_in_chart=CERTIFICATE_HOOK)

    pulled = template("--set", "image.pullPolicy=Always,redis.image.pullPolicy=Never")
    for where, container in containers(pulled).items():
        assert container["imagePullPolicy"] == ("Never" if where.startswith("hoss-redis/") else "Always"), where


def test_cert_manager_mode_renders_what_the_cert_manager_component_does(tmp_path: Path) -> None:
    component = os.path.relpath(DEPLOY / "overlays" / "cert-manager", tmp_path)
    base = kustomize(kustomization(tmp_path, components=[component]))
    chart = template("--set", "certificates.mode=cert-manager")
    assert_same_objects(base, chart, only_in_chart=set())


def test_client_ca_value_renders_what_the_client_auth_component_does(tmp_path: Path) -> None:
    component = os.path.relpath(DEPLOY / "overlays" / "client-auth", tmp_path)
    base = kustomize(kustomization(tmp_path, components=[component]))
    chart = template("--set", "resolver.clientCAConfigMap=hoss-webhook-client-ca")
    assert_same_objects(base, chart, only_in_chart=CERTIFICATE_HOOK)


def test_replicas_of_each_component(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "resolver": {"replicas": 3}, "dispatcher": {"replicas": 1}, "rescheduler": {"replicas": 0},
        "workers": [{"name": "batch", "policies": ["binpack"], "replicas": 7},
                    {"name": "gpu", "policies": ["gpu", "gang-topology"], "replicas": 4}],
    }))
    deployments = {o["metadata"]["name"]: o for o in template("--values", str(values)) if o["kind"] == "Deployment"}
    assert {name: d["spec"]["replicas"] for name, d in deployments.items()} == {
        "hoss-resolver": 3, "hoss-dispatcher": 1, "hoss-rescheduler": 0, "hoss-worker-batch": 7, "hoss-worker-gpu": 4,
    }
    (batch,) = deployments["hoss-worker-batch"]["spec"]["template"]["spec"]["containers"]
    assert "--policies=binpack" in batch["args"]


@pytest.mark.parametrize("lanes", range(1, BINDING_LANES + 1))
def test_every_binding_goes_to_exactly_one_lane_entry_whatever_the_number_of_lanes(lanes: int) -> None:
    entries = binding_entries(template("--set", f"webhook.lanes={lanes}"))
    guarded = [e for e in entries if e["failurePolicy"] == "Fail" and "pods/binding" in e["rules"][0]["resources"]]
    assert [e["clientConfig"]["service"]["path"] for e in guarded] == [lane_path(lane) for lane in range(lanes)]
    # What a worker labels a Binding with (hoss.io/lane 0..7), no label (another scheduler), and a stray value.
    for label in (None, *map(str, range(BINDING_LANES)), "junk"):
        labels = {} if label is None else {"hoss.io/lane": label}
        matched = [e["name"] for e in guarded if selects(e.get("objectSelector", {}), labels)]
        assert len(matched) == 1, f"lane label {label!r} matches {matched}"


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label selector as the apiserver applies it (matchLabels and the In/NotIn/Exists expressions)."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and value is None:
            return False
    return True


def test_the_failure_policy_value_governs_every_entry_outside_the_system_namespaces() -> None:
    entries = binding_entries(template("--set", "webhook.failurePolicy=Ignore,webhook.systemNamespaces={kube-system,"
                                                "dns}"))
    assert {e["failurePolicy"] for e in entries} == {"Ignore"}
    for entry in entries:
        (selected,) = entry["namespaceSelector"]["matchExpressions"]
        assert selected["values"] == [NAMESPACE, "kube-system", "dns"], entry["name"]
    assert {(e["name"], e["namespaceSelector"]["matchExpressions"][0]["operator"]) for e in entries
            if e["name"].startswith("system")} == {("system.resolver.hoss.io", "In"),
                                                   ("system-pods.resolver.hoss.io", "In")}


def test_values_outside_the_schema_are_refused_naming_the_value() -> None:
    assert "at '/webhook/lanes'" in refused("--set", "webhook.lanes=9")
    assert "at '/webhook/failurePolicy'" in refused("--set", "webhook.failurePolicy=Sometimes")
    assert "at '/certificates/mode'" in refused("--set", "certificates.mode=self-signed")
    assert "'replicaz' not allowed" in refused("--set", "resolver.replicaz=3")
    assert "at '/workers/0/name'" in refused("--set", "workers[0].name=Bad_Name")


def test_policies_and_routing_come_from_files_and_roll_the_pods_that_read_them(tmp_path: Path,
                                                                               chart: list[Json]) -> None:
    policies, routing = tmp_path / "policies.yaml", tmp_path / "routing.yaml"
    policies.write_text("defaultProfile: spread\nprofiles:\n- name: spread\n  filters: [{name: NodeResourcesFit}]\n")
    routing.write_text("rules: []\n")
    changed = keyed(template("--set-file", f"policies={policies}", "--set-file", f"routing={routing}"))
    before = keyed(chart)
    assert changed["ConfigMap", "hoss-policies"]["data"] == {"policies.yaml": policies.read_text()}
    assert changed["ConfigMap", "hoss-routing"]["data"] == {"routing.yaml": routing.read_text()}

    def checksum(objects: Mapping[tuple[str, str], Json], name: str, key: str) -> str:
        value: str = objects["Deployment", name]["spec"]["template"]["metadata"]["annotations"][f"checksum/{key}"]
        return value

    for worker in ("hoss-worker-default", "hoss-worker-gpu"):
        assert checksum(changed, worker, "policies") != checksum(before, worker, "policies")
    assert checksum(changed, "hoss-resolver", "routing") != checksum(before, "hoss-resolver", "routing")
    assert checksum(changed, "hoss-resolver", "config") == checksum(before, "hoss-resolver", "config")


# --- Redis ------------------------------------------------------------------------------------------------------


def test_an_external_redis_over_tls_with_passwords_from_a_secret() -> None:
    objects = template("--set", "redis.bundled=false,redis.external.host=redis.example.com,redis.external.port=6380,"
                                "redis.external.db=2,redis.external.passwordsSecret=redis-passwords,"
                                "redis.tls.enabled=true,redis.tls.caSecret=redis-ca")
    assert not [o for o in objects if o["metadata"]["name"] == "hoss-redis"], "no bundled Redis"
    components = {name: c for name, c in containers(objects).items() if not name.startswith("hoss-certs/")}
    users = {"hoss-resolver/resolver": "hoss-resolver", "hoss-dispatcher/dispatcher": "hoss-dispatcher",
             "hoss-worker-default/worker": "hoss-worker", "hoss-worker-gpu/worker": "hoss-worker",
             "hoss-rescheduler/rescheduler": "hoss-rescheduler"}
    assert set(components) == set(users)
    for where, container in components.items():
        user = users[where]
        assert user in lockdown.COMPONENTS
        env = env_of(container)
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "redis-passwords", "key": user}
        names = list(env)
        assert names.index("REDIS_PASSWORD") < names.index("HOSS_REDIS_URL"), "the kubelet expands earlier names"
        url = env["HOSS_REDIS_URL"]["value"].replace("$(REDIS_PASSWORD)", "s3cret-Pa55")
        parsed = parse_url(url)  # type: ignore[no-untyped-call]
        assert (parsed["username"], parsed["password"], parsed["host"], parsed["port"], parsed["db"]) == (
            user, "s3cret-Pa55", "redis.example.com", 6380, 2)
        assert url.startswith("rediss://")
        ca_dir = parsed["ssl_ca_certs"].rsplit("/", 1)[0]
        assert ca_dir in {m["mountPath"] for m in container["volumeMounts"]}, where


def test_redis_urls_from_a_secret_of_the_operators_choice() -> None:
    objects = template("--set", "redis.bundled=false,redis.urlsSecret=managed-redis-urls")
    for where, container in containers(objects).items():
        if where.startswith("hoss-certs/"):
            continue
        reference = env_of(container)["HOSS_REDIS_URL"]["valueFrom"]["secretKeyRef"]
        assert reference["name"] == "managed-redis-urls", where
        assert reference["key"] in lockdown.COMPONENTS, where


def test_the_bundled_redis_and_an_external_one_exclude_each_other() -> None:
    assert "exclude each other" in refused("--set", "redis.external.host=redis.example.com,"
                                                    "redis.external.passwordsSecret=p")
    assert "redis.external.passwordsSecret" in refused("--set", "redis.bundled=false,"
                                                                "redis.external.host=redis.example.com")


# --- another release --------------------------------------------------------------------------------------------


def references(objects: Sequence[Json]) -> list[tuple[str, str, str]]:
    """(what refers, kind, name) for every object the rendered objects name."""
    found: list[tuple[str, str, str]] = []
    for o in objects:
        me = f"{o['kind']} {o['metadata']['name']}"
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            found.append((me, o["roleRef"]["kind"], o["roleRef"]["name"]))
            found += [(me, "ServiceAccount", s["name"]) for s in o["subjects"]]
        for entry in o.get("webhooks", []):
            found.append((me, "Service", entry["clientConfig"]["service"]["name"]))
        for pod in pod_templates(o):
            spec = pod["spec"]
            if "serviceAccountName" in spec:
                found.append((me, "ServiceAccount", spec["serviceAccountName"]))
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    found.append((me, "ConfigMap", volume["configMap"]["name"]))
                if "secret" in volume:
                    found.append((me, "Secret", volume["secret"]["secretName"]))
            for container in spec["containers"]:
                found += [(me, "ConfigMap", e["configMapRef"]["name"]) for e in container.get("envFrom", [])]
                found += [(me, "Secret", e["valueFrom"]["secretKeyRef"]["name"]) for e in container.get("env", [])
                          if "secretKeyRef" in e.get("valueFrom", {})]
    return found


def test_another_release_name_and_namespace_keep_every_reference_inside_the_release() -> None:
    objects = template(release="prod", namespace="sched")
    by_key = keyed(objects)
    # What hoss lockdown writes (the operator applies it), and the TLS Secret the hook fills.
    outside = {("Secret", lockdown.REDIS_URLS_SECRET), ("Secret", lockdown.REDIS_USERS_SECRET),
               ("ConfigMap", lockdown.WEBHOOK_CLIENT_CA_CONFIGMAP)}
    for referrer, kind, name in references(objects):
        assert (kind, name) in by_key or (kind, name) in outside, f"{referrer} names {kind} {name}"
    for o in objects:
        assert o["metadata"]["name"].startswith("prod-hoss-"), o["metadata"]["name"]
        assert o["metadata"].get("namespace", "sched") == "sched", o["metadata"]["name"]
        if o["kind"] == "Service":
            (selected,) = [p for p in objects if pod_templates(p) and o["spec"]["selector"].items()
                           <= p["spec"]["template"]["metadata"]["labels"].items()]
            assert selected["metadata"]["name"] == o["metadata"]["name"]
    settings = by_key["ConfigMap", "prod-hoss-config"]["data"]
    worker_account = by_key["Deployment", "prod-hoss-worker-default"]["spec"]["template"]["spec"]["serviceAccountName"]
    assert settings["HOSS_HOSS_USERNAMES"] == f"system:serviceaccount:sched:{worker_account}"
    assert settings["HOSS_LEASE_NAMESPACE"] == settings["HOSS_ACCESS_NAMESPACE"] == "sched"
    for entry in binding_entries(objects):
        assert entry["clientConfig"]["service"]["namespace"] == "sched"
        assert entry["namespaceSelector"]["matchExpressions"][0]["values"] == ["sched", "kube-system"]
    job_args = by_key["Job", "prod-hoss-certs"]["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(job_args[1:])
    assert (parsed.namespace, parsed.service, parsed.webhook) == ("sched", "prod-hoss-resolver", "prod-hoss-resolver")


def test_without_the_router_the_hook_neither_patches_nor_may_patch_a_router() -> None:
    objects = keyed(template("--set", "webhook.router=false"))
    assert not [key for key in objects if key[0] == "MutatingWebhookConfiguration"]
    job_args = objects["Job", "hoss-certs"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert build_parser().parse_args(job_args[1:]).router == ""
    assert [r["resources"] for r in objects["ClusterRole", "hoss-certs"]["rules"]] == [
        ["validatingwebhookconfigurations"]]


# --- the chart's README ------------------------------------------------------------------------------------------


OPAQUE_VALUES = frozenset({"settings", "resources", "workerResources", "nodeSelector"})
"""Maps given whole (their keys are the operator's), listed as one value."""


def leaves(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the values an operator sets."""
    found = []
    for key, value in values.items():
        if isinstance(value, dict) and key not in OPAQUE_VALUES:
            found += leaves(value, f"{prefix}{key}.")
        else:
            found.append(f"{prefix}{key}")
    return found


def test_the_chart_readme_lists_every_value() -> None:
    table = (CHART / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE))
    named = set(leaves(yaml.safe_load((CHART / "values.yaml").read_text())))
    assert named - listed == set(), "values missing from deploy/helm/hoss/README.md"
    assert listed - named == set(), "README rows for values that do not exist"
