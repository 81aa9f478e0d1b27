"""The oldest Kubernetes release hoss's manifests work on, derived from the manifests themselves, and the README
(and the Helm chart's kubeVersion) stating exactly that release.

Every object of deploy/ (the kustomize base with its CRDs, the patches in its kustomizations, the cert-manager
component) and of the Helm chart deploy/helm/hoss, as `helm template` renders it with each kind of certificates and
Redis (helm is built by `make binaries`), is walked field by field. A field is named by the API type it belongs
to (`PodSpec.topologySpreadConstraints`, `ValidatingWebhook.matchConditions`); every kind, every field and every
resource a webhook rule names must be in the tables below with the release that made it generally available, so
a new one fails the test until its release is looked up and added. The floor is the newest release among those the
manifests use. What a manifest names without needing it (a webhook rule for a subresource an older cluster lacks
matches nothing there) is listed apart, and the README must say from which release it applies. Not derived: the
CEL in matchConditions (it uses the base language only) and the APIs the components call at run time (RBAC may
grant a resource an older cluster does not serve; the components wait for the ones they need).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.local import binaries

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "hoss"
README = ROOT / "README.md"
CHART_VARIANTS: tuple[tuple[str, ...], ...] = (
    (),
    ("--set", "certificates.mode=cert-manager"),
    ("--set", "redis.bundled=false", "--set", "redis.external.host=redis.example.com",
     "--set", "redis.external.passwordsSecret=hoss-redis-passwords"),
)
"""The chart's values that change which objects it renders: the defaults (a certificate hook, the bundled Redis),
cert-manager's certificates, an external Redis."""

Json = dict[str, Any]

KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "1.0",
    ("v1", "Service"): "1.0",
    ("v1", "ServiceAccount"): "1.0",
    ("v1", "Secret"): "1.0",
    ("v1", "ConfigMap"): "1.2",
    ("batch/v1", "Job"): "1.2",
    ("networking.k8s.io/v1", "NetworkPolicy"): "1.7",
    ("rbac.authorization.k8s.io/v1", "Role"): "1.8",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "1.8",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "1.8",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "1.8",
    ("apps/v1", "Deployment"): "1.9",
    ("apps/v1", "StatefulSet"): "1.9",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "1.16",
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): "1.16",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): "1.16",
    ("policy/v1", "PodDisruptionBudget"): "1.21",
}
"""Each kind, by the API version the manifests write it in: the release that served that version as GA."""

NOT_KUBERNETES = {"cert-manager.io": "cert-manager", "kustomize.config.k8s.io": "kustomize"}
"""API groups whose objects another project defines (the cert-manager component's Issuers and Certificates) or
that never reach the apiserver (kustomizations): no Kubernetes release is needed for them."""

TYPES: dict[str, str] = {
    "Deployment.spec": "DeploymentSpec",
    "StatefulSet.spec": "StatefulSetSpec",
    "Job.spec": "JobSpec",
    "DeploymentSpec.template": "PodTemplateSpec",
    "StatefulSetSpec.template": "PodTemplateSpec",
    "JobSpec.template": "PodTemplateSpec",
    "DeploymentSpec.selector": "LabelSelector",
    "StatefulSetSpec.selector": "LabelSelector",
    "PodTemplateSpec.spec": "PodSpec",
    "PodSpec.containers": "Container",
    "PodSpec.initContainers": "Container",
    "PodSpec.securityContext": "PodSecurityContext",
    "PodSpec.volumes": "Volume",
    "PodSpec.affinity": "Affinity",
    "PodSpec.tolerations": "Toleration",
    "PodSpec.topologySpreadConstraints": "TopologySpreadConstraint",
    "TopologySpreadConstraint.labelSelector": "LabelSelector",
    "Affinity.podAffinity": "PodAffinity",
    "Affinity.podAntiAffinity": "PodAffinity",
    "PodAffinity.preferredDuringSchedulingIgnoredDuringExecution": "WeightedPodAffinityTerm",
    "PodAffinity.requiredDuringSchedulingIgnoredDuringExecution": "PodAffinityTerm",
    "WeightedPodAffinityTerm.podAffinityTerm": "PodAffinityTerm",
    "PodAffinityTerm.labelSelector": "LabelSelector",
    "Container.livenessProbe": "Probe",
    "Container.readinessProbe": "Probe",
    "Container.startupProbe": "Probe",
    "Container.resources": "ResourceRequirements",
    "Container.securityContext": "SecurityContext",
    "Container.volumeMounts": "VolumeMount",
    "Container.env": "EnvVar",
    "Container.envFrom": "EnvFromSource",
    "Container.ports": "ContainerPort",
    "Service.spec": "ServiceSpec",
    "ServiceSpec.ports": "ServicePort",
    "PodDisruptionBudget.spec": "PodDisruptionBudgetSpec",
    "PodDisruptionBudgetSpec.selector": "LabelSelector",
    "NetworkPolicy.spec": "NetworkPolicySpec",
    "NetworkPolicySpec.podSelector": "LabelSelector",
    "NetworkPolicySpec.ingress": "NetworkPolicyIngressRule",
    "NetworkPolicySpec.egress": "NetworkPolicyEgressRule",
    "NetworkPolicyIngressRule.from": "NetworkPolicyPeer",
    "NetworkPolicyIngressRule.ports": "NetworkPolicyPort",
    "NetworkPolicyEgressRule.to": "NetworkPolicyPeer",
    "NetworkPolicyEgressRule.ports": "NetworkPolicyPort",
    "NetworkPolicyPeer.podSelector": "LabelSelector",
    "NetworkPolicyPeer.namespaceSelector": "LabelSelector",
    "Role.rules": "PolicyRule",
    "ClusterRole.rules": "PolicyRule",
    "RoleBinding.subjects": "Subject",
    "ClusterRoleBinding.subjects": "Subject",
    "RoleBinding.roleRef": "RoleRef",
    "ClusterRoleBinding.roleRef": "RoleRef",
    "ValidatingWebhookConfiguration.webhooks": "ValidatingWebhook",
    "MutatingWebhookConfiguration.webhooks": "MutatingWebhook",
    **{f"{webhook}.{field}": type_name for webhook in ("ValidatingWebhook", "MutatingWebhook")
       for field, type_name in (("clientConfig", "WebhookClientConfig"), ("rules", "RuleWithOperations"),
                                ("namespaceSelector", "LabelSelector"), ("objectSelector", "LabelSelector"),
                                ("matchConditions", "MatchCondition"))},
    "CustomResourceDefinition.spec": "CustomResourceDefinitionSpec",
    "CustomResourceDefinitionSpec.names": "CustomResourceDefinitionNames",
    "CustomResourceDefinitionSpec.versions": "CustomResourceDefinitionVersion",
    "CustomResourceDefinitionVersion.schema": "CustomResourceValidation",
    "CustomResourceDefinitionVersion.additionalPrinterColumns": "CustomResourceColumnDefinition",
    "CustomResourceValidation.openAPIV3Schema": "JSONSchemaProps",
    **{f"JSONSchemaProps.{field}": "JSONSchemaProps"
       for field in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf")},
}
"""The API type of a field's value, where the type is shared (a pod template, a label selector) or recursive (a
CRD's schema); other nested fields are named by their path (`DeploymentSpec.strategy.rollingUpdate`)."""

FREE_KEYS = frozenset({
    "ObjectMeta.labels", "ObjectMeta.annotations", "LabelSelector.matchLabels", "PodSpec.nodeSelector",
    "ServiceSpec.selector", "ResourceRequirements.limits", "ResourceRequirements.requests", "ConfigMap.data",
    "ConfigMap.binaryData", "Secret.data", "Secret.stringData", "JSONSchemaProps.default",
})
"""Fields whose keys are the user's (labels, resource names, data) rather than the API's."""
MAP_VALUES = {"JSONSchemaProps.properties": "JSONSchemaProps"}
"""Fields whose keys are the user's and whose values have an API type."""


def _fields(release: str, by_type: dict[str, str]) -> dict[str, str]:
    return {f"{type_name}.{name}": release for type_name, names in by_type.items() for name in names.split()}


BASELINE = "1.21"
FIELDS: dict[str, str] = {
    # Generally available in 1.21 (the release of policy/v1, the newest API version among the kinds) or earlier.
    **_fields(BASELINE, {
        "ObjectMeta": "name namespace labels annotations",
        "LabelSelector": "matchLabels matchExpressions matchExpressions.key matchExpressions.operator "
                         "matchExpressions.values",
        "Namespace": "metadata",
        "ServiceAccount": "metadata",
        "ConfigMap": "metadata data",
        "Secret": "metadata type data stringData",
        "Service": "metadata spec",
        "ServiceSpec": "clusterIP selector ports",
        "ServicePort": "name port targetPort protocol",
        "Deployment": "metadata spec",
        "DeploymentSpec": "replicas selector template strategy strategy.type strategy.rollingUpdate "
                          "strategy.rollingUpdate.maxSurge strategy.rollingUpdate.maxUnavailable",
        "StatefulSet": "metadata spec",
        "StatefulSetSpec": "replicas selector serviceName template",
        "Job": "metadata spec",
        "JobSpec": "backoffLimit template",
        "PodTemplateSpec": "metadata spec",
        "PodSpec": "containers initContainers volumes restartPolicy serviceAccountName automountServiceAccountToken "
                   "nodeSelector tolerations affinity securityContext enableServiceLinks priorityClassName "
                   "topologySpreadConstraints",
        "PodSecurityContext": "runAsUser runAsGroup runAsNonRoot fsGroup seccompProfile seccompProfile.type",
        "Container": "name image imagePullPolicy command args env envFrom ports resources volumeMounts "
                     "livenessProbe readinessProbe startupProbe lifecycle lifecycle.preStop lifecycle.preStop.exec "
                     "lifecycle.preStop.exec.command securityContext",
        "ContainerPort": "name containerPort protocol",
        "EnvVar": "name value valueFrom valueFrom.fieldRef valueFrom.fieldRef.apiVersion valueFrom.fieldRef.fieldPath "
                  "valueFrom.secretKeyRef valueFrom.secretKeyRef.name valueFrom.secretKeyRef.key",
        "EnvFromSource": "configMapRef configMapRef.name secretRef secretRef.name",
        "ResourceRequirements": "requests limits",
        "SecurityContext": "allowPrivilegeEscalation readOnlyRootFilesystem runAsNonRoot runAsUser runAsGroup "
                           "capabilities capabilities.drop",
        "Probe": "httpGet httpGet.path httpGet.port httpGet.scheme tcpSocket tcpSocket.port exec exec.command "
                 "initialDelaySeconds periodSeconds timeoutSeconds failureThreshold successThreshold",
        "VolumeMount": "name mountPath readOnly subPath",
        "Volume": "name configMap configMap.name secret secret.secretName secret.defaultMode emptyDir",
        "Affinity": "podAffinity podAntiAffinity",
        "PodAffinity": "preferredDuringSchedulingIgnoredDuringExecution requiredDuringSchedulingIgnoredDuringExecution",
        "WeightedPodAffinityTerm": "weight podAffinityTerm",
        "PodAffinityTerm": "labelSelector topologyKey",
        "Toleration": "key operator value effect",
        "TopologySpreadConstraint": "maxSkew topologyKey whenUnsatisfiable labelSelector",
        "PodDisruptionBudget": "metadata spec",
        "PodDisruptionBudgetSpec": "minAvailable maxUnavailable selector",
        "NetworkPolicy": "metadata spec",
        "NetworkPolicySpec": "podSelector policyTypes ingress egress",
        "NetworkPolicyIngressRule": "from ports",
        "NetworkPolicyEgressRule": "to ports",
        "NetworkPolicyPeer": "podSelector namespaceSelector ipBlock ipBlock.cidr",
        "NetworkPolicyPort": "port protocol",
        "Role": "metadata rules",
        "ClusterRole": "metadata rules",
        "RoleBinding": "metadata roleRef subjects",
        "ClusterRoleBinding": "metadata roleRef subjects",
        "PolicyRule": "apiGroups resources resourceNames verbs",
        "RoleRef": "apiGroup kind name",
        "Subject": "kind name namespace",
        "ValidatingWebhookConfiguration": "metadata webhooks",
        "MutatingWebhookConfiguration": "metadata webhooks",
        "ValidatingWebhook": "name clientConfig rules failurePolicy matchPolicy namespaceSelector objectSelector "
                             "sideEffects timeoutSeconds admissionReviewVersions",
        "MutatingWebhook": "name clientConfig rules failurePolicy matchPolicy namespaceSelector objectSelector "
                           "sideEffects timeoutSeconds admissionReviewVersions reinvocationPolicy",
        "WebhookClientConfig": "caBundle url service service.name service.namespace service.path service.port",
        "RuleWithOperations": "apiGroups apiVersions operations resources scope",
        "CustomResourceDefinition": "metadata spec",
        "CustomResourceDefinitionSpec": "group names scope versions",
        "CustomResourceDefinitionNames": "kind listKind plural singular shortNames categories",
        "CustomResourceDefinitionVersion": "name served storage schema subresources subresources.status "
                                           "additionalPrinterColumns",
        "CustomResourceColumnDefinition": "name type jsonPath description priority",
        "CustomResourceValidation": "openAPIV3Schema",
        "JSONSchemaProps": "type description properties required items additionalProperties enum format pattern "
                           "minimum maximum minItems maxItems minLength maxLength nullable default anyOf allOf "
                           "oneOf not x-kubernetes-preserve-unknown-fields x-kubernetes-int-or-string",
    }),
    # LocalStorageCapacityIsolation: an emptyDir's sizeLimit, GA in 1.25.
    "Volume.emptyDir.sizeLimit": "1.25",
    # AdmissionWebhookMatchConditions: GA in 1.30.
    **_fields("1.30", {"ValidatingWebhook": "matchConditions", "MutatingWebhook": "matchConditions",
                       "MatchCondition": "name expression"}),
}
"""Each field, by its API type: the release that made it generally available."""

WEBHOOK_RESOURCES = {"pods": "1.0", "pods/binding": "1.0", "bindings": "1.0"}
"""Core resources the webhook rules match, and the release that serves them."""
OPTIONAL_WEBHOOK_RESOURCES = {"pods/resize": "1.33", "resourceclaims/status": "1.34"}
"""Resources a webhook rule matches where they exist: the resize subresource (InPlacePodVerticalScaling, on by
default from 1.33) and ResourceClaims' status (resource.k8s.io/v1, GA in 1.34). Before that release the rule
matches nothing and the rest works."""


def release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class Use:
    """One thing a manifest uses: a kind (``apiVersion kind``), a field (``Type.field``) or a webhook rule's
    resource (``webhook rule: resource``), and where."""

    thing: str
    where: str


def uses_of(obj: Json, *, where: str) -> Iterator[Use]:
    """The kind, every field and every webhook rule resource ``obj`` uses."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    here = f"{where}: {kind} {obj.get('metadata', {}).get('name', '')}".rstrip()
    yield Use(f"{api_version} {kind}", here)
    for field in sorted(_walk(kind, {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")})):
        yield Use(field, here)
    for webhook in obj.get("webhooks", []) if kind.endswith("WebhookConfiguration") else []:
        for rule in webhook.get("rules", []):
            for resource in rule.get("resources", []):
                yield Use(f"webhook rule: {resource}", f"{here} {webhook.get('name', '')}")


def _walk(type_name: str, node: object) -> set[str]:
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _walk(type_name, item)
    elif isinstance(node, dict):
        for key, value in node.items():
            field = f"{type_name}.{key}"
            found.add(field)
            if field in FREE_KEYS:
                continue
            if field in MAP_VALUES:
                for item in value.values():
                    found |= _walk(MAP_VALUES[field], item)
                continue
            found |= _walk("ObjectMeta" if key == "metadata" else TYPES.get(field, field), value)
    return found


def needed_release(use: Use) -> str | None:
    """The release ``use`` needs, or None when the tables do not know it."""
    if " " in use.thing and not use.thing.startswith("webhook rule: "):
        api_version, kind = use.thing.split(" ", 1)
        return KINDS.get((api_version, kind))
    if use.thing.startswith("webhook rule: "):
        resource = use.thing.removeprefix("webhook rule: ")
        return WEBHOOK_RESOURCES.get(resource) or ("optional" if resource in OPTIONAL_WEBHOOK_RESOURCES else None)
    return FIELDS.get(use.thing)


def floor(uses: Iterable[Use]) -> tuple[str, list[str]]:
    """The newest release the uses need, and what needs it; AssertionError naming anything the tables lack."""
    uses = list(uses)
    unknown = sorted({f"{u.thing} ({u.where})" for u in uses if needed_release(u) is None})
    assert not unknown, ("not in the tables of tests/unit/test_kubernetes_floor.py; add each with the release "
                         "that made it generally available:\n  " + "\n  ".join(unknown))
    needed = {u.thing: v for u in uses if (v := needed_release(u)) not in (None, "optional")}
    newest = max(needed.values(), key=release)
    return newest, sorted(thing for thing, v in needed.items() if v == newest)


def _is_object(doc: object) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc


def manifest_objects() -> Iterator[tuple[Json, str]]:
    """Every object in deploy/ (outside the chart), with its file; a kustomization's inline patches count as
    objects, its own document does not (kustomize reads it, the apiserver never sees it)."""
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if CHART in path.parents:
            continue
        where = str(path.relative_to(ROOT))
        for doc in yaml.safe_load_all(path.read_text()):
            if not _is_object(doc):
                continue  # not a Kubernetes object (e.g. Prometheus's rule file)
            if doc["apiVersion"].split("/")[0] == "kustomize.config.k8s.io":
                for patch in doc.get("patches", []):
                    yield from ((p, f"{where} (patch)") for p in yaml.safe_load_all(patch.get("patch", ""))
                                if _is_object(p))
                continue
            yield doc, where


def chart_objects() -> Iterator[tuple[Json, str]]:
    """Every object the chart renders, for each of `CHART_VARIANTS`."""
    helm = binaries.require("helm")
    for variant in CHART_VARIANTS:
        rendered = subprocess.run([str(helm), "template", "hoss", str(CHART), "--namespace", "hoss-system",
                                   *variant], capture_output=True, text=True, check=False)
        assert rendered.returncode == 0, f"helm template {' '.join(variant)} failed: {rendered.stderr}"
        where = f"helm template {' '.join(variant)}".rstrip()
        yield from ((doc, where) for doc in yaml.safe_load_all(rendered.stdout) if _is_object(doc))


def all_uses() -> list[Use]:
    objects = [*manifest_objects(), *(chart_objects() if CHART.exists() else ())]
    return [use for obj, where in objects
            if obj["apiVersion"].split("/")[0] not in NOT_KUBERNETES
            for use in uses_of(obj, where=where)]


@pytest.fixture(scope="module")
def uses() -> list[Use]:
    return all_uses()


def readme_floors() -> list[str]:
    return re.findall(r"Kubernetes (\d+\.\d+) or later", README.read_text())


def readme_paragraph(version: str) -> str:
    return next(p for p in README.read_text().split("\n\n") if f"Kubernetes {version} or later" in p)


# --- the derivation ---------------------------------------------------------------------------------------------


def webhook_configuration(**webhook: Any) -> Json:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "w"}, "webhooks": [{"name": "w.example.com", "sideEffects": "None", **webhook}]}


def test_a_webhook_with_match_conditions_needs_1_30_and_one_without_needs_less() -> None:
    plain = webhook_configuration(rules=[{"resources": ["pods/binding"]}])
    conditioned = webhook_configuration(matchConditions=[{"name": "c", "expression": "true"}])
    assert floor(uses_of(plain, where="test"))[0] == BASELINE
    assert floor(uses_of(conditioned, where="test")) == ("1.30", ["MatchCondition.expression", "MatchCondition.name",
                                                                  "ValidatingWebhook.matchConditions"])


def test_a_field_the_tables_do_not_know_fails_the_derivation_naming_it() -> None:
    pod_template = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                    "spec": {"template": {"spec": {"containers": [{"name": "c", "resizePolicy": []}]}}}}
    with pytest.raises(AssertionError, match=r"Container\.resizePolicy \(test: Deployment d\)"):
        floor(uses_of(pod_template, where="test"))


def test_an_optional_webhook_rule_resource_does_not_raise_the_floor() -> None:
    resize = webhook_configuration(rules=[{"resources": ["pods/resize"]}])
    assert floor(uses_of(resize, where="test"))[0] == BASELINE


# --- the manifests ----------------------------------------------------------------------------------------------


def test_the_readme_states_the_release_the_manifests_need_and_why(uses: list[Use]) -> None:
    newest, needing = floor(uses)
    assert readme_floors() and set(readme_floors()) == {newest}, (
        f"the manifests need Kubernetes {newest} (for {', '.join(needing)}); the README says "
        f"{', '.join(readme_floors()) or 'nothing'}")
    paragraph = readme_paragraph(newest)
    for thing in needing:
        if not thing.startswith(("MatchCondition.", "webhook rule: ")):
            assert thing.rsplit(".", 1)[1] in paragraph, f"the README does not say that {thing} needs {newest}"


def test_what_the_manifests_name_without_needing_it_is_in_the_readme_with_its_release(uses: list[Use]) -> None:
    named = {u.thing.removeprefix("webhook rule: ") for u in uses if needed_release(u) == "optional"}
    assert named, "no optional resource is named any more: remove it from OPTIONAL_WEBHOOK_RESOURCES"
    paragraph = readme_paragraph(floor(uses)[0])
    for resource in named:
        assert resource in paragraph and OPTIONAL_WEBHOOK_RESOURCES[resource] in paragraph, (
            f"the README does not say that the rule for {resource} applies from "
            f"{OPTIONAL_WEBHOOK_RESOURCES[resource]}")


def test_the_chart_asks_for_the_release_the_manifests_need(uses: list[Use]) -> None:
    if not CHART.exists():
        pytest.fail("deploy/helm/hoss is gone: remove this test", pytrace=False)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">= {floor(uses)[0]}.0-0"
