"""Kueue on the local plane, as users combine it with hoss: Kueue queues Jobs (quota, borrowing, fair sharing,
preemption between queues) and admits them by unsuspending them; hoss places the pods of admitted Jobs.

Kueue's controller manager is built from sigs.k8s.io/kueue like the plane's other binaries (dev/local/binaries.py,
wrapper module dev/local/go/kueue); its CRDs come from the same module version (`crd_files`). The plane runs it
with the admin identity, no leader election, no metrics listener, no visibility server, the batch/job integration
only, fair sharing on, and its webhook server on loopback with a certificate from the plane's CA; the apiserver is
not told about Kueue's webhooks, so Jobs are created suspended (``spec.suspend: true``) with the label
``kueue.x-k8s.io/queue-name``, as Kueue's mutating webhook would leave them. Without Kueue's internal certificate
management its binary reads a metrics certificate from the fixed path `METRICS_CERT_DIR` at start (even with
metrics off): the plane writes one there from its CA. Pure but for `crd_files`, which asks the Go toolchain where
the module is.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from dev.local.binaries import GO_DIR, KUEUE_VERSION, BinaryError

PROCESS_NAME = "kueue"
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Where Kueue's binary (cmd/kueue/main.go) reads its metrics certificate when it does not manage its own."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def crd_files() -> list[Path]:
    """Kueue's CRDs (config/components/crd/bases) of the pinned module version, from the Go module cache."""
    go = shutil.which("go")
    if go is None:
        raise BinaryError("Kueue's CRDs come from its Go module: the Go toolchain (`go`) is not on PATH")
    listed = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue"], cwd=GO_DIR / "kueue",
                            capture_output=True, text=True, check=False)
    if listed.returncode != 0 or not listed.stdout.strip():
        raise BinaryError(f"cannot find sigs.k8s.io/kueue {KUEUE_VERSION}: {listed.stderr.strip()}")
    bases = Path(listed.stdout.strip()) / "config" / "components" / "crd" / "bases"
    return sorted(bases.glob("kueue.x-k8s.io_*.yaml"))


def configuration(*, health_port: int, webhook_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the plane."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"]},
        # Fair sharing between the ClusterQueues of a cohort (their weighted shares of what they borrow).
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        "featureGates": {"VisibilityOnDemand": False},
    }


def argv(binary: Path, *, config: Path, kubeconfig: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]
