"""PodGroup objects of Kubernetes 1.36 (scheduling.k8s.io/v1alpha2) and Volcano (scheduling.volcano.sh/v1beta1) read
into the gang's `PodGroupSpec`, field by field. Pure.

Every field is either honoured or refused: a refused PodGroup still parses (its members then wait with a message
naming the field and its value, and the group gets a condition saying so), and so does one with a field this module
does not know. Nothing is dropped without a word.

Kubernetes' PodGroup (the types of k8s.io/api scheduling/v1alpha2, which kube-scheduler 1.36's GangScheduling
plugin reads):
- ``schedulingPolicy.gang.minCount``: honoured (all-or-nothing, members bound count); ``schedulingPolicy.basic``:
  members placed one by one, as kube-scheduler does;
- ``podGroupTemplateRef``: informational (the Workload it was made from);
- ``priorityClassName``, ``priority`` (the apiserver's Priority admission resolves one into the other, 0 without
  a class): accepted, but hoss orders and preempts a gang by its members' own ``spec.priority``, where
  kube-scheduler 1.36's workload-aware preemption takes the PodGroup's; the two agree when the PodGroup and its
  pods name the same PriorityClass (a known difference, not checked);
- ``disruptionMode``: ``PodGroup`` honoured (a running gang is a preemption victim whole, workers/victims.py);
  ``Pod`` (the default) accepted, but hoss evicts such a gang whole too, where kube-scheduler 1.36 takes its members
  as victims one by one (a known difference: hoss never leaves part of a gang running);
- ``schedulingConstraints.topology``: one entry with a key, honoured as a hard tier (the gang goes within one
  domain of that node label, the domain of members bound already if any; workers/gang.py); more entries refused;
- ``resourceClaims``: refused.

Volcano's PodGroup:
- ``minMember``, ``minTaskMember`` (by the pods' ``volcano.sh/task-spec`` annotation): honoured;
- ``minResources``: the members' own requests are reserved all-or-nothing, so a gang whose members request at
  least minResources is placed only where that much is free; one whose members request less waits, the field
  named (`dispatcher.gangs.short_of_min_resources`): hoss holds no room beyond the members' requests. Volcano's
  queue admission against it is not done (there are no Volcano queues in hoss: the group goes Inqueue at once);
- ``queue``: ``default`` or empty (Volcano's default queue, unlimited) honoured; any other queue refused;
- ``priorityClassName``: as above;
- ``networkTopology``, ``subGroupPolicy`` and any other field: refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.gangs import VOLCANO_API, WORKLOAD_API, GangKey, PodGroupSpec, object_facts, parse_min_resources

WORKLOAD_PODGROUP_API = ("scheduling.k8s.io", "v1alpha2", "podgroups")
VOLCANO_PODGROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")

_WORKLOAD_FIELDS = frozenset({"podGroupTemplateRef", "schedulingPolicy", "schedulingConstraints", "resourceClaims",
                              "disruptionMode", "priorityClassName", "priority"})
_VOLCANO_FIELDS = frozenset({"minMember", "minTaskMember", "queue", "priorityClassName", "minResources"})
_DEFAULT_QUEUES = frozenset({"", "default"})


def _identity(obj: Mapping[str, object], api: str) -> GangKey | None:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        return None
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str) or not name or not namespace:
        return None
    return GangKey(namespace, name, api)


def _unknown(spec: Mapping[str, object], known: frozenset[str]) -> str:
    extra = sorted(set(spec) - known)
    return f"hoss does not know spec.{extra[0]} ({spec[extra[0]]!r}); refused rather than ignored" if extra else ""


def parse_workload_podgroup(obj: Mapping[str, object]) -> tuple[GangKey, PodGroupSpec] | None:
    """A scheduling.k8s.io/v1alpha2 PodGroup (raw JSON); None without a name and namespace."""
    key = _identity(obj, WORKLOAD_API)
    if key is None:
        return None
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    policy = spec.get("schedulingPolicy")
    policy = policy if isinstance(policy, dict) else {}
    gang = policy.get("gang")
    refusal = _unknown(spec, _WORKLOAD_FIELDS)
    min_count = 1
    if isinstance(gang, dict):
        value = gang.get("minCount")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            min_count = value
        else:
            refusal = refusal or f"spec.schedulingPolicy.gang.minCount {value!r} is not a positive integer"
    elif "basic" not in policy:
        refusal = refusal or f"spec.schedulingPolicy {policy!r} names neither gang nor basic"
    constraints = spec.get("schedulingConstraints")
    topology = constraints.get("topology") if isinstance(constraints, dict) else None
    domain_key = ""
    if topology:
        first = topology[0] if isinstance(topology, list) and isinstance(topology[0], dict) else {}
        key_value = first.get("key")
        if not isinstance(topology, list) or len(topology) != 1 or not isinstance(key_value, str) or not key_value \
                or set(first) != {"key"}:
            refusal = refusal or (f"spec.schedulingConstraints.topology {topology!r}: hoss honours exactly one "
                                  f"entry with a key (a hard tier), as kube-scheduler reads the first")
        else:
            domain_key = key_value
    claims = spec.get("resourceClaims")
    if claims:
        refusal = refusal or f"hoss does not honour spec.resourceClaims ({claims!r}) yet"
    mode = spec.get("disruptionMode")
    if mode not in (None, "Pod", "PodGroup"):
        refusal = refusal or f"spec.disruptionMode {mode!r} is neither Pod nor PodGroup"
    return key, PodGroupSpec(min_member=min_count, gang=isinstance(gang, dict), refusal=refusal,
                             domain_key=domain_key, **object_facts(obj))


def parse_volcano_podgroup(obj: Mapping[str, object]) -> tuple[GangKey, PodGroupSpec] | None:
    """A scheduling.volcano.sh/v1beta1 PodGroup (raw JSON); None without a name and namespace."""
    key = _identity(obj, VOLCANO_API)
    if key is None:
        return None
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    refusal = _unknown(spec, _VOLCANO_FIELDS)
    min_member = spec.get("minMember", 1)
    if not isinstance(min_member, int) or isinstance(min_member, bool) or min_member < 0:
        refusal = refusal or f"spec.minMember {min_member!r} is not a non-negative integer"
        min_member = 1
    tasks: list[tuple[str, int]] = []
    raw_tasks = spec.get("minTaskMember") or {}
    if not isinstance(raw_tasks, dict):
        refusal = refusal or f"spec.minTaskMember {raw_tasks!r} is not a map of task to count"
        raw_tasks = {}
    for task, count in sorted(raw_tasks.items()):
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            refusal = refusal or f"spec.minTaskMember[{task}] {count!r} is not a non-negative integer"
        elif count:
            tasks.append((str(task), count))
    queue = spec.get("queue", "")
    if queue not in _DEFAULT_QUEUES:
        refusal = refusal or (f"hoss has no Volcano queues: spec.queue {queue!r} is refused (only 'default', "
                              f"Volcano's unlimited default queue, is honoured)")
    min_resources, unreadable = parse_min_resources(spec)
    return key, PodGroupSpec(min_member=max(1, min_member), task_minimums=tuple(tasks), refusal=refusal or unreadable,
                             min_resources=min_resources, **object_facts(obj))
