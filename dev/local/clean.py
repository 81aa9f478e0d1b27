"""``python -m dev local clean``: stop the local plane and remove what it and its build left on the machine."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from dev.local import binaries
from dev.local.errors import PlaneError
from dev.local.plane import LocalPlane

PLANE_MARKERS = ("state.json", "pki", "kubeconfig", "logs")
"""What a plane directory holds; a directory with none of them is not removed (it may be anything)."""


def remove_plane_state(plane: LocalPlane) -> str | None:
    """Stop the plane and delete its state directory (certificates, kubeconfigs, logs); what was removed."""
    plane.down()
    directory = plane.directory
    if not directory.exists():
        return None
    if directory in (Path("/"), Path.home().resolve()) or not any((directory / m).exists() for m in PLANE_MARKERS):
        raise PlaneError(f"{directory} does not look like a local plane's directory (no state.json, pki, "
                         "kubeconfig or logs); not removing it")
    shutil.rmtree(directory)
    return f"plane state {directory}"


def remove_binaries() -> str | None:
    """Delete the control-plane binaries hoss built (only those, by name: the directory may be the user's own
    HOSS_K8S_BIN_DIR), and the directory if that leaves it empty."""
    directory = binaries.cache_dir()
    removed = []
    for binary in (*binaries.BINARIES, *binaries.TOOLS):
        for path in (directory / binary.name, directory / f".{binary.name}.partial"):
            if path.is_file():
                path.unlink()
                removed.append(path.name)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
    return f"binaries {', '.join(removed)} from {directory}" if removed else None


def wheel_cache() -> Path:
    """The wheels of hoss's dependencies that the wheel test (tests/e2e/test_wheel.py) installs from: it fills the
    directory from PyPI with what is missing, so that a warm run installs offline."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hoss" / "wheels"


def remove_wheel_cache() -> str | None:
    directory = wheel_cache()
    if not directory.is_dir():
        return None
    shutil.rmtree(directory)
    return f"wheel cache {directory}"


def remove_go_caches() -> str | None:
    """``go clean -cache -modcache``: Go's build cache and module cache, which the binaries' build filled. They
    are shared with every other Go build of this user, hence only on request."""
    go = shutil.which("go")
    if go is None:
        return None
    result = subprocess.run([go, "clean", "-cache", "-modcache"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PlaneError(f"go clean -cache -modcache failed: {result.stderr.strip()[-2000:]}")
    return "Go build cache and module cache (go clean -cache -modcache)"


def clean(planes: Sequence[LocalPlane], *, go_caches: bool, progress: Callable[[str], None]) -> list[str]:
    """Everything removed, in order: each plane's state, the built binaries, the wheel cache, and (``go_caches``)
    Go's caches."""
    steps: list[Callable[[], str | None]] = [functools.partial(remove_plane_state, plane) for plane in planes]
    steps += [remove_binaries, remove_wheel_cache]
    if go_caches:
        steps.append(remove_go_caches)
    removed = []
    for step in steps:
        what = step()
        if what is not None:
            progress(f"removed {what}")
            removed.append(what)
    return removed
