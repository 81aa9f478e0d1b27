"""The webhook over real HTTPS, in process, with the ledger on fakeredis: the reviews the tests send and the
server they send them to (shared by the webhook's test modules)."""

from __future__ import annotations

import io
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import fakeredis

from deploy import pki
from hoss.kube.client import KubeError
from hoss.ledger.client import Ledger
from resolver.app import build_server
from resolver.mirror import PodIndex, parse_pod
from resolver.server import IDLE_TIMEOUT_SECONDS, WebhookServer
from resolver.settings import ResolverSettings
from resolver.state import PodReader, WebhookState
from resolver.tls import tls_context

WORKER = "system:serviceaccount:hoss-system:hoss-worker"
NODE_ROOM = {"cpu": 2000, "memory": 8 << 30, "pods": 110}


def pod(name: str, uid: str, cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "spec": {"schedulerName": "hoss", "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Pending"},
    }


def review(*, pod_name: str, uid: str | None, node: str, user: str = "system:kube-scheduler",
           resource_version: str = "") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": pod_name, "namespace": "team"}
    if uid:
        metadata["uid"] = uid
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "review-1",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "name": pod_name,
            "namespace": "team",
            "operation": "CREATE",
            "userInfo": {"username": user},
            "object": {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                       "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
        },
    }


@dataclass
class Webhook:
    url: str
    session: aiohttp.ClientSession
    ledger: Ledger
    redis: Any
    state: WebhookState
    server: WebhookServer
    port: int
    client_tls: ssl.SSLContext

    async def post(self, body: bytes | dict[str, Any], *,
                   path: str = "/validate-binding") -> tuple[int, dict[str, Any]]:
        data = io.BytesIO(body if isinstance(body, bytes) else json.dumps(body).encode())
        async with self.session.post(f"{self.url}{path}", data=data) as response:
            return response.status, await response.json()


class PodReads:
    """The apiserver's pods as the webhook's ``get_pod`` sees them; counts the reads."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.reads: list[str] = []

    async def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append(f"{namespace}/{name}")
        found = self.pods.get((namespace, name))
        if found is None:
            raise KubeError(f'404: pods "{name}" not found', status=404)
        return found


async def start(tmp_path: Path, *, get_pod: PodReader | None = None, idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
                **settings: Any) -> AsyncIterator[Webhook]:
    ca = pki.ensure_ca(tmp_path)
    serving = pki.issue(ca, directory=tmp_path, name="serving", common_name="hoss-resolver",
                        ip_addresses=("127.0.0.1",), server=True)
    config = ResolverSettings(tls_cert_file=str(serving.cert), tls_key_file=str(serving.key), **settings)
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    ledger = Ledger(redis)
    await ledger.rebuild(nodes=[("n1", NODE_ROOM, {})], bound=[])
    pods = PodIndex()
    for spec in (pod("small", "u-small", "500m"), pod("big", "u-big", "3"), pod("mine", "u-mine", "1")):
        pods.put(parse_pod(spec))
    state = WebhookState(settings=config, ledger=ledger, pods=pods, get_pod=get_pod)
    server = build_server(state, idle_timeout_seconds=idle_timeout_seconds)
    port = await server.start("127.0.0.1", 0, ssl_context=tls_context(config.tls_cert_file, config.tls_key_file))
    client_tls = ssl.create_default_context(cafile=str(ca.cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_tls)) as session:
        yield Webhook(f"https://127.0.0.1:{port}", session, ledger, redis, state, server, port, client_tls)
    await server.close()
    await redis.aclose()
