"""Leader election on a coordination.k8s.io/v1 Lease, so that of several replicas exactly one does the work.

Used by the dispatcher (one replica dispatches) and by the resolver (one replica runs the ledger sync).

The decision what to do with a Lease is pure (`decide`, `lease_object`, `released_object`); `LeaderElector` is
the thin loop that reads the Lease, writes it back and keeps `leading` / `following` up to date.

Invariants:
- Every write is a create (fails with 409 when the Lease exists) or a replace carrying the resourceVersion that
  was read (fails with 409 when anyone wrote in between), so of two replicas racing for one Lease only one wins.
- A Lease may be taken over only when its holder is empty (released) or ``renewTime + leaseDurationSeconds`` is
  in the past. Replicas compare wall clocks here, so their clocks must agree to well under the lease duration.
- A leader that has not renewed within ``renew_deadline`` (< lease duration, counted from the start of its last
  successful renewal on the monotonic clock) steps down before any other replica may take over.
- A leader's term (`LeaderElector.term`) is the Lease's ``leaseTransitions`` while it holds it: every take-over
  adds one, so of two leaders the later has the higher term. A Lease deleted and created again starts at 0; the
  leader then raises its term above what its writes found (`LeaderElector.raise_term`, a conditional write too).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import enum
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from hoss.errors import SpecError
from hoss.kube.client import KubeError, raise_if_cancelled
from hoss.model.objects import Json

log = logging.getLogger(__name__)


MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""Kubernetes MicroTime, e.g. ``2026-11-22T08:00:00.000000Z``."""


class LeaseSpecError(SpecError):
    """A Lease whose shape is not what the apiserver would return; `field` is the JSON path inside the Lease."""


class LeaseConflict(KubeError):
    """The apiserver refused a Lease write with 409: someone else created or updated it first."""


def format_micro_time(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime(MICRO_TIME_FORMAT)


def parse_micro_time(value: object, *, field: str) -> datetime.datetime | None:
    """A MicroTime (or plain RFC 3339 time) from the apiserver; None when absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise LeaseSpecError(field=field, reason=f"expected an RFC 3339 time, got {type(value).__name__}")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError as error:
        raise LeaseSpecError(field=field, reason=f"invalid RFC 3339 time {value!r}") from error
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease the election reads; `raw` is the whole object, kept so a replace loses no field."""

    holder: str
    duration_seconds: int
    acquire_time: datetime.datetime | None
    renew_time: datetime.datetime | None
    transitions: int
    resource_version: str
    raw: Json = field(compare=False, repr=False)

    def expires_at(self) -> datetime.datetime | None:
        last = self.renew_time or self.acquire_time
        return None if last is None else last + datetime.timedelta(seconds=self.duration_seconds)


def _int(value: object, *, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise LeaseSpecError(field=field, reason=f"expected an integer, got {value!r}")
    return value


def parse_lease(raw: Json) -> LeaseRecord:
    """The election's view of a raw Lease; raises `LeaseSpecError` naming the field on a malformed one."""
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict):
        raise LeaseSpecError(field="metadata", reason="missing")
    version = metadata.get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise LeaseSpecError(field="metadata.resourceVersion", reason="missing")
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        raise LeaseSpecError(field="spec", reason=f"expected an object, got {type(spec).__name__}")
    holder = spec.get("holderIdentity") or ""
    if not isinstance(holder, str):
        raise LeaseSpecError(field="spec.holderIdentity", reason=f"expected a string, got {holder!r}")
    duration = _int(spec.get("leaseDurationSeconds"), field="spec.leaseDurationSeconds", default=0)
    if holder and duration <= 0:
        raise LeaseSpecError(field="spec.leaseDurationSeconds", reason="a held Lease needs a positive duration")
    return LeaseRecord(
        holder=holder,
        duration_seconds=duration,
        acquire_time=parse_micro_time(spec.get("acquireTime"), field="spec.acquireTime"),
        renew_time=parse_micro_time(spec.get("renewTime"), field="spec.renewTime"),
        transitions=_int(spec.get("leaseTransitions"), field="spec.leaseTransitions", default=0),
        resource_version=version,
        raw=raw,
    )


class Action(enum.Enum):
    CREATE = "create"
    """No Lease yet: create it with us as holder."""
    RENEW = "renew"
    """We hold it: move renewTime forward."""
    ACQUIRE = "acquire"
    """Released or expired: take it over."""
    FOLLOW = "follow"
    """Someone else holds a live Lease: wait."""


def decide(lease: LeaseRecord | None, *, identity: str, now: datetime.datetime) -> Action:
    """What replica `identity` should do with `lease` at wall-clock time `now`. Pure."""
    if lease is None:
        return Action.CREATE
    if lease.holder == identity:
        return Action.RENEW
    if not lease.holder:
        return Action.ACQUIRE
    expires = lease.expires_at()
    if expires is None or expires <= now:
        return Action.ACQUIRE
    return Action.FOLLOW


def lease_object(
    *,
    action: Action,
    previous: LeaseRecord | None,
    name: str,
    namespace: str,
    identity: str,
    duration_seconds: int,
    now: datetime.datetime,
) -> Json:
    """The Lease to create or to replace ``previous`` with, for CREATE, RENEW or ACQUIRE. Pure.

    A replace carries the read resourceVersion, which is what makes the write conditional.
    """
    stamp = format_micro_time(now)
    if action is Action.CREATE:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "holderIdentity": identity,
                "leaseDurationSeconds": duration_seconds,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }
    if previous is None or action not in (Action.RENEW, Action.ACQUIRE):
        raise ValueError(f"no Lease to write for {action.value} of {previous!r}")
    body = copy.deepcopy(previous.raw)
    spec = body.setdefault("spec", {})
    spec.update({"holderIdentity": identity, "leaseDurationSeconds": duration_seconds, "renewTime": stamp})
    if action is Action.ACQUIRE:
        spec["acquireTime"] = stamp
        spec["leaseTransitions"] = previous.transitions + 1
    body["metadata"]["resourceVersion"] = previous.resource_version
    return body


def raised_object(previous: LeaseRecord, *, above: int) -> Json:
    """``previous`` with its leaseTransitions set to ``above + 1``, carrying the read resourceVersion. Pure."""
    body = copy.deepcopy(previous.raw)
    body.setdefault("spec", {})["leaseTransitions"] = above + 1
    body["metadata"]["resourceVersion"] = previous.resource_version
    return body


def released_object(previous: LeaseRecord, *, now: datetime.datetime) -> Json:
    """``previous`` handed back: no holder, so another replica takes over at once instead of after expiry. Pure."""
    body = copy.deepcopy(previous.raw)
    spec = body.setdefault("spec", {})
    stamp = format_micro_time(now)
    spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": stamp, "acquireTime": stamp})
    body["metadata"]["resourceVersion"] = previous.resource_version
    return body


class LeaseAPI(Protocol):
    """The three Lease calls the election makes, on the one Lease `namespace`/`name`."""

    name: str
    namespace: str

    async def read(self) -> Json | None:
        """The Lease, or None when it does not exist."""

    async def create(self, body: Json) -> Json:
        """Create the Lease; `LeaseConflict` when it already exists."""

    async def replace(self, body: Json) -> Json:
        """Replace the Lease; `LeaseConflict` when its resourceVersion is no longer current."""


class KubeLeaseAPI:
    """`LeaseAPI` on the apiserver through kubernetes_asyncio, with raw JSON in and out."""

    def __init__(self, api: client.ApiClient, *, name: str, namespace: str, request_timeout: float) -> None:
        # Typed as Any: the generated client declares V1Lease bodies, and this module sends and reads raw JSON.
        self._leases: Any = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self._timeout = request_timeout

    async def read(self) -> Json | None:
        return await self._call(
            "read", self._leases.read_namespaced_lease(self.name, self.namespace, **self._options()), missing_ok=True
        )

    async def create(self, body: Json) -> Json:
        reply = await self._call(
            "create", self._leases.create_namespaced_lease(self.namespace, body, **self._options())
        )
        if reply is None:
            raise KubeError(f"create of Lease {self.namespace}/{self.name} returned nothing")
        return reply

    async def replace(self, body: Json) -> Json:
        reply = await self._call(
            "replace", self._leases.replace_namespaced_lease(self.name, self.namespace, body, **self._options())
        )
        if reply is None:
            raise KubeError(f"Lease {self.namespace}/{self.name} vanished during replace", status=404)
        return reply

    def _options(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout}

    async def _call(self, verb: str, request: Any, *, missing_ok: bool = False) -> Json | None:
        # With _preload_content=False the client returns error statuses instead of raising: check them here.
        try:
            response = await request
        except ApiException as error:
            raise KubeError(f"{verb} Lease failed: {error.status} {error.reason}", status=error.status) from error
        try:
            status = int(response.status)
            body = await response.read()
        finally:
            response.release()
        if status == 404 and missing_ok:
            return None
        if status == 409:
            raise LeaseConflict(f"{verb} Lease {self.namespace}/{self.name}: {_message(body)}", status=409)
        if not 200 <= status < 300:
            raise KubeError(f"{verb} Lease {self.namespace}/{self.name} failed: {status} {_message(body)}",
                            status=status)
        try:
            reply = json.loads(body)
        except json.JSONDecodeError as error:
            raise KubeError(f"{verb} Lease {self.namespace}/{self.name}: reply is not JSON") from error
        if not isinstance(reply, dict):
            raise KubeError(f"{verb} Lease {self.namespace}/{self.name}: reply is not an object")
        return reply


def _message(body: bytes) -> str:
    try:
        status = json.loads(body)
    except json.JSONDecodeError:
        return body[:200].decode(errors="replace")
    return str(status.get("message", status)) if isinstance(status, dict) else str(status)


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class LeaderElector:
    """Holds or watches one Lease. Exactly one of `leading` and `following` is set at any time."""

    def __init__(
        self,
        api: LeaseAPI,
        *,
        identity: str,
        lease_duration_seconds: int,
        renew_deadline_seconds: float,
        renew_interval_seconds: float,
        wall: Callable[[], datetime.datetime] = _utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.identity = identity
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.renew_interval_seconds = renew_interval_seconds
        self.leading = asyncio.Event()
        self.following = asyncio.Event()
        self.following.set()
        self.holder: str | None = None
        """The holder as last read (or written); None while unknown."""
        self._wall = wall
        self._monotonic = monotonic
        self._record: LeaseRecord | None = None
        self._renewed_at: float | None = None
        self._writing = asyncio.Lock()
        """Held around each read-and-write of the Lease, so that a renewal and `raise_term` never race."""

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set()

    @property
    def term(self) -> int | None:
        """This leader's term: the Lease's leaseTransitions as it last wrote them; None while it does not lead."""
        record = self._record
        if not self.is_leader or record is None or record.holder != self.identity:
            return None
        return record.transitions

    async def raise_term(self, *, above: int) -> int | None:
        """While leading: write the Lease with leaseTransitions ``above + 1`` (a replace carrying the read
        resourceVersion, so it fails when anyone wrote the Lease since) and return the new term. None when this
        replica does not lead, or found on writing that another took the Lease over (it then follows)."""
        async with self._writing:
            record = self._record
            if self.term is None or record is None:
                return None
            if record.transitions > above:
                return record.transitions
            try:
                async with asyncio.timeout(self.renew_deadline_seconds):
                    written = await self.api.replace(raised_object(record, above=above))
                self._record = parse_lease(written)
            except LeaseConflict as error:
                self._record = None
                self._follow(None, why=f"another replica took the Lease over ({error})")
                return None
            except (KubeError, SpecError, aiohttp.ClientError, OSError, TimeoutError) as error:
                log.warning("cannot raise the Lease's term above %d: %s", above, error or type(error).__name__)
                return None
        log.warning("raised the Lease's term to %d, above the %d a write found (the Lease was created again)",
                    self._record.transitions, above)
        return self._record.transitions

    async def run(self) -> None:
        """Try to acquire or renew every renew interval, forever."""
        while True:
            await self.try_once()
            raise_if_cancelled()
            await asyncio.sleep(self.renew_interval_seconds)

    async def try_once(self) -> bool:
        """One round: read the Lease, then create, renew, take over or follow. True when this replica leads."""
        async with self._writing:
            return await self._try_once()

    async def _try_once(self) -> bool:
        started = self._monotonic()
        now = self._wall()
        try:
            async with asyncio.timeout(self._attempt_timeout(started)):
                raw = await self.api.read()
                record = None if raw is None else parse_lease(raw)
                action = decide(record, identity=self.identity, now=now)
                if action is Action.FOLLOW:
                    assert record is not None  # decide follows only a Lease that exists
                    self._record = record
                    self._follow(record.holder, why=f"the Lease is held by {record.holder}")
                    return False
                body = lease_object(
                    action=action, previous=record, name=self.api.name, namespace=self.api.namespace,
                    identity=self.identity, duration_seconds=self.lease_duration_seconds, now=now,
                )
                written = await (self.api.create(body) if action is Action.CREATE else self.api.replace(body))
                self._record = parse_lease(written)
        except LeaseConflict as error:
            self._record = None
            self._follow(None, why=f"another replica wrote the Lease first ({error})")
            return False
        except (KubeError, SpecError, aiohttp.ClientError, OSError, TimeoutError) as error:
            self._renewal_failed(error)
            return self.is_leader
        self._renewed_at = started
        self._lead(action)
        return True

    async def release(self) -> None:
        """Stop leading and hand the Lease back (empty holder), so another replica need not wait for expiry."""
        record, was_leading = self._record, self.is_leader
        self._follow(None, why="shutting down", expected=True)
        if not was_leading or record is None or record.holder != self.identity:
            return
        try:
            async with asyncio.timeout(self.renew_deadline_seconds):
                await self.api.replace(released_object(record, now=self._wall()))
        except LeaseConflict:
            log.info("Lease changed hands before release; nothing to hand back")
        except (KubeError, aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot release the Lease (it expires by itself in %ds): %s", record.duration_seconds, error)
        else:
            self.holder = ""
            log.info("released the Lease")

    def _attempt_timeout(self, started: float) -> float:
        # A leader's attempt must end by its renew deadline, so that it steps down in time even when a call hangs.
        if self.is_leader and self._renewed_at is not None:
            return max(self._renewed_at + self.renew_deadline_seconds - started, 0.001)
        return self.renew_deadline_seconds

    def _renewal_failed(self, error: BaseException) -> None:
        if not self.is_leader:
            log.warning("Lease check failed: %s", error or type(error).__name__)
            return
        assert self._renewed_at is not None
        silent = self._monotonic() - self._renewed_at
        if silent >= self.renew_deadline_seconds:
            self._follow(None, why=f"could not renew the Lease for {silent:.1f}s ({error or type(error).__name__})")
        else:
            log.warning("cannot renew the Lease (still leading, %.1fs left): %s",
                        self.renew_deadline_seconds - silent, error or type(error).__name__)

    def _lead(self, action: Action) -> None:
        self.holder = self.identity
        if not self.is_leader:
            transitions = self._record.transitions if self._record else 0
            log.info("became leader as %s (%s; lease transitions %d)", self.identity, action.value, transitions)
        self.following.clear()
        self.leading.set()

    def _follow(self, holder: str | None, *, why: str, expected: bool = False) -> None:
        self.holder = holder
        if self.is_leader:
            log.log(logging.INFO if expected else logging.WARNING, "stopped leading: %s", why)
            self._renewed_at = None
        self.leading.clear()
        self.following.set()



class LeaseSettings(Protocol):
    """The Lease settings every leader-elected service has (fields of its settings model)."""

    @property
    def lease_name(self) -> str: ...
    @property
    def lease_namespace(self) -> str: ...
    @property
    def identity(self) -> str: ...
    @property
    def lease_duration_seconds(self) -> int: ...
    @property
    def renew_deadline_seconds(self) -> float: ...
    @property
    def renew_interval_seconds(self) -> float: ...


def lease_elector(api: client.ApiClient, settings: LeaseSettings) -> LeaderElector:
    """The elector of a service on the Lease its settings name; a Lease request is given up after the renew
    deadline, since a leader that cannot renew by then stops leading anyway."""
    return LeaderElector(
        KubeLeaseAPI(api, name=settings.lease_name, namespace=settings.lease_namespace,
                     request_timeout=settings.renew_deadline_seconds),
        identity=settings.identity,
        lease_duration_seconds=settings.lease_duration_seconds,
        renew_deadline_seconds=settings.renew_deadline_seconds,
        renew_interval_seconds=settings.renew_interval_seconds,
    )
