"""An in-process HTTPS server standing in for the apiserver: it records every request (with the client certificate
the caller presented) and answers as each test tells it, for the KubeREST and EventSink tests."""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from deploy import pki


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    raw_path: str
    query: dict[str, str]
    content_type: str
    body: bytes
    authorization: str | None
    client_cn: str | None
    peer: tuple[str, int]


Responder = Callable[[Seen], Awaitable[web.StreamResponse]]


async def echo(seen: Seen) -> web.StreamResponse:
    """201 with the request body, as the apiserver answers a create (a protobuf body, e.g. a Binding: a Success
    Status in JSON, as the apiserver answers a client that accepts JSON); a GET gets a small Pod."""
    if seen.method == "GET":
        return web.json_response({"kind": "Pod", "metadata": {"name": seen.raw_path.rsplit("/", 1)[-1]}})
    if seen.content_type == "application/vnd.kubernetes.protobuf":
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
                                 status=201)
    return web.Response(status=201, body=seen.body or b"{}", content_type="application/json")


def status(code: int, message: str, reason: str = "") -> web.StreamResponse:
    """An apiserver Status body."""
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason,
            "code": code}
    return web.json_response(body, status=code)


@dataclass
class TLSApiserver:
    """Serves HTTPS on 127.0.0.1 with a certificate from its own CA; asks for (does not require) a client cert."""

    directory: Path
    respond: Responder = echo
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        self.ca = pki.ensure_ca(self.directory / "ca")
        self.serving = pki.issue(self.ca, directory=self.directory, name="apiserver", common_name="kube-apiserver",
                                 ip_addresses=("127.0.0.1",), server=True)
        self.client = pki.issue(self.ca, directory=self.directory, name="worker", common_name="hoss-worker",
                                organizations=("hoss",))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        peer_cert = transport.get_extra_info("peercert") if transport is not None else None
        client_cn = None
        if peer_cert:
            client_cn = dict(pair[0] for pair in peer_cert["subject"]).get("commonName")
        peer = transport.get_extra_info("peername") if transport is not None else ("", 0)
        seen = Seen(
            method=request.method,
            raw_path=request.raw_path.split("?", 1)[0],
            query=dict(request.query),
            content_type=request.headers.get("Content-Type", ""),
            body=await request.read(),
            authorization=request.headers.get("Authorization"),
            client_cn=client_cn,
            peer=(str(peer[0]), int(peer[1])),
        )
        self.seen.append(seen)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.respond(seen)
        finally:
            self.in_flight -= 1

    async def start(self) -> None:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca.cert))
        tls.load_cert_chain(str(self.serving.cert), str(self.serving.key))
        tls.verify_mode = ssl.CERT_OPTIONAL
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=tls)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, *, token: str | None = "t0k3n", ca: Path | None = None) -> Path:
        """A kubeconfig file (JSON is YAML) for this server with the client certificate, and a token if given."""
        user: dict[str, str] = {"client-certificate": str(self.client.cert), "client-key": str(self.client.key)}
        if token is not None:
            user["token"] = token
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url,
                                                      "certificate-authority": str(ca or self.ca.cert)}}],
            "users": [{"name": "worker", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "worker"}}],
            "current-context": "test",
        }
        path = self.directory / "kubeconfig.yaml"
        path.write_text(json.dumps(config))
        return path
