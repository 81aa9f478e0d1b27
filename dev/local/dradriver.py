"""The local plane's fake DRA driver: ``python -m dev.local.dradriver --kubeconfig FILE``, one process of the plane
(`LocalPlane.up` starts it as ``fake-dra-driver`` with kwok's identity: kwok plays the kubelets, the driver plays
their DRA plugin). What it publishes for a node is dev/local/devices.py's.

As a node-local DRA driver's kubelet plugin does, it publishes one ResourceSlice for each node that has its devices
and deletes the slice when the node goes. It watches the nodes labelled ``dra.hoss.dev/gpus`` (a list, then a watch
from the list's resourceVersion, a new list on 410 Gone: `hoss.kube.client.run_informer`); a node added or
relabelled gets its slice written by server-side apply when its devices differ from what was published (the pool's
generation one higher), and a node deleted or no longer labelled gets its slice deleted. Every list first reads the
driver's slices back from the apiserver, so a slice left for a node that went while the driver was down is deleted
too. A write that fails makes the informer list again after a back-off. At start it applies the DeviceClass
``gpu.dra.hoss.dev``; where the apiserver does not serve resource.k8s.io/v1 it says so once and publishes nothing,
staying up as the plane's other processes do. One log line per slice written or deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay, wait_fixed

from dev.local.cluster import dra_list
from dev.local.devices import (
    DEVICE_CLASS,
    DRIVER,
    GPUS_LABEL,
    UnpublishableNode,
    device_class,
    node_devices,
    node_name,
    resource_slice,
)
from hoss.kube.client import InformerHandlers, KubeError, api_client, list_objects, request_json, run_informer
from hoss.logs import configure_logging
from hoss.model.objects import Json, section

log = logging.getLogger(__name__)

FIELD_MANAGER = "hoss-fake-dra-driver"
APPLY_PATCH = "application/apply-patch+yaml"
START_SECONDS = 120.0
"""How long the driver tries to reach the apiserver at start before it gives up (and exits with the error)."""


@dataclass(frozen=True)
class Published:
    """A node's slice as the driver last wrote it (or read it back)."""

    name: str
    generation: int
    devices: list[Json]


def published_slice(item: Json) -> tuple[str, Published]:
    """A stored slice of the driver: its node and what it holds."""
    spec = section(item, "spec")
    generation = section(spec, "pool").get("generation")
    return str(spec.get("nodeName") or ""), Published(
        name=str(section(item, "metadata").get("name") or ""),
        generation=generation if isinstance(generation, int) else 0,
        devices=list(spec.get("devices") or []),
    )


class FakeDriver:
    """The slices the driver has published, by node, and the writes that keep them as the nodes ask."""

    def __init__(self, resources: Any) -> None:
        self.api = resources
        """A ResourceV1Api."""
        self.published: dict[str, Published] = {}
        self.refused: dict[str, str] = {}
        """Nodes whose label the driver cannot publish, with the error it logged (once per error)."""

    def handlers(self) -> InformerHandlers:
        return InformerHandlers(on_list=self.on_list, on_event=self.on_event)

    async def on_list(self, nodes: list[Json]) -> None:
        stored, _version = await list_objects(self.api.list_resource_slice, field_selector=f"spec.driver={DRIVER}")
        self.published = dict(map(published_slice, stored))
        listed = {node_name(node): node for node in nodes}
        self.refused = {node: error for node, error in self.refused.items() if node in listed}
        for gone in sorted(self.published.keys() - listed.keys()):
            await self.withdraw(gone, why=f"was deleted or is no longer labelled {GPUS_LABEL}")
        for node in listed.values():
            await self.reconcile(node)

    async def on_event(self, kind: str, node: Json) -> None:
        if kind == "DELETED":
            # The watch selects the label: DELETED is the node's deletion or the label's removal (both come with the
            # node's last labelled state).
            self.refused.pop(node_name(node), None)
            await self.withdraw(node_name(node), why=f"was deleted or is no longer labelled {GPUS_LABEL}")
        else:
            await self.reconcile(node)

    async def reconcile(self, node: Json) -> None:
        name = node_name(node)
        try:
            devices = node_devices(node)
        except UnpublishableNode as error:
            await self.refuse(name, error)
            return
        self.refused.pop(name, None)
        if devices:
            await self.publish(name, devices)
        else:
            await self.withdraw(name, why=f"asks for none ({GPUS_LABEL}=0)")

    async def refuse(self, node: str, error: UnpublishableNode) -> None:
        """Publish nothing for the node, and say why once (again when the reason changes)."""
        if self.refused.get(node) != str(error):
            log.error("publishing no ResourceSlice: %s", error)
            self.refused[node] = str(error)
        await self.withdraw(node, why="asks for GPUs in a way the driver cannot publish")

    async def publish(self, node: str, devices: list[Json]) -> None:
        current = self.published.get(node)
        if current is not None and current.devices == devices:
            return
        generation = 1 if current is None else current.generation + 1
        body = resource_slice(node, devices=devices, generation=generation)
        name = body["metadata"]["name"]
        await request_json(self.api.patch_resource_slice, name, body, field_manager=FIELD_MANAGER, force=True,
                           _content_type=APPLY_PATCH)
        self.published[node] = Published(name=name, generation=generation, devices=devices)
        log.info("ResourceSlice %s written: node %s has %d GPU%s (pool generation %d)", name, node, len(devices),
                 "" if len(devices) == 1 else "s", generation)

    async def withdraw(self, node: str, *, why: str) -> None:
        current = self.published.pop(node, None)
        if current is None:
            return
        try:
            await request_json(self.api.delete_resource_slice, current.name)
        except KubeError as error:
            if error.status != 404:
                raise
        log.info("ResourceSlice %s deleted: node %s %s", current.name, node, why)


async def install_device_class(resources: Any) -> bool:
    """Apply the driver's DeviceClass; False (and nothing written) where resource.k8s.io/v1 is not served."""
    if await dra_list(resources.list_device_class, limit=1) is None:
        return False
    await request_json(resources.patch_device_class, DEVICE_CLASS, device_class(), field_manager=FIELD_MANAGER,
                       force=True, _content_type=APPLY_PATCH)
    log.info("DeviceClass %s applied (every device of driver %s)", DEVICE_CLASS, DRIVER)
    return True


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("cannot reach the apiserver to start (%s); trying again", error)


async def run(kubeconfig: str) -> None:
    api = await api_client(kubeconfig)
    try:
        resources = client.ResourceV1Api(api)
        retrying = AsyncRetrying(stop=stop_after_delay(START_SECONDS), wait=wait_fixed(2.0), reraise=True,
                                 retry=retry_if_exception_type((KubeError, aiohttp.ClientError, OSError,
                                                                TimeoutError)),
                                 before_sleep=_log_retry)
        served = False
        async for attempt in retrying:
            with attempt:
                served = await install_device_class(resources)
        if not served:
            log.warning("the apiserver does not serve resource.k8s.io/v1: the fake DRA driver publishes nothing")
            await asyncio.Event().wait()  # stays up: the plane counts a process that ended as failed
        log.info("publishing %s devices for the nodes labelled %s", DRIVER, GPUS_LABEL)
        await run_informer(f"nodes labelled {GPUS_LABEL}", client.CoreV1Api(api).list_node,
                           FakeDriver(resources).handlers(), label_selector=GPUS_LABEL)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.local.dradriver",
                                     description="The local plane's fake DRA driver (dev/local/devices.py).")
    parser.add_argument("--kubeconfig", required=True, help="the identity it writes ResourceSlices with")
    args = parser.parse_args(argv)
    configure_logging("INFO", "text")
    asyncio.run(run(args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
