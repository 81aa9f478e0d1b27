"""`python -m dev local clean` removes the plane's state, the binaries hoss built, the wheel test's wheel cache and,
on request, Go's caches; and nothing that is not its own."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dev.cli import main
from dev.local import binaries

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain (go clean)")


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    plane = tmp_path / "plane"
    (plane / "pki").mkdir(parents=True)
    (plane / "logs").mkdir()
    (plane / "pki" / "ca.key").write_text("key")
    bins = tmp_path / "bin"
    bins.mkdir()
    for binary in binaries.BINARIES:
        (bins / binary.name).write_text("#!/bin/sh\n")
    gocache, modcache = tmp_path / "gocache", tmp_path / "gomod"
    (modcache / "example.com" / "m@v1").mkdir(parents=True)
    (modcache / "example.com" / "m@v1" / "go.mod").write_text("module example.com/m\n")
    gocache.mkdir()
    monkeypatch.setenv("HOSS_K8S_BIN_DIR", str(bins))
    monkeypatch.setenv("GOCACHE", str(gocache))
    monkeypatch.setenv("GOMODCACHE", str(modcache))
    monkeypatch.setenv("GOFLAGS", "-modcacherw")
    wheels = tmp_path / "cache" / "hoss" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "example-1.0-py3-none-any.whl").write_text("wheel")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return {"plane": plane, "bin": bins, "gocache": gocache, "modcache": modcache, "wheels": wheels}


def test_clean_removes_state_and_binaries_and_keeps_go_caches_unless_asked(places: dict[str, Path]) -> None:
    assert main(["local", "clean", "--dir", str(places["plane"])]) == 0
    assert not places["plane"].exists()
    assert not places["bin"].exists()
    assert not places["wheels"].exists()
    assert places["modcache"].exists()


def test_clean_with_go_cache_removes_gos_caches_too(places: dict[str, Path]) -> None:
    assert main(["local", "clean", "--dir", str(places["plane"]), "--go-cache"]) == 0
    assert not places["plane"].exists() and not places["bin"].exists()
    assert not places["modcache"].exists()


def test_clean_leaves_other_files_in_a_users_binary_directory(places: dict[str, Path]) -> None:
    (places["bin"] / "my-tool").write_text("mine")
    assert main(["local", "clean", "--dir", str(places["plane"])]) == 0
    assert [p.name for p in places["bin"].iterdir()] == ["my-tool"]


def test_clean_refuses_a_directory_that_is_not_a_plane(tmp_path: Path, places: dict[str, Path]) -> None:
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_text("meow")
    assert main(["local", "clean", "--dir", str(other)]) == 2
    assert (other / "cat.jpg").exists()


def test_clean_without_dir_removes_the_demo_and_the_bench_planes(
    tmp_path: Path, places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    for name in ("local", "bench"):
        (state / name / "logs").mkdir(parents=True)
    monkeypatch.setenv("HOSS_LOCAL_DIR", str(state / "local"))
    assert main(["local", "clean"]) == 0
    assert not (state / "local").exists() and not (state / "bench").exists()
    assert state.exists()
