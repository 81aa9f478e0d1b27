"""Kubernetes API access shared by every hoss component: clients, raw list+watch, and an informer loop.

Objects stay raw JSON dicts (what the apiserver sends); each consumer parses them through one typed function
(e.g. ``hoss.model.resources.pod_requests``). The informer lists, watches from the listed resourceVersion, follows
bookmarks, re-lists on 410 Gone, and abandons a stream that has been silent for longer than its inactivity
timeout, so a half-dead connection never freezes a component.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_fixed

from hoss.errors import HossError
from hoss.model.objects import Json

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_SECONDS = 60.0
ListCall = Callable[..., Awaitable[Any]]


class KubeError(HossError):
    """The apiserver refused or failed a request; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchGone(KubeError):
    """The watch's resourceVersion is too old (HTTP 410): the caller must list again."""


async def api_client(kubeconfig: str | None) -> client.ApiClient:
    """A client from ``kubeconfig``, or from the pod's service account when None."""
    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


async def request_json(call: ListCall, *args: Any, **kwargs: Any) -> Json:
    """Call a generated client method without its slow model deserialisation; the JSON body.

    With ``_preload_content=False`` the client hands back error responses instead of raising, so the status is
    checked here: anything but 2xx raises KubeError with the apiserver's message and status. The response is
    always released. Every call has a deadline (``_request_timeout``, default 60 s): the client's own default is
    none, and a response lost under load would otherwise stall the caller forever.
    """
    kwargs.setdefault("_request_timeout", DEFAULT_REQUEST_TIMEOUT_SECONDS)
    try:
        response = await call(*args, _preload_content=False, **kwargs)
    except ApiException as error:
        raise KubeError(f"{error.status} {error.reason}", status=error.status) from error
    try:
        status = int(response.status)
        body = await response.read()
    finally:
        response.release()
    if not 200 <= status <= 299:
        raise KubeError(f"{status}: {status_message(body)}", status=status)
    return dict(orjson.loads(body)) if body else {}


def status_message(body: bytes) -> str:
    """The ``message`` of an apiserver Status body, or the body's first 300 characters when it has none."""
    try:
        return str(json.loads(body).get("message") or body[:300].decode(errors="replace"))
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace")


async def list_objects(call: ListCall, **kwargs: Any) -> tuple[list[Json], str]:
    """The items of a list call as raw dicts, and the list's resourceVersion."""
    body = await request_json(call, **kwargs)
    return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])


MAX_WATCH_EVENT_BYTES = 16 * 2**20
"""Longest watch event read (an apiserver object is at most about 1.5 MiB in etcd): a stream that sends more
without ending the line is abandoned with an error instead of growing without bound."""


async def watch_objects(
    call: ListCall,
    *,
    resource_version: str,
    timeout_seconds: int = 300,
    inactivity_seconds: float = 60.0,
    **kwargs: Any,
) -> AsyncIterator[tuple[str, Json]]:
    """Yield (event type, object) from a watch; BOOKMARK events are yielded too (they carry resourceVersion)."""
    try:
        response = await call(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            _request_timeout=timeout_seconds + inactivity_seconds,
            **kwargs,
        )
    except ApiException as error:
        if error.status == 410:
            raise WatchGone("resourceVersion too old", status=410) from error
        raise KubeError(f"watch failed: {error.status} {error.reason}", status=error.status) from error
    if response.status == 410:
        response.release()
        raise WatchGone("resourceVersion too old", status=410)
    if not 200 <= response.status <= 299:
        message = status_message(await response.read())
        response.release()
        raise KubeError(f"watch failed: {response.status}: {message}", status=response.status)
    # Events are read as whatever the connection has buffered and split into lines here: under load one read
    # carries many events, and a read (with its inactivity timeout) per line cost more than parsing the line.
    pieces: list[bytes] = []
    try:
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that arrives
                # as a read completes, and the watch would then never stop.
                async with asyncio.timeout(inactivity_seconds):
                    chunk = await response.content.readany()
            except TimeoutError:
                log.warning("watch silent for %.0fs; reconnecting", inactivity_seconds)
                return
            if not chunk:
                # The stream ended. An unterminated last line is an event cut off in transit: the watch resumes
                # from the last whole one.
                return
            pieces.append(chunk)
            if b"\n" not in chunk:
                # a long event arriving in pieces: joined once its end is here
                if sum(map(len, pieces)) > MAX_WATCH_EVENT_BYTES:
                    raise KubeError(f"watch event longer than {MAX_WATCH_EVENT_BYTES} bytes")
                continue
            lines = b"".join(pieces).split(b"\n")
            pieces = [lines.pop()]
            for line in lines:
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, obj = str(event.get("type")), event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code")
                    if code == 410:
                        raise WatchGone(str(obj.get("message", "resourceVersion too old")), status=410)
                    raise KubeError(f"watch error: {obj.get('message', obj)}", status=code)
                yield kind, obj
    finally:
        response.release()


@dataclass
class InformerHandlers:
    """What an informer calls: the full list after every (re-)list, then each change."""

    on_list: Callable[[list[Json]], Awaitable[None]]
    on_event: Callable[[str, Json], Awaitable[None]]


def raise_if_cancelled() -> None:
    """Raise the cancellation a library swallowed. On Python 3.11 ``asyncio.wait_for`` returns the awaited result
    when that completes just as the task is cancelled, so the CancelledError never reaches the caller (redis-py
    wraps every send in it when the client has a socket timeout); the task's ``cancelling()`` count still tells.
    Loops call this once per turn, outside any ``asyncio.timeout`` block, so a cancelled task always ends."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


_RETRIED = (HossError, aiohttp.ClientError, OSError, TimeoutError, ValueError)
"""What an informer waits out and tries again: the apiserver or the network failed, or a handler could not apply a
change (the handler's own errors of these kinds)."""


class _HandlerFailed(Exception):
    """An informer handler raised: the informer's view may have lost that change, so it lists again."""


class _EndedAtOnce(Exception):
    """The apiserver ended a watch at once with nothing in it: waited out as a failure is, so that a stream ended
    again and again never becomes a busy loop."""


@dataclass(kw_only=True)
class _Informer:
    """An informer's state between attempts: the resourceVersion to resume from and the failures since its last
    progress (a list or an event handled)."""

    name: str
    call: ListCall
    handlers: InformerHandlers
    synced: asyncio.Event | None
    relist: asyncio.Event | None
    watch_timeout_seconds: int
    inactivity_seconds: float
    first_wait: float
    max_wait: float
    kwargs: dict[str, Any]
    version: str | None = None
    failures: int = 0

    async def follow(self) -> None:
        """List when there is no version to resume from (or ``relist`` is set), then watch stream after stream, until
        something fails."""
        while True:
            raise_if_cancelled()
            try:
                if self.version is None or (self.relist is not None and self.relist.is_set()):
                    await self._list()
                await self._watch()
            except WatchGone:
                log.info("%s: watch expired (410 Gone); listing again", self.name)
                self.version = None
            except _HandlerFailed:
                self.version = None
                raise

    async def _list(self) -> None:
        items, listed = await list_objects(self.call, **self.kwargs)
        try:
            await self.handlers.on_list(items)
        except _RETRIED as error:
            raise _HandlerFailed(str(error)) from error
        self.version = listed
        self.failures = 0
        if self.synced is not None:
            self.synced.set()
        if self.relist is not None:
            self.relist.clear()

    async def _watch(self) -> None:
        assert self.version is not None  # _list set it
        opened = time.monotonic()
        events = 0
        async for kind, obj in watch_objects(
            self.call,
            resource_version=self.version,
            timeout_seconds=self.watch_timeout_seconds,
            inactivity_seconds=self.inactivity_seconds,
            **self.kwargs,
        ):
            events += 1
            self.failures = 0
            if kind != "BOOKMARK":
                try:
                    await self.handlers.on_event(kind, obj)
                except _RETRIED as error:
                    raise _HandlerFailed(str(error)) from error
                raise_if_cancelled()
            self.version = str((obj.get("metadata") or {}).get("resourceVersion") or self.version)
            if self.relist is not None and self.relist.is_set():
                return
        if not events and time.monotonic() - opened < 1.0:
            raise _EndedAtOnce

    def wait(self, _state: RetryCallState) -> float:
        """Exponential from ``first_wait`` up to ``max_wait``, counted from the last progress rather than the first
        failure: a stream that delivers and then breaks is opened again soon however often that happens."""
        self.failures += 1
        return min(self.first_wait * 2.0 ** (self.failures - 1), self.max_wait)

    def log_failure(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        if isinstance(error, _EndedAtOnce):
            return
        if isinstance(error, _HandlerFailed):
            log.warning("%s: handling a change failed (%s); listing again in %.1fs", self.name, error, wait)
            return
        what = "list" if self.version is None else f"watch from resourceVersion {self.version}"
        reason = str(error) or type(error).__name__
        log.warning("%s: %s failed (%s); retrying in %.1fs", self.name, what, reason, wait)


async def run_informer(
    name: str,
    call: ListCall,
    handlers: InformerHandlers,
    *,
    synced: asyncio.Event | None = None,
    relist: asyncio.Event | None = None,
    watch_timeout_seconds: int = 300,
    inactivity_seconds: float = 90.0,
    max_backoff_seconds: float = 8.0,
    **kwargs: Any,
) -> None:
    """List and watch forever. ``synced`` is set after the first successful list; setting ``relist`` forces a
    fresh list (e.g. when the ledger lost its data).

    The watch always resumes from the resourceVersion of the last event handled (or bookmark): after the
    apiserver ends a stream (its timeout, or "Forcing watcher close due to unresponsiveness" when this client
    fell behind), after a stream silent for ``inactivity_seconds`` (a half-dead connection; bookmarks arrive about
    once a minute), and after a network error or an apiserver restart (retried with a backoff up to
    ``max_backoff_seconds``, each failure logged once). Only 410 Gone (that version is no longer in the apiserver's
    window), a handler that failed, or ``relist`` lead to a new list.
    """
    informer = _Informer(
        name=name, call=call, handlers=handlers, synced=synced, relist=relist,
        watch_timeout_seconds=watch_timeout_seconds, inactivity_seconds=inactivity_seconds,
        first_wait=min(0.5, max_backoff_seconds), max_wait=max_backoff_seconds, kwargs=kwargs,
    )
    retrying = AsyncRetrying(
        # Never given up: an informer outlives any apiserver outage, and the component that runs it has nothing
        # better to do than wait (the resolver's webhook would otherwise exit and come back in CrashLoopBackOff).
        stop=stop_never,
        wait=informer.wait,
        retry=retry_if_exception_type((_HandlerFailed, _EndedAtOnce, *_RETRIED)),
        before_sleep=informer.log_failure,
    )
    async for attempt in retrying:
        with attempt:
            await informer.follow()


async def run_crd_informer(
    name: str,
    call: ListCall,
    handlers: InformerHandlers,
    *,
    kind: str,
    recheck_seconds: float,
    found: str = "",
    on_missing: Callable[[bool], Awaitable[None]] | None = None,
    synced: asyncio.Event | None = None,
) -> None:
    """`run_informer` on a custom resource whose CRD may not be installed. While its list fails (404: no CRD; any
    other error is logged), ``on_missing(crd_absent)`` runs and the list is tried again every ``recheck_seconds``;
    once it answers, ``found`` is logged and the informer runs, so installing the CRD later needs no restart."""
    # Never given up either: the CRD may be installed at any time.
    async for attempt in AsyncRetrying(stop=stop_never, wait=wait_fixed(recheck_seconds),
                                       retry=retry_if_exception_type(KubeError)):
        with attempt:
            try:
                await list_objects(call, limit=1)
            except KubeError as error:
                if error.status != 404:
                    log.warning("cannot list %s: %s", kind, error)
                if on_missing is not None:
                    await on_missing(error.status == 404)
                raise
    if found:
        log.info("%s", found)
    await run_informer(name, call, handlers, synced=synced)
