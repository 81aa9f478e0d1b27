"""``hoss why <namespace>/<pod>``: why a pod waits, node by node, and where it would go; ``--what-if FILE`` for a pod
not yet created. The I/O shell: it reads what a worker and the dispatcher would know, and `deploy.explanation`
decides and renders.

Read-only. From the apiserver: the pod (or the manifest), the namespaces' labels (namespaceSelectors), the Services
of the pod's namespace and its controller (the default spread selector, `dispatcher.spreading`), and for a gang
member its gang's pods and PodGroup. From the ledger: the node table a worker loads (`NodeFeed.load`), the
rescheduler's holds, the elastic quotas, and the live workers. Each read is one request; nothing is watched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml
from redis.asyncio import Redis

from deploy.explanation import SCHEDULER_NAME, Facts, GangFacts, Report, explain, render_table, to_json
from dispatcher.gangs import (
    PLUGINS_API,
    VOLCANO_API,
    GangKey,
    PodGroupSpec,
    gang_state,
    member_selector,
    parse_podgroup,
    raw_gang_of,
    short_of_min_resources,
    task_of,
)
from dispatcher.intake import namespace_labels
from dispatcher.podgroup_specs import parse_volcano_podgroup, parse_workload_podgroup
from dispatcher.routing import policy_of
from dispatcher.spreading import KINDS, SelectorSources, controller_of
from hoss.errors import HossError
from hoss.framework.errors import ProfileError
from hoss.framework.feed import NodeFeed
from hoss.framework.nodes import NodeTable
from hoss.framework.profiles import load_profiles
from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.ledger.client import Ledger
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resourceclaims import DEVICES, DeviceCatalog, device_context
from hoss.model.resources import pod_requests
from hoss.model.storage import STORAGE, StorageCatalog, storage_context
from hoss.queue import WorkQueue

WHAT_IF_UID = "what-if"
"""The uid a manifest without one is explained under."""
TERMINAL_PHASES = ("Succeeded", "Failed")
_CONTROLLER_PATHS = {
    "rs": "/apis/apps/v1/namespaces/{namespace}/replicasets/{name}",
    "ss": "/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}",
    "rc": "/api/v1/namespaces/{namespace}/replicationcontrollers/{name}",
}
assert set(_CONTROLLER_PATHS) == set(KINDS.values())
PODGROUP_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/{name}"
PODGROUP_PATHS = {PLUGINS_API: (PODGROUP_PATH, parse_podgroup),
                  VOLCANO_API: ("/apis/scheduling.volcano.sh/v1beta1/namespaces/{namespace}/podgroups/{name}",
                                parse_volcano_podgroup),
                  "scheduling.k8s.io": ("/apis/scheduling.k8s.io/v1alpha2/namespaces/{namespace}/podgroups/{name}",
                                        parse_workload_podgroup)}


class WhyError(HossError):
    """The pod cannot be explained: not found, a bad manifest or policies file, a ledger not ready."""


def target_of(text: str) -> tuple[str, str]:
    """``namespace/name`` (or ``name``, in ``default``) -> (namespace, name); raises `WhyError`."""
    namespace, _, name = text.rpartition("/")
    if not name or "/" in namespace:
        raise WhyError(f"expected <namespace>/<pod>, got {text!r}")
    return namespace or "default", name


def read_manifest(path: Path) -> Json:
    """A Pod manifest (YAML or JSON, one document) as the apiserver would hold it before scheduling: a uid and
    namespace filled in when missing; raises `WhyError` naming what is wrong."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise WhyError(f"cannot read the manifest {path}: {error}") from error
    if not isinstance(document, dict) or document.get("kind", "Pod") != "Pod":
        kind = document.get("kind") if isinstance(document, dict) else type(document).__name__
        raise WhyError(f"{path}: expected one Pod manifest, got {kind}")
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str) or not metadata["name"]:
        raise WhyError(f"{path}: metadata.name is required")
    metadata.setdefault("namespace", "default")
    metadata.setdefault("uid", WHAT_IF_UID)
    if not isinstance(document.get("spec"), dict):
        raise WhyError(f"{path}: spec is required")
    return document


async def why(*, kubeconfig: str, redis_url: str, policies_file: str, target: str | None = None,
              manifest: Path | None = None, top: int = 5) -> Report:
    """The answer for the pod `target` (``namespace/name``) or the Pod in `manifest`."""
    try:
        profiles, default_profile = load_profiles(policies_file)
    except ProfileError as error:
        raise WhyError(str(error)) from error
    rest = await KubeREST.connect(kubeconfig)
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        if manifest is not None:
            raw = read_manifest(manifest)
        else:
            if target is None:
                raise WhyError("name a pod (<namespace>/<pod>) or give --what-if FILE")
            namespace, name = target_of(target)
            raw = await _get(rest, f"/api/v1/namespaces/{namespace}/pods/{name}", what=f"pod {namespace}/{name}")
            if raw is None:
                raise WhyError(f"pod {namespace}/{name} not found")
        namespace = str(raw["metadata"].get("namespace") or "default")
        namespaces = await _namespaces(rest)
        sources = await _sources(rest, namespace, [raw])
        storage = await _storage(rest, namespace) if compact.claim_names(raw) else None
        devices = await _devices(rest) if _has_resource_claims(raw) else None
        form = _form(raw, namespaces, sources, storage, devices)
        gang = await _gang(rest, raw, form, namespaces, sources)
        ledger = Ledger(redis)
        table = NodeTable()
        feed = NodeFeed(ledger, table)
        if not await feed.load():
            raise WhyError("the ledger is not ready (not rebuilt since Redis started): the resolver's sync rebuilds it")
        policy = policy_of(raw, default=default_profile)
        live, _gone = await WorkQueue(redis).workers()
        try:
            request = pod_requests(raw)
        except HossError:
            request = {}  # explain() reports the malformed pod
        status = raw.get("status") if isinstance(raw.get("status"), dict) else {}
        assert isinstance(status, dict)
        facts = Facts(
            table=table,
            held=feed.held_nodes(str(raw["metadata"].get("uid") or ""), compact.controller_uid(raw), request),
            quotas=await ledger.quotas(),
            workers=sorted(w.id for w in live if w.serves(policy)),
            gang=gang,
            condition=_unschedulable(status),
            nominated=str(status.get("nominatedNodeName") or ""),
            phase="" if manifest is not None else str(status.get("phase") or ""),
            what_if=manifest is not None,
        )
        return explain(form, profiles=profiles, default_profile=default_profile, facts=facts, top=top)
    except (KubeError, OSError, TimeoutError) as error:
        raise WhyError(f"cannot read the cluster: {error}") from error
    finally:
        await rest.close()
        await redis.aclose()


async def run(*, kubeconfig: str, redis_url: str, policies_file: str, target: str | None, manifest: Path | None,
              as_json: bool, each_node: bool = False, top: int = 5) -> str:
    """The text `hoss why` prints: the table, or the JSON object."""
    report = await why(kubeconfig=kubeconfig, redis_url=redis_url, policies_file=policies_file, target=target,
                       manifest=manifest, top=top)
    if as_json:
        return orjson.dumps(to_json(report), option=orjson.OPT_INDENT_2).decode()
    return render_table(report, each_node=each_node)


def _form(raw: Json, namespaces: Mapping[str, Mapping[str, str]], sources: SelectorSources,
          storage: StorageCatalog | None = None, devices: DeviceCatalog | None = None) -> Json:
    """The pod as the dispatcher sends it to a worker (`dispatcher.intake`): compact, with the namespaces'
    context, the default spread selector, what its claims need (`storage`) and what its ResourceClaims need
    (`devices`), through the same encoding."""
    spec = raw.get("spec") if isinstance(raw.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    default_spread = None if spec.get("topologySpreadConstraints") else sources.default_selector(raw)
    form = compact.compact_pod(raw, namespaces=namespaces, default_spread=default_spread)
    if storage is not None and (needs := storage_context(form, storage)) is not None:
        form[STORAGE] = needs
    if devices is not None and (wanted := device_context(form, devices)) is not None:
        form[DEVICES] = wanted
    return compact.decode(compact.encode(form))


def _has_resource_claims(raw: Mapping[str, Any]) -> bool:
    """Whether the pod has ResourceClaims, or asks an extended resource (one a DeviceClass may serve)."""
    spec = raw.get("spec")
    if not isinstance(spec, dict):
        return False
    if spec.get("resourceClaims"):
        return True
    try:
        return any("/" in resource for resource in pod_requests(raw))
    except HossError:
        return False


async def _devices(rest: KubeREST) -> DeviceCatalog:
    """The DRA objects a pod with ResourceClaims reads, as the dispatcher's watches keep them."""
    catalog = DeviceCatalog()
    paths = {"claims": "/apis/resource.k8s.io/v1/resourceclaims",
             "slices": "/apis/resource.k8s.io/v1/resourceslices",
             "classes": "/apis/resource.k8s.io/v1/deviceclasses"}
    for kind, path in paths.items():
        listed = await rest.request("GET", path)
        catalog.replace(kind, list(listed.get("items") or []))
    return catalog


async def _storage(rest: KubeREST, namespace: str) -> StorageCatalog:
    """The storage objects a pod of `namespace` with claims reads, as the dispatcher's watches keep them (the claims
    of every namespace: NodeVolumeLimits counts those of the pods on each node)."""
    catalog = StorageCatalog()
    paths = {"claims": "/api/v1/persistentvolumeclaims",
             "volumes": "/api/v1/persistentvolumes",
             "classes": "/apis/storage.k8s.io/v1/storageclasses",
             "drivers": "/apis/storage.k8s.io/v1/csidrivers",
             "capacities": "/apis/storage.k8s.io/v1/csistoragecapacities",
             "csinodes": "/apis/storage.k8s.io/v1/csinodes",
             "attachments": "/apis/storage.k8s.io/v1/volumeattachments"}
    for kind, path in paths.items():
        listed = await rest.request("GET", path)
        catalog.replace(kind, list(listed.get("items") or []))
    return catalog


async def _gang(rest: KubeREST, raw: Json, form: Json, namespaces: Mapping[str, Mapping[str, str]],
                sources: SelectorSources) -> GangFacts | None:
    """The pod's gang as the dispatcher counts it (`dispatcher.gangs.gang_state`), with its pending members."""
    metadata = raw["metadata"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    key = raw_gang_of({**raw, "metadata": {**metadata, "namespace": metadata.get("namespace") or "default"}})
    if key is None:
        return None
    selector = member_selector(labels, annotations)
    listed = await rest.request("GET", f"/api/v1/namespaces/{key.namespace}/pods",
                                params={"labelSelector": selector} if selector else None)
    uid = metadata.get("uid")
    pending: list[Json] = []
    bound = 0
    for pod in listed.get("items") or []:
        pod_meta = pod.get("metadata") or {}
        pod_spec = pod.get("spec") or {}
        if pod_meta.get("uid") == uid or pod_meta.get("deletionTimestamp") \
                or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES \
                or raw_gang_of(pod) != key:
            continue
        if pod_spec.get("nodeName"):
            bound += 1
        elif pod_spec.get("schedulerName") == SCHEDULER_NAME:
            pending.append(pod)
    podgroups: dict[GangKey, PodGroupSpec] = {}
    if key.needs_object or "scheduling.x-k8s.io/pod-group" in labels:
        path, parse = PODGROUP_PATHS[key.api]
        group = await _get(rest, path.format(namespace=key.namespace, name=key.name), what=f"PodGroup {key}")
        parsed = parse(group) if group is not None else None
        if parsed is not None:
            podgroups[parsed[0]] = parsed[1]
    members = [raw, *sorted(pending, key=lambda p: str((p.get("metadata") or {}).get("name")))]
    more_sources = await _sources(rest, key.namespace, pending, known=sources)
    state = gang_state(key, [(m.get("metadata") or {}).get("labels") or {} for m in members],
                       podgroups=podgroups, bound=bound,
                       member_tasks=[task_of((m.get("metadata") or {}).get("annotations") or {}) for m in members])
    storage = await _storage(rest, key.namespace) if any(compact.claim_names(m) for m in members[1:]) else None
    devices = await _devices(rest) if any(_has_resource_claims(m) for m in members[1:]) else None
    forms = [form, *(_form(member, namespaces, more_sources, storage, devices) for member in members[1:])]
    short = short_of_min_resources(podgroups.get(key), members) if state.ready and not bound else ""
    if short:  # the dispatcher holds such a gang back, naming the field (dispatcher/gangbook.py)
        state = dataclasses.replace(state, refusal=short)
    return GangFacts(state=state, members=forms)


async def _namespaces(rest: KubeREST) -> dict[str, dict[str, str]]:
    listed = await rest.request("GET", "/api/v1/namespaces")
    found = {}
    for item in listed.get("items") or []:
        parsed = namespace_labels(item)
        if parsed is not None:
            found[parsed[0]] = parsed[1]
    return found


async def _sources(rest: KubeREST, namespace: str, pods: Sequence[Json],
                   known: SelectorSources | None = None) -> SelectorSources:
    """The selectors of the Services of `namespace` and of the controllers of `pods` (the default spread)."""
    sources = known or SelectorSources()
    if known is None:
        services = await rest.request("GET", f"/api/v1/namespaces/{namespace}/services")
        sources.replace("service", list(services.get("items") or []))
    for pod in pods:
        owner = controller_of(pod.get("metadata") or {})
        if owner is None or (owner[0], namespace, owner[1]) in sources.controllers:
            continue
        controller = await _get(rest, _CONTROLLER_PATHS[owner[0]].format(namespace=namespace, name=owner[1]),
                                what=f"the controller of {namespace}/{owner[1]}")
        if controller is not None:
            sources.apply(owner[0], "ADDED", controller)
    return sources


async def _get(rest: KubeREST, path: str, *, what: str) -> Any:
    """The object at `path`, or None when it does not exist."""
    try:
        return await rest.request("GET", path)
    except KubeError as error:
        if error.status == 404:
            return None
        raise WhyError(f"cannot read {what}: {error}") from error


def _unschedulable(status: Mapping[str, Any]) -> tuple[str, str] | None:
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled" \
                and condition.get("status") == "False":
            return str(condition.get("reason") or ""), str(condition.get("message") or "")
    return None
