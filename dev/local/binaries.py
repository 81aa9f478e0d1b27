"""Find or build the real control-plane binaries: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
etcd and kwok.

Each binary is built from Go modules pinned by the wrapper modules in ``dev/local/go/<module>/`` (their go.mod
and go.sum fix every version and checksum). Built binaries live in a cache outside git:
``$HOSS_K8S_BIN_DIR`` when set, else ``<user cache dir>/hoss/k8s-<kubernetes version>``. A binary already in that
directory is reused, and only the missing ones are built: the directory is named by the versions alone, so a cache
made before a binary was added (kube-controller-manager) gains it on the next ``python -m dev local build`` without
rebuilding the others (adding a command to the wrapper module adds modules to its go.sum, never changes the
version of one the other commands use). Prebuilt binaries are accepted from ``$HOSS_K8S_BIN_DIR`` or
``$KUBEBUILDER_ASSETS``, so users on a machine without a Go toolchain can skip the build.

`TOOLS` are built the same way into the same cache, for the tests only: the plane never runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GO_DIR = Path(__file__).resolve().parent / "go"
KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
PROMETHEUS_VERSION = "v0.316.0"
"""The Go module version of github.com/prometheus/prometheus (Prometheus 3.16.0), for promtool."""
HELM_VERSION = "v3.22.0"
KUEUE_VERSION = "v0.17.0"
"""sigs.k8s.io/kueue: Kueue's controller manager, for the e2e test of hoss behind Kueue (dev/local/kueue.py)."""


@dataclass(frozen=True)
class Binary:
    name: str
    module_dir: str
    package: str
    version: str
    tags: str = ""
    """Go build tags (``go build -tags``)."""


BINARIES: tuple[Binary, ...] = (
    Binary("etcd", "etcd", "go.etcd.io/etcd/server/v3", ETCD_VERSION),
    Binary("kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver", KUBERNETES_VERSION),
    Binary("kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager",
           KUBERNETES_VERSION),
    Binary("kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler", KUBERNETES_VERSION),
    Binary("kubectl", "kubernetes", "k8s.io/kubernetes/cmd/kubectl", KUBERNETES_VERSION),
    Binary("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok", KWOK_VERSION),
)
TOOLS: tuple[Binary, ...] = (
    # `promtool check rules` on deploy/monitoring/alerts.yaml (tests/unit/test_monitoring.py); without the service
    # discovery plugins (cloud SDKs), which checking rules never uses.
    Binary("promtool", "promtool", "github.com/prometheus/prometheus/cmd/promtool", PROMETHEUS_VERSION,
           tags="remove_all_sd"),
    # `helm lint`, `helm template` and `helm install` of deploy/helm/hoss (tests/unit/test_helm_chart.py,
    # tests/e2e/test_helm.py).
    Binary("helm", "helm", "helm.sh/helm/v3/cmd/helm", HELM_VERSION),
    # Kueue's controller manager (tests/e2e/test_kueue.py: Kueue admits Jobs, hoss places their pods).
    Binary("kueue", "kueue", "sigs.k8s.io/kueue/cmd/kueue", KUEUE_VERSION),
)


class BinaryError(RuntimeError):
    """A control-plane binary is missing and cannot be built."""


def cache_dir() -> Path:
    """Where built binaries are kept (and prebuilt ones are looked for first)."""
    explicit = os.environ.get("HOSS_K8S_BIN_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hoss" / f"k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-kwok-{KWOK_VERSION}"


def find(name: str) -> Path | None:
    """The path of an existing binary named ``name``, or None."""
    candidates = [cache_dir() / name]
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        candidates.append(Path(assets).expanduser() / name)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def require(name: str) -> Path:
    """The path of binary ``name``; raise a clear error naming it when absent."""
    path = find(name)
    if path is None:
        raise BinaryError(
            f"{name} not found in {cache_dir()} (HOSS_K8S_BIN_DIR) or KUBEBUILDER_ASSETS; "
            f"build it with `python -m dev local build` (needs the Go toolchain)"
        )
    return path


def _progress(message: str) -> None:
    print(f"[hoss build] {message}", file=sys.stderr, flush=True)


def _helm_ldflags(go: str, version: str) -> str:
    """What helm's own Makefile sets: its version, and the Kubernetes version of its client-go as the cluster that
    `helm template` and `helm lint` assume (the default in the source is 1.20)."""
    listed = subprocess.run([go, "list", "-m", "-f", "{{.Version}}", "k8s.io/client-go"], cwd=GO_DIR / "helm",
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise BinaryError(f"cannot read helm's k8s.io/client-go version: {listed.stderr.strip()}")
    minor = listed.stdout.strip().removeprefix("v").split(".")[1]  # client-go v0.37.x goes with Kubernetes 1.37
    flags = f" -X helm.sh/helm/v3/internal/version.version={version}"
    for package in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        flags += f" -X {package}.k8sVersionMajor=1 -X {package}.k8sVersionMinor={minor}"
    return flags


def build_missing(*, force: bool = False) -> dict[str, Path]:
    """Build every binary that is not already available; return the path of each."""
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    wanted = (*BINARIES, *TOOLS)
    todo = [b for b in wanted if force or find(b.name) is None]
    for b in wanted:
        existing = find(b.name)
        if existing is not None and b not in todo:
            paths[b.name] = existing
    if not todo:
        _progress(f"all binaries present in {target}")
        return paths
    go = shutil.which("go")
    if go is None:
        missing = ", ".join(b.name for b in todo)
        raise BinaryError(
            f"cannot build {missing}: the Go toolchain (`go`) is not on PATH; install Go >= 1.26, "
            f"or point HOSS_K8S_BIN_DIR or KUBEBUILDER_ASSETS at prebuilt binaries"
        )
    for index, b in enumerate(todo, start=1):
        _progress(
            f"({index}/{len(todo)}) building {b.name} {b.version} from {b.package} "
            f"(all of them take about 11-15 minutes the first time on 2 cores)"
        )
        started = time.monotonic()
        output = target / b.name
        partial = target / f".{b.name}.partial"
        env = dict(os.environ, CGO_ENABLED="0")
        ldflags = "-s -w"
        if b.module_dir == "kubernetes":
            # kube-apiserver reports this as its version; the default would be v0.0.0-master.
            ldflags += f" -X k8s.io/component-base/version.gitVersion={b.version}"
            ldflags += " -X k8s.io/component-base/version.gitMajor=1"
            ldflags += f" -X k8s.io/component-base/version.gitMinor={b.version.split('.')[1]}"
        elif b.module_dir == "helm":
            ldflags += _helm_ldflags(go, b.version)
        command = [go, "build", "-trimpath", "-ldflags", ldflags, *(["-tags", b.tags] if b.tags else []),
                   "-o", str(partial), b.package]
        result = subprocess.run(
            command, cwd=GO_DIR / b.module_dir, env=env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise BinaryError(f"building {b.name} failed:\n{result.stderr.strip()[-4000:]}")
        partial.replace(output)
        paths[b.name] = output
        _progress(f"({index}/{len(todo)}) {b.name} ready in {time.monotonic() - started:.0f}s -> {output}")
    return paths
