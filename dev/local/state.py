"""What a local plane records: where its files lie in its state directory, and ``state.json`` (ports, Redis
passwords and every process it started), which lets ``down``, ``status`` and later commands find a plane that an
earlier ``python -m dev local up`` started. ``state.json`` holds passwords: it is written owner-only, replaced
atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy import pki
from dev.local.errors import PlaneError


def default_directory() -> Path:
    """``$HOSS_LOCAL_DIR``, else ``$XDG_STATE_HOME/hoss/local`` (``~/.local/state/hoss/local``)."""
    explicit = os.environ.get("HOSS_LOCAL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "hoss" / "local"


@dataclass(frozen=True)
class PlaneFiles:
    """The files of one plane under its state directory ``root``."""

    root: Path

    @property
    def pki_dir(self) -> Path:
        return self.root / "pki"

    @property
    def ca_cert(self) -> Path:
        """The plane's CA: it signs the apiserver's and the resolver's serving certificates and every client's."""
        return self.pki_dir / "ca.crt"

    @property
    def kubeconfig_dir(self) -> Path:
        return self.root / "kubeconfig"

    def kubeconfig(self, identity: str) -> Path:
        return self.kubeconfig_dir / f"{identity}.yaml"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def webhook_client_dir(self) -> Path:
        """The CA of the apiserver's client certificate to webhooks, and that certificate."""
        return self.pki_dir / "webhook-client"

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the apiserver's webhook client certificate: the resolver's --client-ca-file."""
        return self.webhook_client_dir / "ca.crt"

    @property
    def admission_config(self) -> Path:
        return self.root / "admission.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.log_dir / "audit.log"

    @property
    def redis_acl_file(self) -> Path:
        return self.root / "redis-users.acl"


@dataclass
class Process:
    name: str
    pid: int
    binary: str
    """A word of the program's command line: a pid whose command line lacks it is no longer ours (pids get
    reused)."""
    log: str
    port: int = 0


@dataclass
class PlaneState:
    directory: str
    apiserver_port: int = 0
    etcd_port: int = 0
    etcd_peer_port: int = 0
    redis_port: int = 0
    etcd_data: str = ""
    audit: bool = False
    client_auth: bool = True
    """The apiserver presents its webhook client certificate (an admission configuration) and hoss-resolver takes
    reviews only from it. False: as on a managed control plane, neither."""
    redis_passwords: dict[str, str] = field(default_factory=dict)
    """Password of each Redis ACL user (admin and the hoss components); state.json is written 0600."""
    processes: list[Process] = field(default_factory=list)

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def redis_url(self) -> str:
        """The admin user's URL (every command and key): for the operator and the tests."""
        return self.redis_url_for("admin")

    def redis_url_for(self, user: str) -> str:
        """The URL of Redis ACL user ``user`` (``admin`` or a hoss component)."""
        password = self.redis_passwords.get(user)
        if password is None:
            raise PlaneError(f"no Redis user {user!r} in this plane; users: {', '.join(self.redis_passwords)}")
        return f"redis://{user}:{password}@127.0.0.1:{self.redis_port}/0"

    def process(self, name: str) -> Process | None:
        """The recorded process ``name`` (alive or not)."""
        return next((p for p in self.processes if p.name == name), None)


def load_state(files: PlaneFiles) -> PlaneState | None:
    """The recorded state, or None when no plane was started in this directory (or it was brought down)."""
    if not files.state_file.exists():
        return None
    raw = json.loads(files.state_file.read_text())
    processes = [Process(**p) for p in raw.pop("processes", [])]
    return PlaneState(**raw, processes=processes)


def save_state(files: PlaneFiles, state: PlaneState) -> None:
    # It holds the Redis passwords: owner-only from the first byte, replaced atomically.
    pki.write_private(files.state_file, json.dumps(asdict(state), indent=2).encode())
