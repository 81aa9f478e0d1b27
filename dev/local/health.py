"""Whether a process of the local plane answers as it should when ready: etcd's /health, the apiserver's /readyz
(as admin), redis-server's PING (as admin), the resolver's /readyz, the hoss services' /healthz, and /healthz over
HTTPS for the other Kubernetes components with a port; a process without a port only has to run."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

from dev.local.processes import alive
from dev.local.redis_server import redis_ping
from dev.local.state import PlaneFiles, PlaneState, Process


def healthy(process: Process, state: PlaneState, files: PlaneFiles) -> bool:
    name = process.name
    if name == "etcd":
        return http_ok(f"http://127.0.0.1:{state.etcd_port}/health")
    if name == "kube-apiserver":
        admin = (files.pki_dir / "client-admin.crt", files.pki_dir / "client-admin.key")
        return http_ok(f"{state.apiserver_url}/readyz", ca=files.ca_cert, client=admin)
    if name == "redis-server":
        return redis_ping(state.redis_port, "admin", state.redis_passwords.get("admin", ""))
    if name.startswith("hoss-resolver"):
        # Only the plane's own resolver serves a certificate from the plane's CA; another may bring its own.
        return http_ok(f"https://127.0.0.1:{process.port}/readyz", ca=files.ca_cert, verify=name == "hoss-resolver")
    if name == "kueue":
        return http_ok(f"http://127.0.0.1:{process.port}/readyz")
    if name.startswith(("hoss-dispatcher", "hoss-worker", "hoss-rescheduler")):
        return http_ok(f"http://127.0.0.1:{process.port}/healthz")
    if process.port:
        return http_ok(f"https://127.0.0.1:{process.port}/healthz", ca=files.ca_cert, verify=False)
    return alive(process)


def http_ok(url: str, *, ca: Path | None = None, client: tuple[Path, Path] | None = None,
            verify: bool = True) -> bool:
    """GET ``url`` answers 200 within 2 s. HTTPS trusts ``ca`` (nothing checked when not ``verify``) and presents
    ``client`` (certificate, key) when given."""
    context: ssl.SSLContext | None = None
    if url.startswith("https"):
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if client is not None:
            context.load_cert_chain(*client)
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False
