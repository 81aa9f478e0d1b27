"""Process supervision for the local plane: start a program in a session of its own with its output in a log,
wait until it is healthy, stop it (its whole session) again.

A program runs in its own session, so it outlives the Python process that started it (a plane outlives the
``python -m dev local up`` that started it). A recorded pid is signalled only while its command line still names the
program (pids get reused). Children started by this Python process are kept until they are stopped, so that they
are reaped, and so that a Popen object is never collected while its process runs (Python reports that as a
ResourceWarning).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dev.local.errors import PlaneError
from dev.local.state import Process

HEALTH_TIMEOUT_SECONDS = 90.0

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    log_dir: Path,
    cwd: Path,
    port: int = 0,
    binary: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Process:
    """Start ``argv`` in a session of its own, its output appended to ``log_dir/<name>.log``; ``env`` is added to
    this process's environment; ``binary`` (default: the program's file name) is how its command line is
    recognised later."""
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )
    _CHILDREN[child.pid] = child
    return Process(name=name, pid=child.pid, binary=binary or Path(argv[0]).name, log=str(log), port=port)


def wait_healthy(process: Process, healthy: Callable[[], bool], *,
                 timeout: float = HEALTH_TIMEOUT_SECONDS) -> None:
    """Until ``healthy()`` says yes; raise with the log's tail when the process exits first or ``timeout`` passes.
    Only a process this Python process started can be waited for (its exit is seen through its Popen)."""
    child = _CHILDREN.get(process.pid)
    if child is None:
        raise PlaneError(f"{process.name} was not started by this process; cannot wait for it")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = child.poll()
        if code is not None:
            raise PlaneError(
                f"{process.name} exited with code {code} while starting; read {process.log}:\n{tail(Path(process.log))}"
            )
        if healthy():
            return
        time.sleep(0.25)
    raise PlaneError(
        f"{process.name} did not become healthy within {timeout:.0f}s; read {process.log}:\n{tail(Path(process.log))}"
    )


def pid_alive(pid: int, binary: str) -> bool:
    """True when ``pid`` runs and is still the program we started (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie (state Z) has exited and only waits for its parent to reap it.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and binary.encode() in cmdline


def alive(process: Process) -> bool:
    return pid_alive(process.pid, process.binary)


def terminate(process: Process, *, grace_seconds: float = 10.0) -> bool:
    """Stop ``process`` (its whole session) if it is still ours: SIGTERM, then SIGKILL after ``grace_seconds``;
    True when something was stopped."""
    child = _CHILDREN.pop(process.pid, None)
    try:
        if not alive(process):
            return False
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if (child is not None and child.poll() is not None) or not alive(process):
                    return True
                time.sleep(0.1)
        raise PlaneError(f"{process.name} (pid {process.pid}) did not stop after SIGKILL")
    finally:
        if child is not None and child.poll() is None:
            # Reap it: the process is gone or going (SIGKILL was the last word).
            child.wait(timeout=10)


def terminate_all(processes: Sequence[Process]) -> None:
    """Stop several at once: each gets SIGTERM first, then each is waited for (and killed if it must be)."""
    for process in processes:
        if alive(process):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        terminate(process)


def tail(path: Path, lines: int = 15) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(content[-lines:])


def taskset() -> str:
    """The taskset program (util-linux), which pins a process to cores."""
    found = shutil.which("taskset")
    if found is None:
        raise PlaneError("taskset not found on PATH; install util-linux to pin a worker to a core")
    return found
