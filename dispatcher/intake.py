"""Pending pods as the dispatcher sees them: parse a raw pod once, order pods, and turn them into work items."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.routing import policy_of
from dispatcher.spreading import SelectorSources
from hoss.errors import PodSpecError
from hoss.model import compact
from hoss.model.objects import Json, section
from hoss.model.resourceclaims import DEVICES, DeviceCatalog, device_context
from hoss.model.storage import STORAGE, StorageCatalog, storage_context
from hoss.queue import WorkItem

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PendingPod:
    """An unbound pod the dispatcher must place."""

    uid: str
    namespace: str
    name: str
    policy: str
    seen_at: float
    """Monotonic time the dispatcher first saw the pod pending."""
    queued_unix: float = 0.0
    """Wall-clock time the dispatcher first saw the pod pending without scheduling gates (when its last gate went,
    for a gated pod): its work item carries it, for the worker's end-to-end scheduling duration."""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    created_unix: float | None = None
    """metadata.creationTimestamp as unix time (None when absent or unreadable); for /status."""
    unschedulable_reason: str | None = None
    """Reason of the pod's PodScheduled=False condition, if it has one; for /status."""
    unschedulable_message: str | None = None
    """Message of the pod's PodScheduled=False condition, if it has one; for /status."""
    compact: str = ""
    """The pod's compact form (JSON, `hoss.model.compact`): what its work item carries to the worker."""
    digest: str = ""
    """The version of `compact` (blind to its resourceVersion: a status write makes none); a change while the pod
    is queued sends the new version after the old."""
    priority: int = 0
    """spec.priority: higher is dispatched first (then the oldest), as kube-scheduler's PrioritySort orders."""
    owner_references: tuple[Json, ...] = ()
    """metadata.ownerReferences that are controllers (Reservation owners may name the controller)."""
    scheduling_group: str | None = None
    """spec.schedulingGroup.podGroupName: the Kubernetes PodGroup (scheduling.k8s.io/v1alpha2) of its gang."""
    gated: bool = False
    """spec.schedulingGates is not empty: never dispatched (the apiserver set PodScheduled=False, reason
    SchedulingGated); the MODIFIED event that removes the last gate dispatches it at once."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _required_text(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise PodSpecError(field=field, reason=f"expected a non-empty string, got {value!r}")
    return value


def _string_map(value: object, *, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise PodSpecError(field=field, reason="expected a map of strings")
    return dict(value)


def pod_uid(raw: Json) -> str:
    """The uid of a raw pod; raises `PodSpecError` when it has none."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict):
        raise PodSpecError(field="metadata", reason="missing")
    return _required_text(metadata.get("uid"), field="metadata.uid")


def _created_unix(metadata: Json) -> float | None:
    value = metadata.get("creationTimestamp")
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _unschedulable(status: Json) -> tuple[str | None, str | None]:
    """Reason and message of the PodScheduled=False condition (informational: a malformed one reads as absent)."""
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled" \
                and condition.get("status") == "False":
            reason, message = condition.get("reason"), condition.get("message")
            return (reason if isinstance(reason, str) and reason else None,
                    message if isinstance(message, str) and message else None)
    return None, None


def _scheduling_group(spec: Json) -> str | None:
    group = spec.get("schedulingGroup")
    if group is None:
        return None
    name = group.get("podGroupName") if isinstance(group, dict) else None
    if not isinstance(name, str) or not name:
        raise PodSpecError(field="spec.schedulingGroup.podGroupName",
                           reason=f"expected the name of a PodGroup, got {group!r}")
    return name


def parse_pending_pod(
    raw: Json, *, scheduler_names: Collection[str], default_policy: str, seen_at: float, queued_unix: float = 0.0,
    namespaces: Mapping[str, Mapping[str, str]] | None = None, sources: SelectorSources | None = None,
    storage: StorageCatalog | None = None, devices: DeviceCatalog | None = None,
) -> PendingPod | None:
    """The pod when the dispatcher should place it (one of our scheduler names, unbound, not being deleted, not
    finished), else None. Raises `PodSpecError` naming the field of a malformed pod. `namespaces` (labels by
    namespace) resolve the pod's namespaceSelectors into its compact form; `sources` give it the selector of the
    cluster-default spread constraints (`dispatcher.spreading`); `storage` (the storage objects) what its volume
    claims need (`hoss.model.storage.storage_context`); `devices` (the DRA objects) what its ResourceClaims need
    (`hoss.model.resourceclaims.device_context`)."""
    uid = pod_uid(raw)
    metadata: Json = raw["metadata"]
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    if not isinstance(spec, dict):
        raise PodSpecError(field="spec", reason="expected an object")
    if not isinstance(status, dict):
        raise PodSpecError(field="status", reason="expected an object")
    if spec.get("schedulerName", "default-scheduler") not in scheduler_names:
        return None
    if spec.get("nodeName") or metadata.get("deletionTimestamp") or status.get("phase") in TERMINAL_PHASES:
        return None
    unschedulable = _unschedulable(status)
    default_spread = sources.default_selector(raw) if sources is not None \
        and not spec.get("topologySpreadConstraints") else None
    form = compact.compact_pod(raw, namespaces=namespaces, default_spread=default_spread)
    if storage is not None and (needs := storage_context(form, storage)) is not None:
        form[STORAGE] = needs
    if devices is not None and (wanted := device_context(form, devices)) is not None:
        form[DEVICES] = wanted
    priority = spec.get("priority")
    return PendingPod(
        uid=uid,
        namespace=_required_text(metadata.get("namespace"), field="metadata.namespace"),
        name=_required_text(metadata.get("name"), field="metadata.name"),
        policy=policy_of(raw, default=default_policy),
        seen_at=seen_at,
        queued_unix=queued_unix,
        labels=_string_map(metadata.get("labels"), field="metadata.labels"),
        annotations=_string_map(metadata.get("annotations"), field="metadata.annotations"),
        created_unix=_created_unix(metadata),
        unschedulable_reason=unschedulable[0],
        unschedulable_message=unschedulable[1],
        compact=compact.encode(form).decode(),
        digest=compact.digest(form),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        gated=bool(spec.get("schedulingGates")),
        scheduling_group=_scheduling_group(spec),
        owner_references=tuple(r for r in references if isinstance(r, dict) and r.get("controller"))
        if isinstance(references := metadata.get("ownerReferences"), list) else (),
    )


def with_namespaces(pod: PendingPod, namespaces: Mapping[str, Mapping[str, str]]) -> PendingPod:
    """`pod` with its compact form's namespace context recomputed from `namespaces` (the same pod when it did not
    change)."""
    form = compact.decode(pod.compact)
    form[compact.NAMESPACES] = compact.namespace_context(form, namespaces)
    updated = compact.digest(form)
    if updated == pod.digest:
        return pod
    return dataclasses.replace(pod, compact=compact.encode(form).decode(), digest=updated)


def with_storage(pod: PendingPod, storage: StorageCatalog) -> PendingPod:
    """`pod` with what its claims need recomputed from `storage` (the same pod when it did not change)."""
    return _with_context(pod, STORAGE, lambda form: storage_context(form, storage))


def with_devices(pod: PendingPod, devices: DeviceCatalog) -> PendingPod:
    """`pod` with what its ResourceClaims need recomputed from `devices` (the same pod when it did not change)."""
    return _with_context(pod, DEVICES, lambda form: device_context(form, devices))


def _with_context(pod: PendingPod, key: str, compute: Callable[[Json], Json | None]) -> PendingPod:
    """`pod` with its compact form's `key` recomputed (the same pod when it did not change or has none)."""
    form = compact.decode(pod.compact)
    needs = compute(form)
    if needs is not None:
        form[key] = needs
    elif form.pop(key, None) is None:
        return pod
    updated = compact.digest(form)
    if updated == pod.digest:
        return pod
    return dataclasses.replace(pod, compact=compact.encode(form).decode(), digest=updated)


def namespace_labels(raw: Json) -> tuple[str, dict[str, str]] | None:
    """A namespace's name and labels, None when it has no name (malformed labels read as none)."""
    metadata = section(raw, "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = metadata.get("labels")
    valid = isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    return name, dict(labels) if valid and isinstance(labels, dict) else {}


def left_by_deletion(raw: Json) -> bool:
    """True when a pod that left the pending set was deleted or finished rather than bound.

    A watch with a field selector reports a pod that stopped matching as DELETED with its *previous* content,
    so a bound pod and an unscheduled pod deleted at once look alike there; both count as gone-after-dispatch.
    """
    metadata = raw.get("metadata") or {}
    status = raw.get("status") or {}
    return bool(metadata.get("deletionTimestamp")) or status.get("phase") in TERMINAL_PHASES


def item_uids(item: WorkItem) -> list[str]:
    """The pod uids an item carries (every gang member, or the one pod), as the queue records them."""
    return [member.uid for member in item.members] or [item.uid]


def plan_work_items(pods: Sequence[PendingPod], *, attempts: Mapping[str, int]) -> list[WorkItem]:
    """The work items for a batch of pods that need a worker, in the order given.

    This is the seam for gangs: members of one pod group will become one item here (``gang``, ``members``,
    ``min_available``). Until then every pod is its own item.
    """
    return [single_item(pod, attempt=attempts.get(pod.uid, 0)) for pod in pods]


def single_item(pod: PendingPod, *, attempt: int) -> WorkItem:
    """The work item of one pod, carrying its compact form and version."""
    return WorkItem(uid=pod.uid, namespace=pod.namespace, name=pod.name, policy=pod.policy, attempt=attempt,
                    pod=pod.compact, digest=pod.digest, queued_unix=pod.queued_unix)


def oldest_pending_age(pods: Iterable[PendingPod], *, now_unix: float) -> float:
    """Seconds since the oldest of `pods` without scheduling gates was created (first seen, when its creation time is
    unknown); 0 when there is none."""
    since = [pod.created_unix if pod.created_unix is not None else pod.queued_unix for pod in pods if not pod.gated]
    return max(now_unix - min(since), 0.0) if since else 0.0


def dispatch_order(pod: PendingPod) -> tuple[int, float]:
    """Higher priority first, then the pod seen pending first (kube-scheduler's PrioritySort)."""
    return (-pod.priority, pod.seen_at)



def pending_pods_selector(scheduler_names: Sequence[str]) -> str:
    """Unbound pods; with one scheduler name the apiserver filters on it too (a field selector has no 'in')."""
    if len(scheduler_names) == 1:
        return f"spec.nodeName=,spec.schedulerName={scheduler_names[0]}"
    return "spec.nodeName="
