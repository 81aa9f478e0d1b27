"""Configuration files that take effect again when they change: a worker's policies file, the resolver's routing file.

Kubernetes updates a mounted ConfigMap by swapping a symlink: the file is a link through ``..data`` into a timestamped
directory, and ``..data`` is pointed at a new one at once. The path stays, the content changes in one step, and the
mtime a reader sees need not move. So a `ConfigFile` is polled, as controller-runtime's certwatcher polls its files:
every ``config_reload_seconds`` `follow` reads it and compares the SHA-256 of its bytes with the content it last saw.
The files are a few KiB; inotify would see the swap on the directory, not on the file.

A changed file is parsed with the parser that read it at start. Accepted, it is the new `ConfigFile.config` and the
component's ``apply`` takes it (when its users see it is the component's choice: a worker between two batches);
refused, the configuration in use stays. Either way the change is reported once (`Reporter`): a log line,
``hoss_<component>_config_reloads_total{result}``, and a Kubernetes Event on the component's own Pod, or on its
namespace (`hoss.kube.events.EventTarget`); `ConfigFile.status` is the file's entry in the component's /status.

Invariants: `ConfigFile.config` is always a configuration the parser accepted whole; a content refused once (or a read
that failed the same way) is neither parsed nor reported again until the file changes.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter

from hoss.errors import HossError
from hoss.kube.events import EventTarget
from hoss.model.objects import Json

log = logging.getLogger(__name__)

C = TypeVar("C")

SUCCESS: Final = "success"
"""A changed file was parsed and is in use."""
FAILURE: Final = "failure"
"""A changed file could not be read or parsed: the configuration in use stays."""
RELOADED: Final = "ConfigReloaded"
KEPT: Final = "ConfigReloadFailed"
"""The reasons of the Events that report a reload (Normal) and a refused file (Warning)."""


class ConfigFileError(HossError):
    """A configuration file that cannot be read at start; the message names the file and why."""


@dataclass(frozen=True)
class Reload:
    """What one change of a file did: `result` is SUCCESS or FAILURE, `message` says so in a sentence."""

    result: str
    message: str


def _read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


class ConfigFile(Generic[C]):
    """One configuration file at `path`, what `parse` made of the content in use (`config`), and how its changes
    went. `what` names the content in messages ("policies", "routing rules"); `parse` takes the file's text and
    raises on anything it cannot use, naming the field. `read` and `clock` are the file system and the time (tests
    pass their own)."""

    def __init__(self, path: str, *, what: str, parse: Callable[[str], C],
                 read: Callable[[str], bytes] = _read_bytes, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.what = what
        self._parse = parse
        self._read = read
        self._clock = clock
        self.sha256 = ""
        """SHA-256 of the content in use."""
        self.resolved = path
        """Where `path` led when the content in use was read (a ConfigMap's timestamped directory)."""
        self.loaded_unix = 0.0
        self.reloads = 0
        """Changes taken since start."""
        self.failures = 0
        """Changes refused since start."""
        self.last_error: str | None = None
        self.last_error_unix: float | None = None
        self.refused = False
        """The file as last read is not the content in use (`last_error` says why)."""
        self._seen = ""
        """The file as last read: its SHA-256, or the error reading it gave."""

    @property
    def config(self) -> C:
        """The configuration in use."""
        return self._config

    def load(self) -> C:
        """Read and parse the file at start: the parser's error propagates (the component does not start), and so
        does a `ConfigFileError` for a file that cannot be read."""
        try:
            data = self._read(self.path)
        except OSError as error:
            raise ConfigFileError(f"cannot read the {self.what} file {self.path}: {error.strerror or error}") \
                from error
        self._take(self._parse(data.decode("utf-8")), hashlib.sha256(data).hexdigest())
        return self._config

    def poll(self) -> Reload | None:
        """Read the file; None when it is as last read, else what its change did (`config` is the new content
        after SUCCESS, and still the old after FAILURE)."""
        try:
            data = self._read(self.path)
        except OSError as error:
            return self._refuse(f"unreadable: {error}", f"cannot read {self.path}: {error.strerror or error}")
        digest = hashlib.sha256(data).hexdigest()
        if digest == self._seen:
            return None
        if digest == self.sha256:  # a refused edit was undone: the file is the content in use again
            self._seen = digest
            self.refused = False
            return None
        try:
            config = self._parse(data.decode("utf-8"))
        except Exception as error:  # whatever the parser (or a plugin it builds) raises, the old content stays
            return self._refuse(digest, str(error) or type(error).__name__)
        self._take(config, digest)
        self.reloads += 1
        return Reload(SUCCESS, f"reloaded the {self.what} from {self.path} (sha256 {digest[:12]})")

    def status(self) -> Json:
        """The file's entry in /status."""
        return {"path": self.path, "resolved": self.resolved, "sha256": self.sha256, "loaded_unix": self.loaded_unix,
                "reloads": self.reloads, "failures": self.failures, "refused": self.refused,
                "last_error": self.last_error, "last_error_unix": self.last_error_unix}

    def _take(self, config: C, digest: str) -> None:
        self._config = config
        self.sha256 = self._seen = digest
        self.resolved = os.path.realpath(self.path)
        self.loaded_unix = self._clock()
        self.refused = False

    def _refuse(self, seen: str, reason: str) -> Reload | None:
        if seen == self._seen:
            return None
        self._seen = seen
        self.failures += 1
        self.refused = True
        self.last_error, self.last_error_unix = reason, self._clock()
        return Reload(FAILURE, f"kept the old {self.what}: {reason}")


def reload_counter(registry: CollectorRegistry, component: str) -> Counter:
    """``hoss_<component>_config_reloads_total{result}``, both results exported from the start (at 0)."""
    counter = Counter(f"hoss_{component}_config_reloads",
                      "Changes of the component's configuration file (a worker's policies, the resolver's routing "
                      "rules): 'success' taken, 'failure' refused with the old content kept (/status says why)",
                      ["result"], registry=registry)
    for result in (SUCCESS, FAILURE):
        counter.labels(result)
    return counter


class Reporter:
    """Says what a reload did: one log line, the counter, and an Event about `target` from `component` posted
    through `post` (none without it)."""

    def __init__(self, *, counter: Counter, target: EventTarget, component: str,
                 post: Callable[[Json], Awaitable[None]] | None) -> None:
        self.counter = counter
        self.target = target
        self.component = component
        self.post = post

    async def report(self, reload: Reload) -> None:
        failed = reload.result == FAILURE
        log.log(logging.WARNING if failed else logging.INFO, "%s", reload.message)
        self.counter.labels(reload.result).inc()
        if self.post is not None:
            await self.post(self.target.event(reason=KEPT if failed else RELOADED, message=reload.message,
                                              component=self.component, warning=failed))


async def follow(file: ConfigFile[C], *, every: float, apply: Callable[[C], None],
                 report: Callable[[Reload], Awaitable[None]],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Every `every` seconds, until cancelled: poll `file`; hand a new content to `apply`, then `report` the
    change."""
    while True:
        await sleep(every)
        reload = file.poll()
        if reload is None:
            continue
        if reload.result == SUCCESS:
            apply(file.config)
        await report(reload)
