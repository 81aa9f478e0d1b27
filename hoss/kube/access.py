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
   handler. Each answer is remembered for ``--access-cache-seconds`` (by token and path), so a dashboard or
   Prometheus polling every few seconds costs the apiserver two reviews per cache period, not per poll.

What a caller who makes tokens up costs: the answers for tokens the apiserver accepted and those for tokens it
refused are remembered apart (at most 1,000 each), so made-up tokens push out only each other's; and a token that
was never accepted is reviewed at most ``--access-reviews-per-second`` times a second in all (a burst of a few
seconds' worth): beyond, 429 with Retry-After and no TokenReview. A token accepted before (its answer expired) is
reviewed again whatever the rate, so a flood of made-up tokens neither evicts nor delays the readers who have one.

Only the paths given as protected are checked: health probes (the kubelet's), the dispatcher's dashboard files (no
data: the page reads /status with the token the user gives it) and the resolver's review paths (the apiserver's
client certificate guards them, resolver.app) stay out of it. `TokenAccess.authorize` is framework-free (the
resolver serves with its own HTTP server); `middleware` applies it in an aiohttp application.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from hoss.kube.client import KubeError
from hoss.model.objects import Json

log = logging.getLogger(__name__)

VIEWER_GROUP = "hoss.io"
STATUS_PATHS = {"/status": "status", "/metrics": "metrics"}
"""The paths every component protects, and the subresource a caller must be allowed to get."""
CACHE_SIZE = 1000
"""Answers remembered for accepted tokens, and as many again for refused ones."""
REVIEW_TIMEOUT_SECONDS = 10.0
BURST_SECONDS = 4.0
"""Reviews of tokens never accepted may come in a burst of this many seconds' worth of the rate."""
REVIEWS_PER_SECOND = 5.0
"""Reviews of tokens never accepted, a second (``--access-reviews-per-second``)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refusal = tuple[int, str]
"""(HTTP status, message): 401, 403, 429 or 503 and why."""
Answer = tuple[float, int, str]
"""A remembered answer: until when (monotonic), its status and why (or the user)."""


class Reviewer(Protocol):
    """What the reviews are asked through: `hoss.kube.rest.KubeREST`'s request."""

    async def request(self, method: str, path: str, *, body: object = None, timeout: float = ...) -> Json: ...


class TokenBucket:
    """At most ``rate`` takes a second, ``burst`` at once, on the clock ``clock`` (monotonic seconds). Pure but for
    the clock."""

    def __init__(self, *, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        """Take one when there is one (True); False otherwise."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def wait_seconds(self) -> float:
        """How long until the next take succeeds."""
        return max(0.0, (1 - self._tokens) / self.rate)


class _Answers:
    """Answers by (token digest, subresource), least recently used first, at most ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._answers: OrderedDict[tuple[str, str], Answer] = OrderedDict()

    def get(self, key: tuple[str, str]) -> Answer | None:
        return self._answers.get(key)

    def put(self, key: tuple[str, str], answer: Answer) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)

    def pop(self, key: tuple[str, str]) -> None:
        self._answers.pop(key, None)


class TokenAccess:
    """TokenReview + SubjectAccessReview against the apiserver, with a small cache of the answers.

    ``resource`` is the component's virtual resource (``dispatchers``, ``resolvers``, ``workers``); ``paths`` maps
    each protected path to the subresource checked for it; ``reviews_per_second`` bounds the reviews of tokens never
    accepted (see the module's docstring)."""

    def __init__(
        self,
        rest: Reviewer,
        *,
        resource: str,
        namespace: str,
        cache_seconds: float,
        reviews_per_second: float = REVIEWS_PER_SECOND,
        paths: Mapping[str, str] = STATUS_PATHS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rest = rest
        self.resource = resource
        self.namespace = namespace
        self.cache_seconds = cache_seconds
        self.paths = dict(paths)
        self._clock = clock
        self._accepted = _Answers(CACHE_SIZE)
        """Answers for tokens the apiserver accepted (200, or 403: a user who may not)."""
        self._refused = _Answers(CACHE_SIZE)
        """Answers for tokens it refused (401)."""
        self._unknown_reviews = TokenBucket(rate=reviews_per_second, burst=max(1.0, reviews_per_second * BURST_SECONDS),
                                            clock=clock)
        self.reviews = 0
        """TokenReviews asked so far."""

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
        """(200, user) when the token's user may get ``<resource>/<subresource>``; (401, 403 or 429, why) when not."""
        key = (hashlib.sha256(token.encode()).hexdigest(), subresource)
        now = self._clock()
        accepted, refused = self._accepted.get(key), self._refused.get(key)
        for cached in (accepted, refused):
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
        if accepted is None and not self._unknown_reviews.take():
            wait = math.ceil(self._unknown_reviews.wait_seconds())
            return 429, f"too many reviews of tokens not seen before; try again in {wait}s"
        self.reviews += 1
        code, why = await self._review(token, subresource)
        answer = (now + self.cache_seconds, code, why)
        if code == 401:
            self._accepted.pop(key)
            self._refused.put(key, answer)
        else:
            self._refused.pop(key)
            self._accepted.put(key, answer)
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
    """The headers of a refusal: a 401 names the scheme it wants, a 429 when to come back."""
    if status == 401:
        return {"WWW-Authenticate": 'Bearer realm="hoss"'}
    return {"Retry-After": "1"} if status == 429 else {}
