"""A lean apiserver client for the hot path: a pool of keep-alive HTTP/1.1 connections (`hoss.kube.http1`), orjson
bodies, no generated models."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, urlencode, urlsplit

import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.incluster_config import SERVICE_CERT_FILENAME, SERVICE_TOKEN_FILENAME

from hoss.kube import protobuf
from hoss.kube.client import DEFAULT_REQUEST_TIMEOUT_SECONDS, KubeError, status_message
from hoss.kube.http1 import Http1Pool
from hoss.model.admission import LANE_LABEL
from hoss.model.objects import Json

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
DEFAULT_CONNECTION_LIMIT = 100
TOKEN_REREAD_SECONDS = 60.0


def segment(value: str) -> str:
    """One URL path segment, percent-encoded (a ``/`` in a name cannot reach another resource)."""
    return quote(value, safe="")


class TokenFile:
    """A bearer token read from a file and read again at most every ``reread_seconds`` (the kubelet rotates
    projected service-account tokens in place). A failed re-read keeps the token already held."""

    def __init__(
        self, path: str | Path, *, reread_seconds: float = TOKEN_REREAD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self._reread_seconds = reread_seconds
        self._clock = clock
        self._header = self._read()
        self._read_at = clock()

    def _read(self) -> str:
        token = self.path.read_text().strip()
        if not token:
            raise KubeError(f"token file {self.path} is empty")
        return f"Bearer {token}"

    def __call__(self) -> str:
        now = self._clock()
        if now - self._read_at >= self._reread_seconds:
            self._read_at = now
            # A failed read keeps the token held: the kubelet may be half way through swapping the file.
            with contextlib.suppress(OSError, KubeError):
                self._header = self._read()
        return self._header


def ssl_context(configuration: client.Configuration) -> ssl.SSLContext:
    """The TLS context a kubernetes_asyncio Configuration describes: CA, client certificate and key, verification."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


def _authorization(configuration: client.Configuration) -> str | None:
    key = configuration.api_key.get("BearerToken") or configuration.api_key.get("authorization")
    if not key:
        return None
    prefix = configuration.api_key_prefix.get("BearerToken")
    return f"{prefix} {key}" if prefix else str(key)


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (HTTPS_PROXY / NO_PROXY), resolved once rather than per call."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and parts.hostname and not urllib.request.proxy_bypass(parts.hostname):
        return proxy
    return None


class KubeREST:
    """Raw JSON calls to one apiserver over one keep-alive connection pool.

    Create it inside a coroutine (``connect``/``in_cluster``/``from_configuration``); close it with ``close()`` or
    use it as an async context manager. Non-2xx raises KubeError with the apiserver's Status message and the HTTP
    status; network and TLS failures raise OSError (ConnectionError, ssl.SSLError), a missed deadline TimeoutError.
    Every call has a deadline.
    """

    def __init__(
        self,
        host: str,
        *,
        tls: ssl.SSLContext | None = None,
        authorization: str | Callable[[], str] | None = None,
        limit: int = DEFAULT_CONNECTION_LIMIT,
        server_hostname: str | None = None,
        proxy: str | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        self._prefix = urlsplit(self.host).path  # an apiserver behind a path prefix
        self._authorization = authorization
        self._pool = Http1Pool(self.host, tls=tls, server_hostname=server_hostname, limit=limit,
                               proxy=proxy if proxy is not None else _env_proxy(self.host))

    @classmethod
    async def connect(cls, kubeconfig: str | None, *, limit: int = DEFAULT_CONNECTION_LIMIT,
                      context: str | None = None) -> KubeREST:
        """A client from the ``kubeconfig`` file (its current context unless ``context``), or from the pod's
        service account when None."""
        if kubeconfig is None:
            return cls.in_cluster(limit=limit)
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=kubeconfig, context=context, client_configuration=configuration, persist_config=False
        )
        return cls.from_configuration(configuration, limit=limit)

    @classmethod
    def from_configuration(cls, configuration: client.Configuration, *,
                           limit: int = DEFAULT_CONNECTION_LIMIT) -> KubeREST:
        """A client for what a kubernetes_asyncio Configuration describes (host, TLS, token, proxy)."""
        return cls(
            str(configuration.host),
            tls=ssl_context(configuration),
            authorization=_authorization(configuration),
            limit=limit,
            server_hostname=configuration.tls_server_name or None,
            proxy=configuration.proxy or None,
        )

    @classmethod
    def in_cluster(
        cls,
        *,
        limit: int = DEFAULT_CONNECTION_LIMIT,
        token_file: str = SERVICE_TOKEN_FILENAME,
        ca_file: str = SERVICE_CERT_FILENAME,
        environ: Mapping[str, str] | None = None,
        token_reread_seconds: float = TOKEN_REREAD_SECONDS,
    ) -> KubeREST:
        """A client from the pod's service account: KUBERNETES_SERVICE_HOST/PORT, its CA, and its token, read
        again every ``token_reread_seconds`` so a rotated token is picked up."""
        configuration = client.Configuration()
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            try_refresh_token=False,
            token_filename=token_file,
            cert_filename=ca_file,
            environ=dict(os.environ if environ is None else environ),
        )
        return cls(
            str(configuration.host),
            tls=ssl_context(configuration),
            authorization=TokenFile(token_file, reread_seconds=token_reread_seconds),
            limit=limit,
        )

    async def __aenter__(self) -> KubeREST:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._pool.close()

    @property
    def closed(self) -> bool:
        return self._pool.closed

    def _headers(self, content_type: str | None) -> str:
        headers = f"Accept: {JSON}\r\nUser-Agent: hoss\r\n"
        if content_type is not None:
            headers += f"Content-Type: {content_type}\r\n"
        auth = self._authorization
        if auth is not None:
            headers += f"Authorization: {auth if isinstance(auth, str) else auth()}\r\n"
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        content_type: str = JSON,
        timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    ) -> Json:
        """One call; the decoded JSON response (``{}`` for an empty body).

        ``path`` is sent as given, so its segments must already be percent-encoded (``segment()``); ``body`` is
        encoded with orjson unless it is bytes already.
        """
        data = None if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
        target = self._prefix + path
        if params:
            target += ("&" if "?" in target else "?") + urlencode(params)
        head = self._pool.request_head(method, target, self._headers(content_type if data is not None else None), data)
        deadline = asyncio.get_running_loop().time() + timeout
        status, payload = await self._pool.request(head, data, no_body=method == "HEAD", deadline=deadline)
        if not 200 <= status <= 299:
            raise KubeError(f"{status}: {status_message(payload)}", status=status)
        if not payload:
            return {}
        try:
            decoded = orjson.loads(payload)
        except orjson.JSONDecodeError as error:
            raise KubeError(f"{status}: response is not JSON: {payload[:100]!r}", status=status) from error
        if not isinstance(decoded, dict):
            raise KubeError(f"{status}: response is not a JSON object: {payload[:100]!r}", status=status)
        return decoded

    async def create_binding(self, namespace: str, name: str, uid: str, node: str, *, lane: str | None = None,
                             resource_version: str = "", timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS) -> Json:
        """Bind the pod to ``node``; ``uid`` makes the apiserver refuse the binding if the pod was replaced, and
        ``resource_version`` (when given) if it changed since that version (a 409 Conflict); ``lane`` labels the
        Binding with the webhook lane it travels on (`hoss.model.admission.LANE_LABEL`). The body is protobuf
        (`hoss.kube.protobuf`), as kube-scheduler sends it: the apiserver decodes it far more cheaply."""
        body = protobuf.binding(namespace, name, uid, node, None if lane is None else {LANE_LABEL: lane},
                                resource_version=resource_version)
        path = f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}/binding"
        return await self.request("POST", path, body=body, content_type=protobuf.PROTOBUF, timeout=timeout)

    async def get_pod(self, namespace: str, name: str, *, timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS) -> Json:
        return await self.request("GET", f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}",
                                  timeout=timeout)

    async def create_event(self, event: Json, *, timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS) -> Json:
        """Post a core/v1 Event into the namespace its metadata names: in protobuf (`hoss.kube.protobuf.event`),
        like the binding, or as JSON when it has a field that encoder leaves to JSON."""
        namespace = segment(str(event["metadata"]["namespace"]))
        path = f"/api/v1/namespaces/{namespace}/events"
        try:
            body = protobuf.event(event)
        except protobuf.Unencodable:
            return await self.request("POST", path, body=event, timeout=timeout)
        return await self.request("POST", path, body=body, content_type=protobuf.PROTOBUF, timeout=timeout)

    async def patch_pod_status(self, namespace: str, name: str, patch: Json, *,
                               timeout: float = DEFAULT_REQUEST_TIMEOUT_SECONDS) -> Json:
        """A strategic-merge patch of pods/status (e.g. ``hoss.kube.events.unschedulable_condition``)."""
        path = f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}/status"
        return await self.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH, timeout=timeout)
