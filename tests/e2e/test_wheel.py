"""The wheel an operator installs, installed alone into a clean venv: what it holds, every console script's
--help, and each service started from that venv against the local plane until it answers its health check, then
stopped as the kubelet stops it.

The wheel is built from a copy of the checkout (dev tools included, so that leaving them out is the layout's
doing), and the venv is made and filled with nothing of the checkout on its path. Its dependencies come from a
wheel cache outside the repository (`WHEEL_CACHE`): pip downloads into it only what is missing, so a warm run
installs offline.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from dev.local.clean import wheel_cache
from dev.local.plane import LocalPlane
from tests.e2e.console_scripts import (
    REPOSITORY,
    SCRIPTS,
    SERVICES,
    outside_environment,
    running,
    service,
    stop,
)

WHEEL_CACHE = wheel_cache()
"""Wheels of hoss's dependencies and build requirements, kept between runs (`make clean-all` removes them)."""
OPERATOR_PACKAGES = {"hoss", "resolver", "dispatcher", "workers", "rescheduler", "deploy"}
"""The top-level packages an operator installs; the local plane, the demo and the benchmark (dev, bench) and the
tests are not among them."""
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc", "*.egg-info", ".mypy_cache",
                                  ".ruff_cache", ".pytest_cache", ".hypothesis", ".import_linter_cache", "build",
                                  "dist", "artifacts")


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    workdir: Path
    """An empty directory the commands run in: nothing of the checkout is importable from there."""

    def script(self, name: str) -> Path:
        return self.venv / "bin" / name

    def run(self, argv: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.workdir, env=outside_environment(), capture_output=True,
                              text=True, timeout=timeout, check=False)


def _pip(*args: str, what: str) -> None:
    """The dev venv's pip; the test fails with pip's words when it does."""
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          env=outside_environment(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} failed: pip {' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}",
                    pytrace=False)


def _offline(*args: str) -> bool:
    """pip with only the wheel cache to draw from; whether it succeeded (when not, the cache lacks something)."""
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args, "--no-index",
                           "--find-links", str(WHEEL_CACHE)], env=outside_environment(), capture_output=True,
                          check=False)
    return done.returncode == 0


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """hoss's wheel, built from a copy of the checkout and installed with its dependencies, alone, into a new
    venv (no pip in it: the dev venv's pip installs into it with --python)."""
    started = time.monotonic()
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv, workdir = root / "source", root / "dist", root / "venv", root / "work"
    shutil.copytree(REPOSITORY, source, ignore=LEFT_OUT)
    workdir.mkdir()
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    build_wheel = ("wheel", "--no-deps", "--wheel-dir", str(dist), str(source))
    if not _offline(*build_wheel):
        requires = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]["requires"]
        _pip("download", "--dest", str(WHEEL_CACHE), *requires, what="downloading the build requirements")
        _pip(*build_wheel, "--no-index", "--find-links", str(WHEEL_CACHE), what="building the wheel")
    (wheel,) = dist.glob("hoss-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=outside_environment())
    install = ("--python", str(venv / "bin" / "python"), "install", str(wheel))
    if not _offline(*install):
        # `pip wheel` saves hoss's own wheel beside its dependencies', and takes one it finds there as what it asked
        # for: an older hoss would hide the dependencies a newer one added
        for stale in WHEEL_CACHE.glob("hoss-*.whl"):
            stale.unlink()
        _pip("wheel", "--wheel-dir", str(WHEEL_CACHE), str(wheel), what="fetching the dependencies' wheels")
        for cached in WHEEL_CACHE.glob("hoss-*.whl"):
            cached.unlink()
        _pip(*install, "--no-index", "--find-links", str(WHEEL_CACHE), what="installing the wheel")
    print(f"wheel built and installed alone in {time.monotonic() - started:.1f} s")
    return Installed(wheel=wheel, venv=venv, workdir=workdir)


def test_the_wheel_holds_what_an_operator_installs_and_no_dev_tools(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    top_level = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == OPERATOR_PACKAGES
    # What the services read next to their code: the ledger's Lua scripts, the dashboard, the kustomize base.
    assert "hoss/ledger/lua/bind.lua" in names
    assert any(name.startswith("dispatcher/dashboard/") for name in names)
    assert "deploy/kustomization.yaml" in names
    imports = installed.run([str(installed.venv / "bin" / "python"), "-c",
                             "import importlib.util, hoss; print(hoss.__file__); "
                             "print([m for m in ('dev', 'bench', 'tests') if importlib.util.find_spec(m)])"])
    assert imports.returncode == 0, imports.stderr
    location, found = imports.stdout.splitlines()
    assert Path(location).is_relative_to(installed.venv), "hoss was imported from outside the venv"
    assert found == "[]", "the venv can import dev tools or tests"


def test_every_console_script_answers_help(installed: Installed) -> None:
    entry_points = next(installed.venv.glob("lib/python*/site-packages/hoss-*.dist-info/entry_points.txt"))
    console = entry_points.read_text().partition("[console_scripts]")[2].partition("\n[")[0]
    installed_scripts = {line.split("=")[0].strip() for line in console.splitlines() if "=" in line}
    assert installed_scripts == set(SCRIPTS)
    for script in sorted(SCRIPTS):
        done = installed.run([str(installed.script(script)), "--help"])
        assert done.returncode == 0, f"{script} --help failed:\n{done.stderr[-3000:]}"
        assert done.stdout.startswith(f"usage: {script}"), done.stdout[:200]


async def test_each_service_starts_from_the_venv_against_the_plane_and_stops_on_sigterm(
        installed: Installed, plane: LocalPlane, tmp_path: Path) -> None:
    services = [service(plane, script, name=f"{script}-wheel") for script in SERVICES]

    def from_the_venv(script: str, env: dict[str, str]) -> list[str]:
        return [str(installed.script(script))]

    async with running(plane, services, launcher=from_the_venv, log_dir=tmp_path, suffix="wheel") as started:
        for each in started:
            # The console script's own interpreter, the venv's: nothing of the dev venv runs.
            assert command_line(each.popen.pid)[:2] == [str(installed.venv / "bin" / "python"),
                                                        str(installed.script(each.service.script))]
        dispatcher = next(each for each in started if each.service.script == "hoss-dispatcher")
        status = installed.run([str(installed.script("hoss")), "status", "--url",
                                f"http://127.0.0.1:{dispatcher.service.port}/status"])
        assert status.returncode == 0, f"hoss status failed:\n{status.stderr[-3000:]}"
        codes = {each.service.script: stop(each) for each in started}
    assert codes == dict.fromkeys(SERVICES, 0)
