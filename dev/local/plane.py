"""The local control plane: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and redis-server
on loopback.

Everything a plane needs lives in one state directory: certificates, one kubeconfig per identity, logs, pid
records and ``state.json`` (ports and processes). etcd keeps its data on tmpfs (/dev/shm) when there is one.
Processes run in their own sessions, so a plane outlives the ``hoss local up`` that started it; ``down`` stops
every process it recorded and removes the etcd data.

Identities: ``admin`` (system:masters), ``kube-scheduler`` (system:kube-scheduler), ``kube-controller-manager``
(system:kube-controller-manager; each controller then acts as its own ServiceAccount in kube-system, through
TokenRequest, as kubeadm runs it), ``kwok`` (plays the kubelets),
and one per hoss component whose user name is its ServiceAccount's (``system:serviceaccount:hoss-system:<name>``),
so the RBAC in deploy/rbac.yaml, the same file a real cluster gets, is what the local plane enforces.

The apiserver authenticates itself to the resolver webhook as a real cluster's is set up to: its admission
configuration (``--admission-control-config-file``) names a kubeconfig whose client certificate (common name
``kube-apiserver``) comes from a CA of its own, ``pki/webhook-client/ca.crt``, which is the resolver's
``--client-ca-file``. Nothing else holds a certificate from that CA, so no other identity can post reviews.
With ``audit``, the apiserver writes an audit log (Metadata level, the hoss components' requests only) to
``logs/audit.log``: what each component really calls, for tests/e2e's RBAC check.

redis-server runs with ACL users from ``redis-users.acl`` (mode 0600) and no usable default user: ``admin`` (the
operator's and the tests' URL, ``PlaneState.redis_url``) and one user per hoss component with only the commands
and keys it needs (`deploy.lockdown.REDIS_ACL`); each component is started with its own
``redis://<user>:<password>@...`` URL.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy import lockdown, pki
from dev.local import binaries
from dev.local.ports import bind_error, free_port
from hoss.model.admission import BINDING_LANES, LANE_LABEL

REPOSITORY = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPOSITORY / "deploy"
RBAC_MANIFEST = DEPLOY_DIR / "rbac.yaml"
WEBHOOK_MANIFEST = DEPLOY_DIR / "webhook.yaml"
ROUTER_MANIFEST = DEPLOY_DIR / "router.yaml"
POLICIES_FILE = REPOSITORY / "configs" / "policies.yaml"
ROUTING_FILE = REPOSITORY / "configs" / "routing.yaml"
KWOK_STAGES = Path(__file__).resolve().parent / "kwok" / "stages.yaml"
HOSS_NAMESPACE = "hoss-system"
HOSS_COMPONENTS = ("hoss-dispatcher", "hoss-worker", "hoss-resolver", "hoss-rescheduler")
IDENTITIES = ("admin", "kube-scheduler", "kube-controller-manager", "kwok", *HOSS_COMPONENTS)
CONTROLLERS = ("replicaset", "deployment", "job", "disruption", "namespace", "garbagecollector", "serviceaccount")
"""The kube-controller-manager controllers the local plane runs: workloads whose evicted pods come back (ReplicaSet,
Deployment, Job), PodDisruptionBudget status (disruption), namespaces that finish deleting (namespace, and the
garbage collector for owner references), and each namespace's default ServiceAccount. Nothing else (no node
lifecycle: kwok plays the kubelets; no endpoints, no certificates), which keeps its idle CPU small."""
HEALTH_TIMEOUT_SECONDS = 90.0
WEBHOOK_CLIENT_NAME = lockdown.WEBHOOK_CLIENT_NAME

# Children started by this Python process, kept so that they are reaped when stopped (and so that a Popen
# object is never collected while its process runs, which Python reports as a ResourceWarning).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class PlaneError(RuntimeError):
    """The local plane cannot start or is not in the state asked for; the message names the part and its log."""


def default_directory() -> Path:
    explicit = os.environ.get("HOSS_LOCAL_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "hoss" / "local"


@dataclass
class Process:
    name: str
    pid: int
    binary: str
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


# The webhook's binding lanes (hoss/model/admission.py) on the local plane. In a cluster each lane is its own webhook
# entry and so its own apiserver transport; registered by URL (as here) the entries share one transport, whose idle
# connections are kept per host, so each lane calls the resolver at its own loopback address.
LANE_HOSTS = tuple(f"127.0.0.{lane + 1}" for lane in range(BINDING_LANES))


def lane_host(hook: Mapping[str, Any]) -> str:
    """The loopback address the local plane gives a webhook entry: its lane's (objectSelector matchLabels
    hoss.io/lane), or the first lane's."""
    labels = (hook.get("objectSelector") or {}).get("matchLabels") or {}
    lane = labels.get(LANE_LABEL)
    return LANE_HOSTS[int(lane)] if isinstance(lane, str) and lane.isdigit() and int(lane) < len(LANE_HOSTS) \
        else LANE_HOSTS[0]


def _check_port_free(port: int, owner: str) -> int:
    error = bind_error(port)
    if error is not None:
        raise PlaneError(f"port {port} asked for {owner} is in use on 127.0.0.1: {error.strerror}") from error
    return port


def _pid_alive(pid: int, binary: str) -> bool:
    """True when ``pid`` runs and is still the program we started (pids get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie (state Z) has exited and only waits for its parent to reap it.
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and binary.encode() in cmdline


def _tail(path: Path, lines: int = 15) -> str:
    try:
        content = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(content[-lines:])


class LocalPlane:
    """Start, inspect and stop one local control plane whose state lives in ``directory``."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (directory or default_directory()).resolve()
        self.pki_dir = self.directory / "pki"
        self.kubeconfig_dir = self.directory / "kubeconfig"
        self.log_dir = self.directory / "logs"
        self.state_file = self.directory / "state.json"
        self.webhook_client_dir = self.pki_dir / "webhook-client"
        self.admission_config = self.directory / "admission.yaml"
        self.audit_policy = self.directory / "audit-policy.yaml"
        self.audit_log = self.log_dir / "audit.log"

    # --- state -------------------------------------------------------------------------------------------

    def load_state(self) -> PlaneState | None:
        if not self.state_file.exists():
            return None
        raw = json.loads(self.state_file.read_text())
        processes = [Process(**p) for p in raw.pop("processes", [])]
        return PlaneState(**raw, processes=processes)

    def _save(self, state: PlaneState) -> None:
        # It holds the Redis passwords: owner-only from the first byte, replaced atomically.
        pki.write_private(self.state_file, json.dumps(asdict(state), indent=2).encode())

    def kubeconfig(self, identity: str = "admin") -> Path:
        if identity not in IDENTITIES:
            raise PlaneError(f"unknown identity {identity!r}; known: {', '.join(IDENTITIES)}")
        return self.kubeconfig_dir / f"{identity}.yaml"

    def state(self) -> PlaneState:
        """The recorded state of a running plane; raise when the plane is not up."""
        state = self.load_state()
        if state is None:
            raise PlaneError(f"no local plane in {self.directory}; start one with `hoss local up`")
        return state

    # --- status ------------------------------------------------------------------------------------------

    def status(self) -> dict[str, bool]:
        """Each recorded process and whether it is alive and healthy."""
        state = self.load_state()
        if state is None:
            return {}
        result: dict[str, bool] = {}
        for process in state.processes:
            alive = _pid_alive(process.pid, process.binary)
            result[process.name] = alive and self._healthy(process.name, state, process)
        return result

    def is_up(self) -> bool:
        status = self.status()
        return bool(status) and all(status.values())

    # --- up ----------------------------------------------------------------------------------------------

    def up(
        self,
        *,
        apiserver_port: int | None = None,
        redis_port: int | None = None,
        scheduler: bool = True,
        webhook: bool = True,
        audit: bool = False,
        progress: Callable[[str], None] = lambda _message: None,
    ) -> PlaneState:
        """Start every component not yet running; a plane that is already up is left as it is. ``audit`` turns on
        the apiserver's audit log of the hoss components' requests (``audit_log``)."""
        existing = self.load_state()
        if existing is not None and self.is_up():
            progress(f"local plane already up in {self.directory}")
            return existing
        if existing is not None:
            progress("a previous plane is partly running; stopping what is left before starting afresh")
            self.down()
        state = PlaneState(directory=str(self.directory), audit=audit)
        state.apiserver_port = (
            _check_port_free(apiserver_port, "kube-apiserver") if apiserver_port else free_port()
        )
        state.redis_port = _check_port_free(redis_port, "redis-server") if redis_port else free_port()
        paths = {b.name: binaries.require(b.name) for b in binaries.BINARIES}
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise PlaneError("redis-server not found on PATH; install Debian's redis-server (`make deps` does)")
        for directory in (self.pki_dir, self.kubeconfig_dir, self.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        state.redis_passwords = {user: secrets.token_urlsafe(24) for user in ("admin", *HOSS_COMPONENTS)}
        state.etcd_port = free_port()
        state.etcd_peer_port = free_port()
        shm = Path("/dev/shm")
        data_root = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.directory
        state.etcd_data = str(data_root / f"hoss-etcd-{abs(hash(str(self.directory))) % 10**8}")
        shutil.rmtree(state.etcd_data, ignore_errors=True)
        self._save(state)

        progress("writing certificates and kubeconfigs")
        self._write_credentials(state)
        try:
            progress(f"starting etcd on 127.0.0.1:{state.etcd_port}")
            self._start_etcd(state, paths["etcd"])
            progress(f"starting kube-apiserver on {state.apiserver_url}")
            self._start_apiserver(state, paths["kube-apiserver"])
            progress("applying RBAC for the hoss components (deploy/rbac.yaml)")
            self.kubectl("apply", "-f", str(RBAC_MANIFEST))
            progress("installing the CRDs hoss uses (deploy/crds: PodGroup, ElasticQuota, Reservation)")
            self.kubectl("apply", "-k", str(DEPLOY_DIR / "crds"))
            self.kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.x-k8s.io",
                         "crd/elasticquotas.scheduling.x-k8s.io", "crd/reservations.scheduling.koordinator.sh",
                         "--timeout=60s")
            progress("starting kube-controller-manager (" + ",".join(CONTROLLERS) + ")")
            self._start_controller_manager(state, paths["kube-controller-manager"])
            progress("starting kwok (fake kubelets)")
            self._start_kwok(state, paths["kwok"])
            if scheduler:
                progress("starting kube-scheduler (default-scheduler)")
                self.start_scheduler(state, scheduler_name="default-scheduler")
            progress(f"starting redis-server on 127.0.0.1:{state.redis_port}")
            self._start_redis(state, redis_server)
            if webhook:
                progress("starting hoss-resolver and registering its webhook on bindings")
                self.start_resolver(state)
                self.register_webhook()
        except BaseException:
            self.down()
            raise
        progress("local plane is up")
        return state

    def _write_credentials(self, state: PlaneState) -> None:
        ca = pki.ensure_ca(self.pki_dir)
        pki.issue(
            ca,
            directory=self.pki_dir,
            name="apiserver",
            common_name="kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=("127.0.0.1", "10.96.0.1"),
            server=True,
        )
        pki.ensure_signing_key(self.pki_dir / "service-account.key")
        subjects: dict[str, tuple[str, tuple[str, ...]]] = {
            "admin": ("hoss-admin", ("system:masters",)),
            "kube-scheduler": ("system:kube-scheduler", ()),
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            "kwok": ("kwok", ("system:masters",)),
        }
        for component in HOSS_COMPONENTS:
            subjects[component] = (
                f"system:serviceaccount:{HOSS_NAMESPACE}:{component}",
                ("system:serviceaccounts", f"system:serviceaccounts:{HOSS_NAMESPACE}"),
            )
        for identity, (common_name, groups) in subjects.items():
            pair = pki.issue(
                ca, directory=self.pki_dir, name=f"client-{identity}", common_name=common_name, organizations=groups
            )
            self._write_kubeconfig(identity, state, ca.cert, pair)
        self._write_admission_config()
        self._write_audit_policy()

    def _write_admission_config(self) -> None:
        """The apiserver's admission configuration: it presents a client certificate from the webhook-client CA to
        every webhook (user ``*``; the plane's only webhooks are hoss resolvers, on ports chosen later)."""
        client_ca = pki.ensure_ca(self.webhook_client_dir, common_name="hoss-local-webhook-client-ca")
        pair = pki.issue(
            client_ca, directory=self.webhook_client_dir, name="apiserver", common_name=WEBHOOK_CLIENT_NAME
        )
        kubeconfig = self.webhook_client_dir / "kubeconfig.yaml"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1",
            "kind": "Config",
            "users": [{"name": "*", "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
        }, indent=2))
        self.admission_config.write_text(json.dumps({
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [{
                "name": plugin,  # the resolver's validating webhook and its router (mutating)
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": str(kubeconfig),
                },
            } for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")],
        }, indent=2))

    def _write_audit_policy(self) -> None:
        """Metadata (who, verb, resource, response code; no bodies) for the hoss components' requests only."""
        users = [f"system:serviceaccount:{HOSS_NAMESPACE}:{component}" for component in HOSS_COMPONENTS]
        self.audit_policy.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": users}, {"level": "None"}],
        }, indent=2))

    @property
    def webhook_client_ca(self) -> Path:
        """The CA of the apiserver's webhook client certificate: the resolver's --client-ca-file."""
        return self.webhook_client_dir / "ca.crt"

    def _write_kubeconfig(self, identity: str, state: PlaneState, ca: Path, pair: pki.KeyPair) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "hoss-local", "cluster": {"server": state.apiserver_url, "certificate-authority": str(ca)}}
            ],
            "users": [
                {"name": identity, "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}
            ],
            "contexts": [{"name": identity, "context": {"cluster": "hoss-local", "user": identity}}],
            "current-context": identity,
        }
        # JSON is valid YAML; kubectl and every client read it.
        self.kubeconfig(identity).write_text(json.dumps(config, indent=2))

    def _spawn(
        self,
        state: PlaneState,
        name: str,
        argv: Sequence[str],
        *,
        port: int = 0,
        binary: str | None = None,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> Process:
        log = self.log_dir / f"{name}.log"
        with log.open("ab") as out:
            child = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                start_new_session=True,
                env=None if env is None else {**os.environ, **env},
            )
        _CHILDREN[child.pid] = child
        process = Process(name=name, pid=child.pid, binary=binary or Path(argv[0]).name, log=str(log), port=port)
        state.processes = [p for p in state.processes if p.name != name] + [process]
        self._save(state)
        if wait:
            self._wait_healthy(state, process, child)
        return process

    def wait_healthy(self, processes: Sequence[Process]) -> None:
        """Wait until each of ``processes`` (started by this Python process with ``wait=False``) is healthy, so
        that several start at once; raise as a start would when one exits or stays unhealthy."""
        state = self.state()
        for process in processes:
            child = _CHILDREN.get(process.pid)
            if child is None:
                raise PlaneError(f"{process.name} was not started by this process; cannot wait for it")
            self._wait_healthy(state, process, child)

    def _wait_healthy(self, state: PlaneState, process: Process, child: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            code = child.poll()
            if code is not None:
                raise PlaneError(
                    f"{process.name} exited with code {code} while starting; read {process.log}:\n"
                    f"{_tail(Path(process.log))}"
                )
            if self._healthy(process.name, state, process):
                return
            time.sleep(0.25)
        raise PlaneError(
            f"{process.name} did not become healthy within {HEALTH_TIMEOUT_SECONDS:.0f}s; read {process.log}:\n"
            f"{_tail(Path(process.log))}"
        )

    def _healthy(self, name: str, state: PlaneState, process: Process) -> bool:
        if name == "etcd":
            return self._http_ok(f"http://127.0.0.1:{state.etcd_port}/health")
        if name == "kube-apiserver":
            return self._http_ok(f"{state.apiserver_url}/readyz", client="admin")
        if name == "redis-server":
            return _redis_ping(state.redis_port, "admin", state.redis_passwords.get("admin", ""))
        if name.startswith("hoss-resolver"):
            # Only the plane's own resolver serves a certificate from the plane's CA; another may bring its own.
            return self._http_ok(f"https://127.0.0.1:{process.port}/readyz", verify=name == "hoss-resolver")
        if name.startswith(("hoss-dispatcher", "hoss-worker", "hoss-rescheduler")):
            return self._http_ok(f"http://127.0.0.1:{process.port}/healthz")
        if process.port:
            return self._http_ok(f"https://127.0.0.1:{process.port}/healthz", verify=False)
        return _pid_alive(process.pid, process.binary)

    def _http_ok(self, url: str, *, client: str | None = None, verify: bool = True) -> bool:
        context: ssl.SSLContext | None = None
        if url.startswith("https"):
            context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
            if not verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if client is not None:
                context.load_cert_chain(self.pki_dir / f"client-{client}.crt", self.pki_dir / f"client-{client}.key")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _start_etcd(self, state: PlaneState, etcd: Path) -> None:
        client = f"http://127.0.0.1:{state.etcd_port}"
        peer = f"http://127.0.0.1:{state.etcd_peer_port}"
        self._spawn(
            state,
            "etcd",
            [
                str(etcd),
                "--name=hoss-local",
                f"--data-dir={state.etcd_data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=hoss-local={peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
            port=state.etcd_port,
        )

    def _start_apiserver(self, state: PlaneState, apiserver: Path) -> None:
        sa_key, sa_public = self.pki_dir / "service-account.key", self.pki_dir / "service-account.pub"
        self._spawn(
            state,
            "kube-apiserver",
            [
                str(apiserver),
                f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={state.apiserver_port}",
                f"--tls-cert-file={self.pki_dir / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki_dir / 'apiserver.key'}",
                f"--client-ca-file={self.pki_dir / 'ca.crt'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={sa_public}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                f"--admission-control-config-file={self.admission_config}",
                *(
                    [f"--audit-policy-file={self.audit_policy}", f"--audit-log-path={self.audit_log}",
                     "--audit-log-format=json", "--audit-log-maxsize=0"]
                    if state.audit else []
                ),
                "--endpoint-reconciler-type=none",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--allow-privileged=true",
                "--v=1",
            ],
            port=state.apiserver_port,
        )

    def start_controller_manager(self) -> Process:
        """Start the plane's kube-controller-manager again (after ``stop_process("kube-controller-manager")``)."""
        state = self.state()
        self._start_controller_manager(state, binaries.require("kube-controller-manager"))
        return next(p for p in state.processes if p.name == "kube-controller-manager")

    def _start_controller_manager(self, state: PlaneState, controller_manager: Path) -> None:
        """kube-controller-manager with `CONTROLLERS`, few workers each and no leader election (one per plane)."""
        kubeconfig = self.kubeconfig("kube-controller-manager")
        port = free_port()
        self._spawn(
            state,
            "kube-controller-manager",
            [
                str(controller_manager),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--root-ca-file={self.pki_dir / 'ca.crt'}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--concurrent-replicaset-syncs=2",
                "--concurrent-deployment-syncs=2",
                "--concurrent-job-syncs=2",
                "--concurrent-namespace-syncs=2",
                "--concurrent-gc-syncs=2",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
                "--v=1",
            ],
            port=port,
        )

    def _start_kwok(self, state: PlaneState, kwok: Path) -> None:
        port = free_port()
        self._spawn(
            state,
            "kwok",
            [
                str(kwok),
                f"--kubeconfig={self.kubeconfig('kwok')}",
                "--manage-all-nodes=true",
                f"--config={KWOK_STAGES}",
                f"--server-address=127.0.0.1:{port}",
                "--node-lease-duration-seconds=0",
            ],
        )

    def start_scheduler(
        self,
        state: PlaneState | None = None,
        *,
        scheduler_name: str,
        qps: int = 5000,
        plugin_config: Sequence[Mapping[str, Any]] = (),
    ) -> Process:
        """Start a real kube-scheduler serving ``scheduler_name`` (several may run under different names).

        ``plugin_config`` is the profile's ``pluginConfig`` (e.g. NodeResourcesFit's scoring strategy). Its
        ``/metrics`` is readable over HTTPS on the Process's port with the admin identity (system:masters).
        """
        state = state or self.state()
        profile: dict[str, Any] = {"schedulerName": scheduler_name}
        if plugin_config:
            profile["pluginConfig"] = [dict(entry) for entry in plugin_config]
        config = self.directory / f"kube-scheduler-{scheduler_name}.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.kubeconfig("kube-scheduler")),
                        "qps": qps,
                        "burst": qps * 2,
                    },
                    "leaderElection": {"leaderElect": False},
                    "profiles": [profile],
                },
                indent=2,
            )
        )
        port = free_port()
        return self._spawn(
            state,
            scheduler_process_name(scheduler_name),
            [
                str(binaries.require("kube-scheduler")),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={self.kubeconfig('kube-scheduler')}",
                f"--authorization-kubeconfig={self.kubeconfig('kube-scheduler')}",
                "--v=1",
            ],
            port=port,
        )

    def stop_scheduler(self, scheduler_name: str = "default-scheduler") -> None:
        """Stop a kube-scheduler started by ``start_scheduler`` (the plane's own by default); state.json forgets
        it, and ``start_scheduler`` brings it back."""
        self.stop_process(scheduler_process_name(scheduler_name))

    def running(self, name: str) -> Process | None:
        """The recorded process ``name`` when it is alive, else None."""
        process = next((p for p in self.state().processes if p.name == name), None)
        return process if process is not None and _pid_alive(process.pid, process.binary) else None

    def stop_resolver(self) -> None:
        """Unregister the webhook first (it fails closed: with no resolver every binding would be refused), then
        stop the plane's resolver. ``ensure_resolver`` undoes both."""
        self.unregister_webhook()
        self.stop_process("hoss-resolver")

    def ensure_resolver(self) -> Process:
        """The plane's resolver running (started when it is not; it rebuilds the ledger from the apiserver before
        it is ready) and its webhook registered."""
        resolver = self.running("hoss-resolver") or self.start_resolver()
        self.register_webhook()
        return resolver

    def start_resolver(
        self,
        state: PlaneState | None = None,
        *,
        enforce: str = "all",
        name: str = "hoss-resolver",
        serving: pki.KeyPair | None = None,
        extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> Process:
        """Start hoss-resolver (the admission webhook) on a free port (``wait=False``: return at once, see
        `wait_healthy`).

        Its serving certificate is ``serving`` when given (e.g. from ``hoss certs``), else one from the plane's CA.
        Another ``name`` runs a second resolver beside the plane's own (which the plane's webhook calls).
        ``extra_args`` are more hoss-resolver flags (e.g. ``--audit-interval-seconds=2``).
        """
        state = state or self.state()
        if serving is None:
            ca = pki.ensure_ca(self.pki_dir)
            serving = pki.issue(
                ca,
                directory=self.pki_dir,
                name="resolver-serving",
                common_name="hoss-resolver",
                dns_names=("localhost",),
                ip_addresses=LANE_HOSTS,
                server=True,
            )
        port = free_port()
        return self._spawn(
            state,
            name,
            [
                sys.executable,
                "-m",
                "resolver.webhook",
                f"--kubeconfig={self.kubeconfig('hoss-resolver')}",
                f"--host={','.join(LANE_HOSTS)}",
                f"--port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-key-file={serving.key}",
                f"--client-ca-file={self.webhook_client_ca}",
                f"--client-names={WEBHOOK_CLIENT_NAME}",
                f"--enforce={enforce}",
                f"--routing-file={ROUTING_FILE}",
                *extra_args,
            ],
            port=port,
            binary="resolver.webhook",
            env={"HOSS_REDIS_URL": state.redis_url_for("hoss-resolver")},  # not on the command line: ps shows it
            wait=wait,
        )

    def start_dispatcher(
        self, state: PlaneState | None = None, *, name: str = "hoss-dispatcher", extra_args: Sequence[str] = (),
        wait: bool = True, port: int | None = None,
    ) -> Process:
        """Start hoss-dispatcher with its own identity; its HTTP port (status, dashboard) is in the Process
        (``wait=False``: return at once, see `wait_healthy`; ``port``: that one, e.g. a stopped dispatcher's,
        instead of a free one)."""
        return self._start_service("dispatcher.main", "hoss-dispatcher", state, name=name, extra_args=extra_args,
                                   wait=wait, port=port)

    def _start_service(self, module: str, identity: str, state: PlaneState | None, *, name: str,
                       extra_args: Sequence[str], wait: bool, port: int | None = None) -> Process:
        """A hoss service (`python -m module`) with `identity`'s kubeconfig and Redis user, on a free port."""
        state = state or self.state()
        port = port or free_port()
        return self._spawn(
            state,
            name,
            [
                sys.executable, "-m", module,
                f"--kubeconfig={self.kubeconfig(identity)}",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--identity={name}",
                *extra_args,
            ],
            port=port,
            binary=module,
            env={"HOSS_REDIS_URL": state.redis_url_for(identity)},  # not on the command line: ps shows it
            wait=wait,
        )

    def start_worker(
        self,
        worker_id: str,
        *,
        policies: Sequence[str] = ("default",),
        extra_args: Sequence[str] = (),
        state: PlaneState | None = None,
        cpu: int | None = None,
        wait: bool = True,
    ) -> Process:
        """Start one hoss-worker serving ``policies`` with the hoss-worker identity; ``cpu`` pins it to that core
        (taskset, util-linux). With ``wait=False`` it returns at once: ``wait_healthy`` waits for several."""
        state = state or self.state()
        port = free_port()
        pin = [] if cpu is None else [_taskset(), "-c", str(cpu)]
        return self._spawn(
            state,
            f"hoss-worker-{worker_id}",
            [
                *pin,
                sys.executable, "-m", "workers.main",
                f"--id={worker_id}",
                f"--policies={','.join(policies)}",
                f"--policies-file={POLICIES_FILE}",
                f"--kubeconfig={self.kubeconfig('hoss-worker')}",
                "--host=127.0.0.1",
                f"--port={port}",
                *extra_args,
            ],
            port=port,
            binary="workers.main",
            env={"HOSS_REDIS_URL": state.redis_url_for("hoss-worker")},  # not on the command line: ps shows it
            wait=wait,
        )

    def start_rescheduler(
        self, state: PlaneState | None = None, *, name: str = "hoss-rescheduler", extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> Process:
        """Start hoss-rescheduler with its own identity (`extra_args`: its settings, e.g. --node-selector;
        ``wait=False``: return at once, see `wait_healthy`)."""
        return self._start_service("rescheduler.main", "hoss-rescheduler", state, name=name, extra_args=extra_args,
                                   wait=wait)

    def webhook_configuration(self, manifest: Path = WEBHOOK_MANIFEST) -> dict[str, object]:
        """deploy/webhook.yaml (or `manifest`, e.g. deploy/router.yaml), pointed at the local resolver by URL with
        the plane's CA as caBundle."""
        state = self.state()
        resolver = next((p for p in state.processes if p.name == "hoss-resolver"), None)
        if resolver is None:
            raise PlaneError("hoss-resolver is not running in this plane; start it before registering the webhook")
        config: dict[str, Any] = yaml.safe_load(manifest.read_text())
        ca_bundle = base64.b64encode((self.pki_dir / "ca.crt").read_bytes()).decode()
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            host = lane_host(hook)
            hook["clientConfig"] = {"url": f"https://{host}:{resolver.port}{path}", "caBundle": ca_bundle}
        return config

    def register_webhook(self) -> None:
        """Register the resolver's webhooks: the validating one on bindings and the router (deploy/router.yaml)."""
        manifest = self.directory / "webhook.json"
        manifest.write_text(json.dumps(self.webhook_configuration(), indent=2))
        self.kubectl("apply", "-f", str(manifest))
        router = self.directory / "router.json"
        router.write_text(json.dumps(self.webhook_configuration(ROUTER_MANIFEST), indent=2))
        self.kubectl("apply", "-f", str(router))

    def unregister_webhook(self) -> None:
        self.kubectl("delete", "validatingwebhookconfiguration", "hoss-resolver", "--ignore-not-found")
        self.kubectl("delete", "mutatingwebhookconfiguration", "hoss-router", "--ignore-not-found")

    def stop_process(self, name: str) -> None:
        """Stop one recorded process (e.g. an extra kube-scheduler) and forget it."""
        state = self.state()
        for process in [p for p in state.processes if p.name == name]:
            _terminate(process)
        state.processes = [p for p in state.processes if p.name != name]
        self._save(state)

    def stop_processes(self, names: Sequence[str]) -> None:
        """Stop several recorded processes at once (each gets SIGTERM first, then each is waited for) and
        forget them."""
        state = self.state()
        chosen = [p for p in state.processes if p.name in set(names)]
        for process in chosen:
            if _pid_alive(process.pid, process.binary):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in chosen:
            _terminate(process)
        state.processes = [p for p in state.processes if p.name not in set(names)]
        self._save(state)

    def restart_apiserver(self) -> Process:
        """Stop kube-apiserver and start it again on the same port over the same etcd (no data is lost), as a
        control-plane upgrade does: every client sees its connections drop and its watches end mid-stream.
        Returns once the new apiserver is ready."""
        state = self.state()
        old = next((p for p in state.processes if p.name == "kube-apiserver"), None)
        if old is None:
            raise PlaneError("kube-apiserver is not running in this plane")
        _terminate(old)
        state.processes = [p for p in state.processes if p.name != "kube-apiserver"]
        self._save(state)
        self._start_apiserver(state, binaries.require("kube-apiserver"))
        return next(p for p in state.processes if p.name == "kube-apiserver")

    def restart_redis(self) -> Process:
        """Stop redis-server and start it again on the same port. It keeps nothing on disk, so it comes back
        empty, as after a crash: the resolver rebuilds the ledger, the dispatcher and workers find their queues
        gone. Returns once the new redis-server answers."""
        state = self.state()
        old = next((p for p in state.processes if p.name == "redis-server"), None)
        if old is None:
            raise PlaneError("redis-server is not running in this plane")
        _terminate(old)
        state.processes = [p for p in state.processes if p.name != "redis-server"]
        self._save(state)
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise PlaneError("redis-server not found on PATH")
        self._start_redis(state, redis_server)
        return next(p for p in state.processes if p.name == "redis-server")

    def _write_redis_acl(self, state: PlaneState, redis_server: str) -> Path:
        """The ACL file: the default user off, admin with everything, each component with its rules
        (deploy.lockdown.REDIS_ACL)."""
        text = lockdown.redis_acl(
            state.redis_passwords, admin=True, client_setinfo=_redis_version(redis_server) >= (7, 2)
        )
        pki.write_private(self.redis_acl_file, text.encode())
        return self.redis_acl_file

    @property
    def redis_acl_file(self) -> Path:
        return self.directory / "redis-users.acl"

    def _start_redis(self, state: PlaneState, redis_server: str) -> None:
        acl = self._write_redis_acl(state, redis_server)
        self._spawn(
            state,
            "redis-server",
            [
                redis_server,
                "--bind",
                "127.0.0.1",
                "--port",
                str(state.redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--protected-mode",
                "yes",
                "--aclfile",
                str(acl),
            ],
            port=state.redis_port,
        )

    # --- down --------------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every recorded process, newest first; remove etcd's data. Returns the names stopped."""
        state = self.load_state()
        if state is None:
            return []
        stopped = []
        for process in reversed(state.processes):
            if _terminate(process):
                stopped.append(process.name)
        if state.etcd_data:
            shutil.rmtree(state.etcd_data, ignore_errors=True)
        self.state_file.unlink(missing_ok=True)
        return stopped

    # --- helpers for users of a running plane ------------------------------------------------------------

    def kubectl(self, *args: str, identity: str = "admin", check: bool = True) -> str:
        result = subprocess.run(
            [str(binaries.require("kubectl")), f"--kubeconfig={self.kubeconfig(identity)}", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise PlaneError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def exports(self) -> str:
        state = self.state()
        return "\n".join(
            [
                f"export KUBECONFIG={self.kubeconfig('admin')}",
                f"export HOSS_LOCAL_DIR={self.directory}",
                f"export HOSS_REDIS_URL={state.redis_url}",
                f"export PATH={binaries.cache_dir()}:$PATH",
            ]
        )


def scheduler_process_name(scheduler_name: str) -> str:
    """The plane's name for the kube-scheduler process serving ``scheduler_name``."""
    return "kube-scheduler" if scheduler_name == "default-scheduler" else f"kube-scheduler-{scheduler_name}"


def _taskset() -> str:
    taskset = shutil.which("taskset")
    if taskset is None:
        raise PlaneError("taskset not found on PATH; install util-linux to pin a worker to a core")
    return taskset


def _redis_version(redis_server: str) -> tuple[int, ...]:
    """``redis-server --version``'s version, e.g. (7, 0, 15); (0,) when it cannot be read."""
    try:
        output = subprocess.run([redis_server, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return (0,)
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", output)
    return tuple(int(part) for part in found.groups()) if found else (0,)


def _redis_ping(port: int, user: str, password: str) -> bool:
    command = [b"AUTH", user.encode(), password.encode()]
    auth = b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in command)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(auth + b"PING\r\n")
            reply = b""
            while reply.count(b"\r\n") < 2:
                chunk = conn.recv(64)
                if not chunk:
                    break
                reply += chunk
            return reply == b"+OK\r\n+PONG\r\n"
    except OSError:
        return False


def _terminate(process: Process, *, grace_seconds: float = 10.0) -> bool:
    """Stop ``process`` (its whole session) if it is still ours; True when something was stopped."""
    child = _CHILDREN.pop(process.pid, None)
    try:
        if not _pid_alive(process.pid, process.binary):
            return False
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if (child is not None and child.poll() is not None) or not _pid_alive(process.pid, process.binary):
                    return True
                time.sleep(0.1)
        raise PlaneError(f"{process.name} (pid {process.pid}) did not stop after SIGKILL")
    finally:
        if child is not None and child.poll() is None:
            # Reap it: the process is gone or going (SIGKILL was the last word).
            child.wait(timeout=10)
