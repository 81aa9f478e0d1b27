"""A small external provisioner for the tests, as a CSI external-provisioner would act for a WaitForFirstConsumer
class: for each claim of a class whose provisioner is ours that names a node in
``volume.kubernetes.io/selected-node``, create a local PV on that node, pre-bound to the claim (claimRef with its
uid); kube-controller-manager's persistentvolume-binder then binds the claim to it. It reads the claims every
`poll_seconds` (no watch: a test's few claims), and never deletes anything (the test does)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hoss.kube.client import request_json
from hoss.model.objects import Json, section
from hoss.model.storage import SELECTED_NODE

log = logging.getLogger(__name__)

HOST = "kubernetes.io/hostname"


def provisioned_volume(claim: Json, node: str, *, provisioner: str) -> Json:
    """The PV made for `claim` on `node`: the claim's class, modes and size, a local path on the node."""
    metadata = section(claim, "metadata")
    spec = section(claim, "spec")
    size = section(section(spec, "resources"), "requests").get("storage", "1Gi")
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{metadata['uid']}", "annotations": {"pv.kubernetes.io/provisioned-by": provisioner}},
        "spec": {
            "capacity": {"storage": size}, "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "storageClassName": spec.get("storageClassName"), "persistentVolumeReclaimPolicy": "Delete",
            "local": {"path": f"/mnt/provisioned/{metadata['uid']}"},
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": metadata["namespace"],
                         "name": metadata["name"], "uid": metadata["uid"]},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOST, "operator": "In", "values": [node]}]}]}},
        },
    }


async def provision_once(core: Any, *, provisioner: str, classes: set[str], made: set[str]) -> None:
    """One pass over the claims: a PV for each claim of `classes` with a selected node and none made yet."""
    body: Any = await request_json(core.list_persistent_volume_claim_for_all_namespaces)
    for claim in body["items"]:
        metadata = section(claim, "metadata")
        node = section(metadata, "annotations").get(SELECTED_NODE)
        if not node or section(claim, "spec").get("storageClassName") not in classes or metadata["uid"] in made \
                or section(claim, "spec").get("volumeName"):
            continue
        try:
            await core.create_persistent_volume(provisioned_volume(claim, node, provisioner=provisioner))
        except ApiException as error:
            if error.status != 409:
                raise
        made.add(metadata["uid"])
        log.info("provisioned a volume for %s/%s on %s", metadata["namespace"], metadata["name"], node)


@contextlib.asynccontextmanager
async def running_provisioner(api: client.ApiClient, *, provisioner: str, classes: set[str],
                              poll_seconds: float = 0.3) -> AsyncIterator[set[str]]:
    """The provisioner for `classes` (whose provisioner is `provisioner`) while the block runs; yields the uids of
    the claims it made a volume for."""
    core = client.CoreV1Api(api)
    made: set[str] = set()

    async def loop() -> None:
        while True:
            try:
                await provision_once(core, provisioner=provisioner, classes=classes, made=made)
            except (ApiException, OSError, TimeoutError) as error:
                log.warning("test provisioner: %s", error)
            await asyncio.sleep(poll_seconds)

    task = asyncio.create_task(loop(), name="test-provisioner")
    try:
        yield made
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
