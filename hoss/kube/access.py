"""Who may read a hoss component's /status and /metrics: anyone who reaches the port (``--access=open``), or
(``--access=kubernetes``) only callers with a bearer token the apiserver vouches for, whose user may ``get`` the
component's virtual resource in API group ``hoss.io``: ``dispatchers/status``, ``resolvers/metrics``,
``workers/status``, ``reschedulers/status`` and so on, what the ClusterRole ``hoss-viewer`` in deploy/rbac.yaml
grants. This is what kube-rbac-proxy does, inside each component (the dispatcher, every worker, every resolver
replica and the rescheduler alike):

1. ``Authorization: Bearer <token>`` -> TokenReview: is the token valid, and whose is it (user, groups, uid, extra);
2. SubjectAccessReview for that user: ``get`` on ``hoss.io/<resource>/<status|metrics>`` in the namespace
   ``--access-namespace``;
3. 401 without a valid token, 403 when the user may not, 503 when the apiserver cannot be asked, else the
   handler. Each answer is remembered for ``--access-cache-seconds`` (by token and path, at most 1,000 of them),
   so a dashboard or Prometheus polling every few seconds costs the apiserver two reviews per cache period, not
   per poll.

Only the paths given as protected are checked: health probes (the kubelet's), the dispatcher's dashboard files (no
data: the page reads /status with the token the user gives it) and the resolver's review paths (the apiserver's
client certificate guards them, resolver.app) stay out of it. `TokenAccess.authorize` is framework-free (the
resolver serves with its own HTTP server); `middleware` applies it in an aiohttp application.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.model.objects import Json

log = logging.getLogger(__name__)

VIEWER_GROUP = "hoss.io"
STATUS_PATHS = {"/status": "status", "/metrics": "metrics"}
"""The paths every component protects, and the subresource a caller must be allowed to get."""
CACHE_SIZE = 1000
REVIEW_TIMEOUT_SECONDS = 10.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refusal = tuple[int, str]
"""(HTTP status, message): 401, 403 or 503 and why."""


class TokenAccess:
    """TokenReview + SubjectAccessReview against the apiserver, with a small cache of the answers.

    ``resource`` is the component's virtual resource (``dispatchers``, ``resolvers``, ``workers``); ``paths`` maps
    each protected path to the subresource checked for it."""

    def __init__(
        self,
        rest: KubeREST,
        *,
        resource: str,
        namespace: str,
        cache_seconds: float,
        paths: Mapping[str, str] = STATUS_PATHS,
    ) -> None:
        self._rest = rest
        self.resource = resource
        self.namespace = namespace
        self.cache_seconds = cache_seconds
        self.paths = dict(paths)
        self._cache: OrderedDict[tuple[str, str], tuple[float, int, str]] = OrderedDict()

    async def authorize(self, path: str, authorization: str) -> Refusal | None:
        """None when ``path`` is open or the ``Authorization`` header's bearer token may read it; else why not."""
        subresource = self.paths.get(path)
        if subresource is None:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, "send a Kubernetes bearer token: Authorization: Bearer <token>"
        try:
            code, why = await self.check(token.strip(), subresource)
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot review a token for %s: %s", path, error)
            return 503, f"cannot ask the apiserver about this token: {error}"
        return None if code == 200 else (code, why)

    async def check(self, token: str, subresource: str) -> tuple[int, str]:
        """(200, user) when the token's user may get ``<resource>/<subresource>``; (401 or 403, why) when not."""
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
        review: Json = await self._rest.request(
            "POST", "/apis/authentication.k8s.io/v1/tokenreviews",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            timeout=REVIEW_TIMEOUT_SECONDS,
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return 401, f"token not accepted by the apiserver: {status.get('error') or 'not authenticated'}"
        user = status.get("user") or {}
        username = str(user.get("username", ""))
        access: Json = await self._rest.request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": username,
                    "groups": user.get("groups") or [],
                    "uid": user.get("uid") or "",
                    "extra": user.get("extra") or {},
                    "resourceAttributes": {
                        "namespace": self.namespace, "group": VIEWER_GROUP, "resource": self.resource,
                        "subresource": subresource, "verb": "get",
                    },
                },
            },
            timeout=REVIEW_TIMEOUT_SECONDS,
        )
        if not (access.get("status") or {}).get("allowed"):
            return 403, (f"{username} may not get {self.resource}/{subresource} in API group {VIEWER_GROUP}"
                         f" (namespace {self.namespace}); bind the ClusterRole hoss-viewer")
        return 200, username


def middleware(access: TokenAccess) -> Middleware:
    """An aiohttp middleware guarding ``access.paths`` with ``access``."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = await access.authorize(request.path, request.headers.get("Authorization", ""))
        if refusal is None:
            return await handler(request)
        code, message = refusal
        return web.json_response({"error": message}, status=code, headers=challenge(code))

    return guard


def challenge(status: int) -> dict[str, str]:
    """The headers of a refusal: a 401 names the scheme it wants."""
    return {"WWW-Authenticate": 'Bearer realm="hoss"'} if status == 401 else {}
