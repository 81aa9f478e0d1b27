"""Who may read the dispatcher's /status and /metrics: anyone who reaches the port, or (``--access=kubernetes``)
only callers with a bearer token the apiserver vouches for, whose user may ``get`` the virtual resource
``dispatchers/status`` (or ``dispatchers/metrics``) in API group ``hoss.io`` — what the ClusterRole ``hoss-viewer``
in deploy/rbac.yaml grants. This is what kube-rbac-proxy does, inside the dispatcher:

1. ``Authorization: Bearer <token>`` -> TokenReview: is the token valid, and whose is it (user, groups, uid, extra);
2. SubjectAccessReview for that user: ``get`` on ``hoss.io/dispatchers/<status|metrics>`` in the dispatcher's
   namespace (its Lease namespace);
3. 401 without a valid token, 403 when the user may not, else the handler. Each answer is remembered for
   ``--access-cache-seconds`` (by token and path, at most 1,000 of them), so a dashboard polling every 2 s costs the
   apiserver two reviews per cache period, not per poll.

/healthz (the kubelet's probes) and the dashboard's static files (no data: the page reads /status with the token
the user gives it) are always open.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from kubernetes_asyncio import client

from resolver.kube import Json, KubeError, request_json

log = logging.getLogger(__name__)

VIEWER_GROUP = "hoss.io"
VIEWER_RESOURCE = "dispatchers"
PROTECTED = {"/status": "status", "/status/schema": "status", "/metrics": "metrics"}
"""Paths that need a token, and the subresource of ``dispatchers`` a caller must be allowed to get."""
CACHE_SIZE = 1000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenAccess:
    """TokenReview + SubjectAccessReview against the apiserver, with a small cache of the answers."""

    def __init__(self, api: client.ApiClient, *, namespace: str, cache_seconds: float) -> None:
        self._authn: Any = client.AuthenticationV1Api(api)
        self._authz: Any = client.AuthorizationV1Api(api)
        self.namespace = namespace
        self.cache_seconds = cache_seconds
        self._cache: OrderedDict[tuple[str, str], tuple[float, int, str]] = OrderedDict()

    async def check(self, token: str, subresource: str) -> tuple[int, str]:
        """(200, user) when the token's user may get ``dispatchers/<subresource>``; (401 or 403, why) when not."""
        key = (hashlib.sha256(token.encode()).hexdigest(), subresource)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        code, why = await self._review(token, subresource)
        self._cache[key] = (now + self.cache_seconds, code, why)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return code, why

    async def _review(self, token: str, subresource: str) -> tuple[int, str]:
        review: Json = await request_json(
            self._authn.create_token_review,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, f"token not accepted by the apiserver: {status.get('error') or 'not authenticated'}"
        user = status.get("user") or {}
        username = str(user.get("username", ""))
        access: Json = await request_json(
            self._authz.create_subject_access_review,
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": username,
                    "groups": user.get("groups") or [],
                    "uid": user.get("uid") or "",
                    "extra": user.get("extra") or {},
                    "resourceAttributes": {
                        "namespace": self.namespace, "group": VIEWER_GROUP, "resource": VIEWER_RESOURCE,
                        "subresource": subresource, "verb": "get",
                    },
                },
            },
        )
        if not (access.get("status") or {}).get("allowed"):
            return 403, (f"{username} may not get {VIEWER_RESOURCE}/{subresource} in API group {VIEWER_GROUP}"
                         f" (namespace {self.namespace}); bind the ClusterRole hoss-viewer")
        return 200, username


def middleware(access: TokenAccess) -> Middleware:
    """An aiohttp middleware guarding `PROTECTED` paths with ``access``."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        subresource = PROTECTED.get(request.path)
        if subresource is None:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _refuse(401, "send a Kubernetes bearer token: Authorization: Bearer <token>")
        try:
            code, why = await access.check(token.strip(), subresource)
        except (KubeError, OSError, TimeoutError) as error:
            log.warning("cannot review a token for %s: %s", request.path, error)
            return _refuse(503, f"cannot ask the apiserver about this token: {error}")
        if code != 200:
            return _refuse(code, why)
        return await handler(request)

    return guard


def _refuse(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="hoss"'} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)
