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


class _HandlerFailed(Exception):
    """An informer handler raised: the informer's view may have lost that change, so it lists again."""


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
    ``max_backoff_seconds``). Only 410 Gone (that version is no longer in the apiserver's window), a handler that
    failed, or ``relist`` lead to a new list.
    """
    first_backoff = min(0.5, max_backoff_seconds)
    backoff = first_backoff
    version: str | None = None
    while True:
        raise_if_cancelled()
        try:
            if version is None or (relist is not None and relist.is_set()):
                items, listed = await list_objects(call, **kwargs)
                try:
                    await handlers.on_list(items)
                except (HossError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                    raise _HandlerFailed(str(error)) from error
                version = listed
                if synced is not None:
                    synced.set()
                if relist is not None:
                    relist.clear()
                backoff = first_backoff
            opened = time.monotonic()
            events = 0
            async for kind, obj in watch_objects(
                call,
                resource_version=version,
                timeout_seconds=watch_timeout_seconds,
                inactivity_seconds=inactivity_seconds,
                **kwargs,
            ):
                events += 1
                backoff = first_backoff
                if kind != "BOOKMARK":
                    try:
                        await handlers.on_event(kind, obj)
                    except (HossError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                        raise _HandlerFailed(str(error)) from error
                    raise_if_cancelled()
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if relist is not None and relist.is_set():
                    break
            if not events and time.monotonic() - opened < 1.0:
                # A stream the apiserver ends at once, again and again, must not become a busy loop.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff_seconds)
        except WatchGone:
            log.info("%s: watch expired (410 Gone); listing again", name)
            version = None
        except _HandlerFailed as error:
            log.warning("%s: handling a change failed (%s); listing again in %.1fs", name, error, backoff)
            version = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_seconds)
        except (HossError, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
            what = "list" if version is None else f"watch from resourceVersion {version}"
            log.warning("%s: %s failed (%s); retrying in %.1fs", name, what, error or type(error).__name__, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_seconds)


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
    while True:
        try:
            await list_objects(call, limit=1)
        except KubeError as error:
            if error.status != 404:
                log.warning("cannot list %s: %s", kind, error)
            if on_missing is not None:
                await on_missing(error.status == 404)
            await asyncio.sleep(recheck_seconds)
            continue
        if found:
            log.info("%s", found)
        await run_informer(name, call, handlers, synced=synced)
