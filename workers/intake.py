"""Work items as a worker reads them: each item's pod(s) parsed once (pods of one shape share a parse)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import orjson

from hoss.errors import HossError
from hoss.framework.errors import UnsupportedPodField
from hoss.framework.pod import PodView, check_supported, parse_pod
from hoss.model import compact
from hoss.model.objects import Json
from hoss.model.resourceclaims import DEVICES
from hoss.model.storage import STORAGE
from hoss.queue import GangMember, WorkItem


@dataclass
class Work:
    """A work item with its pod parsed: ``pod`` (a single pod), ``members`` (a gang) or ``problem``."""

    message_id: str
    item: WorkItem
    pod: PodView | None = None
    raw: Json = field(default_factory=dict)
    members: list[tuple[PodView, Json]] = field(default_factory=list)
    problem: str = ""
    unsupported: bool = False
    """``problem`` names a field hoss does not honour yet: the pod is unschedulable (retried with backoff, so a
    new version of the pod is looked at), not malformed."""
    shape: bytes = b""
    """The pod's namespace, labels and spec as canonical JSON (pods of one shape decide alike)."""
    fetch: bool = False
    """The item carries no pod (queued by a dispatcher older than compact work items): read it once."""


def parse_work(message_id: str, item: WorkItem) -> Work:
    """The item's pod(s) parsed from their compact form; a problem names the bad field. Pure."""
    work = Work(message_id=message_id, item=item)
    if not item.pod and (not item.members or not all(m.pod for m in item.members)):
        work.fetch = True
        return work
    try:
        if item.members:
            for member in item.members:
                raw = compact.decode(member.pod)
                work.members.append((parse_pod(raw), raw))
                check_supported(raw)
        else:
            work.raw = compact.decode(item.pod)
            work.pod, work.shape = _parsed(work.raw)
    except UnsupportedPodField as error:
        work.problem, work.unsupported = str(error), True
    except (HossError, ValueError) as error:
        work.problem = f"hoss cannot schedule this pod: {error}"
    return work


_TEMPLATES: dict[bytes, PodView] = {}


_TEMPLATES_MAX = 4096


def _shape(raw: Json) -> bytes:
    metadata = raw.get("metadata") or {}
    return orjson.dumps(
        [metadata.get("namespace"), metadata.get("labels"), raw.get("spec"), raw.get(compact.NAMESPACES),
         raw.get(compact.DEFAULT_SPREAD), raw.get(STORAGE), raw.get(DEVICES)],
        option=orjson.OPT_SORT_KEYS)


def _parsed(raw: Json) -> tuple[PodView, bytes]:
    """The pod's view and its shape (namespace, labels, spec). Pods of one shape (the replicas of a Job or a
    Deployment) are parsed and checked once: the view of the next is the first's with its own identity (uid, name,
    annotations and resourceVersion)."""
    shape = _shape(raw)
    template = _TEMPLATES.get(shape)
    metadata = raw.get("metadata") or {}
    uid, name, annotations = metadata.get("uid"), metadata.get("name"), metadata.get("annotations") or {}
    version = metadata.get("resourceVersion") or ""
    if template is not None and isinstance(uid, str) and uid and isinstance(name, str) and name \
            and isinstance(annotations, dict) and all(isinstance(v, str) for v in annotations.values()) \
            and isinstance(version, str):
        return dataclasses.replace(template, uid=uid, name=name, annotations=dict(annotations),
                                   resource_version=version), shape
    view = parse_pod(raw)
    check_supported(raw)
    if len(_TEMPLATES) >= _TEMPLATES_MAX:
        _TEMPLATES.clear()
    _TEMPLATES[shape] = view
    return view, shape


def signature(work: Work) -> bytes:
    """What decides a pod's placement apart from its identity: policy and shape (namespace, labels, spec)."""
    return work.item.policy.encode() + b"\0" + (work.shape or _shape(work.raw))


def members_of(item: WorkItem) -> list[GangMember]:
    """The pods of a work item: a gang's members, or the one pod."""
    return list(item.members) or [GangMember(uid=item.uid, namespace=item.namespace, name=item.name)]


def gated(work: Work) -> bool:
    """A pod that still has scheduling gates (sent by a dispatcher that did not hold it back): never placed."""
    pods = [pod for pod, _raw in work.members] or ([work.pod] if work.pod is not None else [])
    return any(pod.scheduling_gates for pod in pods)
