"""hoss's console scripts as an operator runs them (from an installed wheel's venv, or inside the image), started
against the local plane with the command lines the plane itself uses (dev/local/components.py): the console
script takes the place of ``python -m <module>``, so nothing of the checkout is on the path."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from dev.local import components, credentials, processes
from dev.local.health import healthy
from dev.local.plane import POLICIES_FILE, ROUTING_FILE, LocalPlane
from dev.local.ports import free_port
from dev.local.state import PlaneFiles, PlaneState, Process
from dev.local.webhooks import LANE_HOSTS
from tests.waiting import until

REPOSITORY = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["scripts"]
"""Every console script of the distribution, by name: its entry point (module:function)."""
SERVICES = ("hoss-resolver", "hoss-dispatcher", "hoss-worker", "hoss-rescheduler")
"""The console scripts that are long-running services; the remaining one, ``hoss``, is the operator's CLI."""

Launcher = Callable[[str, dict[str, str]], list[str]]
"""How a console script is run: its name and environment in, the command line's start out (its arguments follow)."""


def outside_environment() -> dict[str, str]:
    """This process's environment without what would point a command at the checkout or the dev venv
    (PYTHONPATH, PYTHONHOME, VIRTUAL_ENV) or change hoss's settings (HOSS_*, e.g. a shell's local-plane exports)."""
    return {name: value for name, value in os.environ.items()
            if name not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"} and not name.startswith("HOSS_")}


@dataclass(frozen=True)
class Service:
    script: str
    arguments: list[str]
    """What follows the console script on its command line."""
    env: dict[str, str]
    port: int


def service(plane: LocalPlane, script: str, *, name: str) -> Service:
    """``script`` as the plane would start it (its kubeconfig, its Redis ACL user, the plane's policies and
    routing files, a free port), under the Lease identity or worker id ``name``."""
    module = SCRIPTS[script].partition(":")[0]
    files, state, port = plane.files, plane.state(), free_port()
    identity = "hoss-worker" if script == "hoss-worker" else script
    if script == "hoss-resolver":
        serving = credentials.resolver_serving_pair(files, ip_addresses=LANE_HOSTS)
        argv = components.resolver_argv(files, hosts=LANE_HOSTS, port=port, serving=serving, enforce="all",
                                        routing_file=ROUTING_FILE, extra_args=())
    elif script == "hoss-worker":
        argv = components.worker_argv(name, files, policies=("default",), policies_file=POLICIES_FILE, port=port,
                                      extra_args=())
    else:
        argv = components.service_argv(module, files, identity=identity, name=name, port=port, extra_args=())
    launched_as = [sys.executable, "-m", module]
    if argv[:3] != launched_as:
        raise AssertionError(f"the plane no longer starts {script} as {' '.join(launched_as)}: {argv[:3]}")
    return Service(script=script, arguments=argv[3:], env={"HOSS_REDIS_URL": state.redis_url_for(identity)},
                   port=port)


@dataclass(frozen=True)
class Started:
    service: Service
    process: Process
    """As the plane's health checks know it: its name tells which check (dev/local/health.py)."""
    popen: subprocess.Popen[bytes]


@contextlib.asynccontextmanager
async def running(plane: LocalPlane, services: Sequence[Service], *, launcher: Launcher, log_dir: Path,
                  suffix: str, timeout: float = 90.0) -> AsyncIterator[list[Started]]:
    """Start every one of ``services`` through ``launcher`` at once (each in a session of its own, its output in
    ``log_dir/<script>-<suffix>.log``) and wait until each answers its health check: the resolver's /readyz
    (synced with the apiserver and Redis), the others' /healthz. Whatever is still running afterwards is killed;
    `stop` is the graceful way."""
    started: list[Started] = []
    try:
        for one in services:
            started.append(_launch(one, launcher=launcher, log_dir=log_dir, name=f"{one.script}-{suffix}"))
        state = plane.state()
        for each in started:
            await until(functools.partial(_answers, each, state, plane.files), timeout=timeout,
                        what=f"{each.process.name} to answer its health check (log {each.process.log})")
        yield started
    finally:
        for each in started:
            kill_session(each.popen.pid)
            each.popen.wait(timeout=10)


def kill_session(session: int) -> None:
    """SIGKILL to every process of ``session`` (each started one leads its own): a process group is not enough,
    since tini puts the service in a group of its own."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if os.getsid(int(proc.name)) == session:
                os.kill(int(proc.name), signal.SIGKILL)


def _launch(one: Service, *, launcher: Launcher, log_dir: Path, name: str) -> Started:
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen([*launcher(one.script, one.env), *one.arguments], stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=log_dir,
                                 start_new_session=True, env={**outside_environment(), **one.env})
    process = Process(name=name, pid=popen.pid, binary=one.script, log=str(log), port=one.port)
    return Started(service=one, process=process, popen=popen)


async def _answers(started: Started, state: PlaneState, files: PlaneFiles) -> tuple[bool, str]:
    code = started.popen.poll()
    if code is not None:
        pytest.fail(f"{started.process.name} exited with code {code} while starting:\n"
                    f"{processes.tail(Path(started.process.log), 30)}", pytrace=False)
    return await asyncio.to_thread(healthy, started.process, state, files), "no answer yet"


def stop(started: Started, *, pid: int | None = None, timeout: float = 30.0) -> int:
    """SIGTERM to ``pid`` (default: the process started), as a container runtime stops a container by signalling
    its first process; the exit code of the process started."""
    os.kill(pid or started.popen.pid, signal.SIGTERM)
    try:
        return started.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{started.process.name} did not stop within {timeout:g} s of SIGTERM:\n"
                    f"{processes.tail(Path(started.process.log), 30)}", pytrace=False)
