"""The local plane explains what is wrong: a missing binary, a port in use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dev.local import binaries
from dev.local.errors import PlaneError
from dev.local.plane import LocalPlane


def test_missing_binary_names_it_and_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSS_K8S_BIN_DIR", str(tmp_path))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    with pytest.raises(binaries.BinaryError, match=r"kube-apiserver not found in .*HOSS_K8S_BIN_DIR"):
        binaries.require("kube-apiserver")


def test_prebuilt_binary_from_kubebuilder_assets_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSS_K8S_BIN_DIR", str(tmp_path / "empty"))
    assets = tmp_path / "assets"
    assets.mkdir()
    etcd = assets / "etcd"
    etcd.write_text("#!/bin/sh\n")
    etcd.chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert binaries.require("etcd") == etcd


def test_asking_for_a_port_in_use_names_the_port_and_the_component(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PlaneError, match=rf"port {port} asked for kube-apiserver is in use"):
            LocalPlane(tmp_path).up(apiserver_port=port)
