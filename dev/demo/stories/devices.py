"""Story 6, devices (Dynamic Resource Allocation): pods ask for GPUs through ResourceClaimTemplates, and hoss
allocates the devices of the plane's fake DRA driver as kube-scheduler's DynamicResources plugin would.

The story's two nodes publish 8 fake GPUs each in a ResourceSlice (label ``dra.hoss.dev/gpus``; one node's are model
h100, the other's a100; GPUs 0-3 share NVLink domain 0 and 4-7 domain 1; dev/local/devices.py). Under the gpu
policy, ``dra-pair`` (2 GPUs) and ``dra-single`` (1 GPU), pinned to the h100 node, take three GPUs of its first
NVLink domain. Then ``dra-nvlink`` asks for 2 GPUs of one NVLink domain (``matchAttribute``), pinned there too: the
first domain has one GPU left, so both come from the second, where an allocation without the constraint would take
gpu-3 and gpu-4 across the two; and ``dra-a100`` asks for 1 GPU whose CEL selector wants model a100, which only the
other node has. Last, ``dra-extended`` asks ``dra.hoss.dev/gpu: 2``, an extended resource the DeviceClass serves:
hoss makes its claim (as kube-scheduler does), and the gpu policy packs it onto the h100 node, both GPUs in its
second NVLink domain. Each pod's node and devices are read from its claim's ``status.allocation``, their attributes from
the slices, and no device may be in two claims (`devices_allocated_twice`, from the apiserver's claims alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from dev.demo.observe import bound, list_pods, wait_bound
from dev.demo.stage import DEVICES_NAMESPACE, DRA_GPUS, DRA_MODELS, STORY_KEY, STORY_TIMEOUT_SECONDS, story_pod
from dev.local.cluster import Cluster, devices_allocated_twice, wait_until
from dev.local.devices import DEVICE_CLASS, DRIVER, EXTENDED_RESOURCE, MODEL_LABEL, NVLINK_DOMAIN
from hoss.kube.client import KubeError, request_json
from hoss.model.objects import Json, section

STORY = "devices"
CLAIM = "gpus"
"""The name of each pod's claim entry (``spec.resourceClaims[].name``)."""
PINNED_MODEL, SELECTED_MODEL = DRA_MODELS
"""The model of the node the pinned pods go to, and the model the CEL selector asks for (the other node's)."""
MODEL_SELECTOR = f'device.attributes["{DRIVER}"].model == "{SELECTED_MODEL}"'


@dataclass(frozen=True)
class Ask:
    """One pod of the story and the claim its template makes."""

    pod: str
    gpus: int
    selector: str = ""
    """A CEL selector on the devices' attributes."""
    one_nvlink_domain: bool = False
    """``matchAttribute`` on the NVLink domain: every device of the claim in one domain."""
    pinned: bool = False
    """Pinned (node selector) to the node of model ``PINNED_MODEL``, so that the first pods' devices leave its NVLink
    domains uneven."""
    extended: bool = False
    """Asks ``EXTENDED_RESOURCE`` (which the class serves) instead of a claim of its own."""

    @property
    def words(self) -> str:
        """What the claim asks, e.g. ``2 GPUs of one NVLink domain``."""
        if self.extended:
            return f"{EXTENDED_RESOURCE}: {self.gpus} (an extended resource the DeviceClass serves)"
        asked = f"{self.gpus} GPU{'' if self.gpus == 1 else 's'}"
        if self.one_nvlink_domain:
            asked += " of one NVLink domain (matchAttribute)"
        if self.selector:
            asked += f" where {self.selector} (CEL selector)"
        return asked


FIRST = (Ask("dra-pair", 2, pinned=True), Ask("dra-single", 1, pinned=True))
"""First: three GPUs of the pinned node's first NVLink domain taken."""
THEN = (Ask("dra-nvlink", 2, one_nvlink_domain=True, pinned=True),
        Ask(f"dra-{SELECTED_MODEL}", 1, selector=MODEL_SELECTOR))
"""Then: two GPUs of one domain where the first has one left, and one GPU by its model."""
LAST = (Ask("dra-extended", 2, extended=True),)
"""Last: two GPUs asked as an extended resource; the gpu policy packs them onto the fuller node, in one domain."""


@dataclass
class Placement:
    asked: str
    """What the pod's claim asks, in words."""
    node: str
    devices: list[str]
    """The claim's allocated devices, e.g. ``gpu-4``."""
    nvlink_domains: list[int]
    """Each device's NVLink domain (``nvlinkDomain``), from the node's slice."""
    models: list[str]


@dataclass
class DeviceStory:
    nodes: int
    gpus_per_node: int
    pods: int
    bound: int
    placements: dict[str, Placement] = field(default_factory=dict)
    """Each pod's node and devices, from its claim's status.allocation."""
    devices_in_two_claims: int = 0
    """Devices that two claims' allocations hold, over every claim of the plane (0 unless oversold)."""


def template(ask: Ask) -> Json:
    """The pod's ResourceClaimTemplate: ``gpus`` devices of the fake driver's class, with the ask's selector or
    constraint."""
    exactly: Json = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": ask.gpus}
    if ask.selector:
        exactly["selectors"] = [{"cel": {"expression": ask.selector}}]
    devices: Json = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if ask.one_nvlink_domain:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": NVLINK_DOMAIN}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": ask.pod},
            "spec": {"spec": {"devices": devices}}}


def device_pod(ask: Ask, *, pinned_node: str) -> Json:
    """A gpu-policy pod of the story whose claim comes from its template."""
    if ask.extended:
        pod = story_pod(ask.pod, STORY, policy="gpu", requests={"cpu": "1", "memory": "4Gi",
                                                                 EXTENDED_RESOURCE: str(ask.gpus)})
        pod["spec"]["containers"][0]["resources"]["limits"] = {EXTENDED_RESOURCE: str(ask.gpus)}
    else:
        pod = story_pod(ask.pod, STORY, policy="gpu", requests={"cpu": "1", "memory": "4Gi"})
        pod["spec"]["resourceClaims"] = [{"name": CLAIM, "resourceClaimTemplateName": ask.pod}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": CLAIM}]
    if ask.pinned:
        pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] = pinned_node
    return pod


ASKS = {ask.pod: ask for ask in (*FIRST, *THEN, *LAST)}


def placements(pods: Sequence[Json], claims: Sequence[Json], slices: Sequence[Json]) -> dict[str, Placement]:
    """Each bound pod's node and the devices its claim's allocation holds, with their attributes from the slices; in
    the story's order."""
    by_name = {section(c, "metadata").get("name"): c for c in claims}
    attributes = {(section(s, "spec").get("driver"), section(section(s, "spec"), "pool").get("name"),
                   d.get("name")): d.get("attributes") or {}
                  for s in slices for d in section(s, "spec").get("devices") or []}
    result: dict[str, Placement] = {}
    order = list(ASKS)
    for pod in sorted(bound(pods), key=lambda p: order.index(p["metadata"]["name"]) if p["metadata"]["name"] in ASKS
                      else len(order)):
        statuses = section(pod, "status").get("resourceClaimStatuses") or []
        made = section(section(pod, "status"), "extendedResourceClaimStatus").get("resourceClaimName")
        claim = by_name.get(made or next((s.get("resourceClaimName") for s in statuses if s.get("name") == CLAIM),
                                         None))
        allocation = section(section(claim or {}, "status"), "allocation")
        results = section(allocation, "devices").get("results") or []
        held = [attributes.get((r.get("driver"), r.get("pool"), r.get("device"))) or {} for r in results]
        name = pod["metadata"]["name"]
        result[name] = Placement(
            asked=ASKS[name].words if name in ASKS else "", node=pod["spec"]["nodeName"],
            devices=[str(r.get("device")) for r in results],
            nvlink_domains=[int(a.get("nvlinkDomain", {}).get("int", -1)) for a in held],
            models=[str(a.get("model", {}).get("string", "")) for a in held])
    return result


async def _create(cluster: Cluster, call: Any, *args: Any) -> None:
    """Create an object unless it exists (a demo run again on the same plane)."""
    try:
        await cluster.call(request_json, call, *args)
    except KubeError as error:
        if error.status != 409:
            raise


async def _slices(cluster: Cluster, nodes: Sequence[str]) -> list[Json]:
    """The fake driver's slices of the story's nodes, once each node has one."""
    api = client.ResourceV1Api(cluster.api)
    found: list[Json] = []

    async def published() -> tuple[bool, str]:
        body: Any = await cluster.call(request_json, api.list_resource_slice, field_selector=f"spec.driver={DRIVER}")
        found[:] = [s for s in body["items"] if section(s, "spec").get("nodeName") in nodes]
        return len(found) == len(nodes), f"{len(found)}/{len(nodes)} nodes have their ResourceSlice"

    await wait_until(published, timeout=STORY_TIMEOUT_SECONDS, what="the fake DRA driver to publish the GPUs")
    return found


async def device_story(cluster: Cluster, progress: Callable[[str], None]) -> DeviceStory:
    listed = await cluster.raw_list("list_node", label_selector=f"{STORY_KEY}={STORY}")
    nodes = {n["metadata"]["labels"][MODEL_LABEL]: n["metadata"]["name"] for n in listed}
    pinned = nodes[PINNED_MODEL]
    slices = await _slices(cluster, list(nodes.values()))
    api = client.ResourceV1Api(cluster.api)
    for ask in ASKS.values():
        if not ask.extended:
            await _create(cluster, api.create_namespaced_resource_claim_template, DEVICES_NAMESPACE, template(ask))
    selector = f"app=hoss-demo-{STORY}"
    progress(f"devices: {len(nodes)} nodes publish {DRA_GPUS} fake GPUs each ({DRIVER}); {FIRST[0].pod} and "
             f"{FIRST[1].pod} take 3 GPUs of {pinned}'s first NVLink domain")
    await cluster.create_pods([device_pod(ask, pinned_node=pinned) for ask in FIRST], namespace=DEVICES_NAMESPACE)
    await wait_bound(cluster, DEVICES_NAMESPACE, selector, len(FIRST), what="the first device pods to be bound")
    progress(f"devices: {THEN[0].pod} asks 2 GPUs of one NVLink domain (matchAttribute), {THEN[1].pod} 1 GPU of "
             f"model {SELECTED_MODEL} (CEL selector)")
    await cluster.create_pods([device_pod(ask, pinned_node=pinned) for ask in THEN], namespace=DEVICES_NAMESPACE)
    await wait_bound(cluster, DEVICES_NAMESPACE, selector, len(FIRST) + len(THEN), what="the device pods to be bound")
    progress(f"devices: {LAST[0].pod} asks {EXTENDED_RESOURCE}: {LAST[0].gpus}, which the DeviceClass serves: hoss "
             f"makes its claim")
    await cluster.create_pods([device_pod(ask, pinned_node=pinned) for ask in LAST], namespace=DEVICES_NAMESPACE)
    asked = len(ASKS)
    await wait_bound(cluster, DEVICES_NAMESPACE, selector, asked, what="the device pods to be bound")
    pods = await list_pods(cluster, DEVICES_NAMESPACE, selector)
    claims = await cluster.resource_claims()
    mine = [c for c in claims if section(c, "metadata").get("namespace") == DEVICES_NAMESPACE]
    return DeviceStory(nodes=len(nodes), gpus_per_node=DRA_GPUS, pods=asked, bound=len(bound(pods)),
                       placements=placements(pods, mine, slices),
                       devices_in_two_claims=len(devices_allocated_twice(claims)))
