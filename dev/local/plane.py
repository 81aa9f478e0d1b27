"""The local control plane: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and redis-server
on loopback, a fake DRA driver publishing GPUs for labelled kwok nodes, and the hoss processes started on it.

`LocalPlane` is what its users call: ``up`` starts every part in order, ``down`` stops every recorded process and
removes etcd's data, and the ``start_*`` / ``stop_*`` / ``restart_*`` methods start, stop and restart single parts
(tests stop the resolver, restart the apiserver, run a second kube-scheduler). The parts live beside it: the state
directory and state.json (dev/local/state.py), certificates and kubeconfigs (credentials.py), each component's
command line (components.py), the fake DRA driver (dradriver.py, its devices in devices.py), process supervision
(processes.py), health probes (health.py), redis-server (redis_server.py) and the webhook configurations
(webhooks.py).

Everything a plane needs lives in one state directory: certificates, one kubeconfig per identity, logs, pid
records and ``state.json`` (ports and processes). etcd keeps its data on tmpfs (/dev/shm) when there is one.
Processes run in their own sessions, so a plane outlives the ``python -m dev local up`` that started it.

redis-server runs with ACL users and no usable default user: ``admin`` (the operator's and the tests' URL,
``PlaneState.redis_url``) and one user per hoss component with only the commands and keys it needs; each component
is started with its own ``redis://<user>:<password>@...`` URL. With ``audit``, the apiserver writes an audit log
(Metadata level, the hoss components' requests only) to ``logs/audit.log``: what each component really calls, for
tests/e2e's RBAC check.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from deploy import pki
from dev.local import binaries, components, credentials, kueue, processes, redis_server
from dev.local.credentials import HOSS_COMPONENTS, IDENTITIES
from dev.local.errors import PlaneError
from dev.local.health import healthy
from dev.local.ports import bind_error, free_port
from dev.local.state import PlaneFiles, PlaneState, Process, default_directory, load_state, save_state
from dev.local.webhooks import LANE_HOSTS, webhook_configuration

REPOSITORY = Path(__file__).resolve().parents[2]
DEPLOY_DIR = REPOSITORY / "deploy"
RBAC_MANIFEST = DEPLOY_DIR / "rbac.yaml"
WEBHOOK_MANIFEST = DEPLOY_DIR / "webhook.yaml"
ROUTER_MANIFEST = DEPLOY_DIR / "router.yaml"
POLICIES_FILE = REPOSITORY / "configs" / "policies.yaml"
"""The policy profiles the plane's workers (and in-process test workers) read."""
ROUTING_FILE = REPOSITORY / "configs" / "routing.yaml"
KWOK_STAGES = Path(__file__).resolve().parent / "kwok" / "stages.yaml"
CRDS = ("podgroups.scheduling.x-k8s.io", "podgroups.scheduling.volcano.sh", "elasticquotas.scheduling.x-k8s.io",
        "reservations.scheduling.koordinator.sh")


def _check_port_free(port: int, owner: str) -> int:
    error = bind_error(port)
    if error is not None:
        raise PlaneError(f"port {port} asked for {owner} is in use on 127.0.0.1: {error.strerror}") from error
    return port


class LocalPlane:
    """Start, inspect and stop one local control plane whose state lives in ``directory``."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = (directory or default_directory()).resolve()
        self.files = PlaneFiles(self.directory)
        self.pki_dir = self.files.pki_dir
        self.log_dir = self.files.log_dir
        self.webhook_client_dir = self.files.webhook_client_dir
        self.webhook_client_ca = self.files.webhook_client_ca
        """The CA of the apiserver's webhook client certificate: the resolver's --client-ca-file."""
        self.audit_log = self.files.audit_log

    # --- state -------------------------------------------------------------------------------------------

    def load_state(self) -> PlaneState | None:
        return load_state(self.files)

    def state(self) -> PlaneState:
        """The recorded state of a running plane; raise when the plane is not up."""
        state = self.load_state()
        if state is None:
            raise PlaneError(f"no local plane in {self.directory}; start one with `python -m dev local up`")
        return state

    def kubeconfig(self, identity: str = "admin") -> Path:
        if identity not in IDENTITIES:
            raise PlaneError(f"unknown identity {identity!r}; known: {', '.join(IDENTITIES)}")
        return self.files.kubeconfig(identity)

    def status(self) -> dict[str, bool]:
        """Each recorded process and whether it is alive and healthy."""
        state = self.load_state()
        if state is None:
            return {}
        return {p.name: processes.alive(p) and healthy(p, state, self.files) for p in state.processes}

    def is_up(self) -> bool:
        status = self.status()
        return bool(status) and all(status.values())

    def running(self, name: str) -> Process | None:
        """The recorded process ``name`` when it is alive, else None."""
        process = self.state().process(name)
        return process if process is not None and processes.alive(process) else None

    # --- up and down -------------------------------------------------------------------------------------

    def up(
        self,
        *,
        apiserver_port: int | None = None,
        redis_port: int | None = None,
        scheduler: bool = True,
        webhook: bool = True,
        audit: bool = False,
        client_auth: bool = True,
        progress: Callable[[str], None] = lambda _message: None,
    ) -> PlaneState:
        """Start every component not yet running; a plane that is already up is left as it is. ``audit`` turns on
        the apiserver's audit log of the hoss components' requests (``audit_log``). Without ``client_auth`` the plane
        is as a managed control plane: no admission configuration, so webhooks get no client certificate, and the
        resolver authenticates no review."""
        existing = self.load_state()
        if existing is not None and self.is_up():
            progress(f"local plane already up in {self.directory}")
            return existing
        if existing is not None:
            progress("a previous plane is partly running; stopping what is left before starting afresh")
            self.down()
        state = PlaneState(directory=str(self.directory), audit=audit, client_auth=client_auth)
        state.apiserver_port = (
            _check_port_free(apiserver_port, "kube-apiserver") if apiserver_port else free_port()
        )
        state.redis_port = _check_port_free(redis_port, "redis-server") if redis_port else free_port()
        paths = {b.name: binaries.require(b.name) for b in binaries.BINARIES}
        redis = redis_server.find_redis_server()
        for directory in (self.files.pki_dir, self.files.kubeconfig_dir, self.files.log_dir):
            directory.mkdir(parents=True, exist_ok=True)
        state.redis_passwords = {user: secrets.token_urlsafe(24) for user in ("admin", *HOSS_COMPONENTS)}
        state.etcd_port = free_port()
        state.etcd_peer_port = free_port()
        shm = Path("/dev/shm")
        data_root = shm if shm.is_dir() and os.access(shm, os.W_OK) else self.directory
        state.etcd_data = str(data_root / f"hoss-etcd-{abs(hash(str(self.directory))) % 10**8}")
        shutil.rmtree(state.etcd_data, ignore_errors=True)
        save_state(self.files, state)

        progress("writing certificates and kubeconfigs")
        credentials.write_credentials(self.files, apiserver_url=state.apiserver_url)
        try:
            progress(f"starting etcd on 127.0.0.1:{state.etcd_port}")
            self._spawn(state, "etcd", components.etcd_argv(paths["etcd"], state), port=state.etcd_port)
            progress(f"starting kube-apiserver on {state.apiserver_url}")
            self._start_apiserver(state, paths["kube-apiserver"])
            progress("applying RBAC for the hoss components (deploy/rbac.yaml)")
            self.kubectl("apply", "-f", str(RBAC_MANIFEST))
            progress("installing the CRDs hoss uses (deploy/crds: PodGroups, ElasticQuota, Reservation)")
            self.kubectl("apply", "-k", str(DEPLOY_DIR / "crds"))
            self.kubectl("wait", "--for=condition=Established", *(f"crd/{crd}" for crd in CRDS), "--timeout=60s")
            progress("starting kube-controller-manager (" + ",".join(components.CONTROLLERS) + ")")
            self._start_controller_manager(state, paths["kube-controller-manager"])
            progress("starting kwok (fake kubelets)")
            self._spawn(state, "kwok", components.kwok_argv(paths["kwok"], self.files, port=free_port(),
                                                            stages=KWOK_STAGES))
            progress("starting the fake DRA driver (GPUs for nodes labelled dra.hoss.dev/gpus; dev/local/devices.py)")
            self._start_dra_driver(state)
            if scheduler:
                progress("starting kube-scheduler (default-scheduler)")
                self.start_scheduler(state, scheduler_name="default-scheduler")
            progress(f"starting redis-server on 127.0.0.1:{state.redis_port}")
            self._start_redis(state, redis)
            if webhook:
                progress("starting hoss-resolver and registering its webhook on bindings")
                self.start_resolver(state)
                self.register_webhook()
        except BaseException:
            self.down()
            raise
        progress("local plane is up")
        return state

    def down(self) -> list[str]:
        """Stop every recorded process, newest first; remove etcd's data. Returns the names stopped."""
        state = self.load_state()
        if state is None:
            return []
        stopped = [process.name for process in reversed(state.processes) if processes.terminate(process)]
        if state.etcd_data:
            shutil.rmtree(state.etcd_data, ignore_errors=True)
        self.files.state_file.unlink(missing_ok=True)
        return stopped

    # --- starting and waiting ----------------------------------------------------------------------------

    def _spawn(self, state: PlaneState, name: str, argv: Sequence[str], *, port: int = 0, binary: str | None = None,
               wait: bool = True, env: Mapping[str, str] | None = None) -> Process:
        """Start ``argv`` as the plane's process ``name`` (replacing a record of that name) and record it; with
        ``wait``, return once it is healthy."""
        process = processes.spawn(name, argv, log_dir=self.files.log_dir, cwd=self.directory, port=port,
                                  binary=binary, env=env)
        state.processes = [p for p in state.processes if p.name != name] + [process]
        save_state(self.files, state)
        if wait:
            processes.wait_healthy(process, functools.partial(healthy, process, state, self.files))
        return process

    def wait_healthy(self, started: Sequence[Process]) -> None:
        """Wait until each of ``started`` (started by this Python process with ``wait=False``) is healthy, so
        that several start at once; raise as a start would when one exits or stays unhealthy."""
        state = self.state()
        for process in started:
            processes.wait_healthy(process, functools.partial(healthy, process, state, self.files))

    def _start_apiserver(self, state: PlaneState, apiserver: Path) -> None:
        self._spawn(state, "kube-apiserver", components.apiserver_argv(apiserver, state, self.files),
                    port=state.apiserver_port)

    def _start_controller_manager(self, state: PlaneState, controller_manager: Path) -> None:
        port = free_port()
        self._spawn(state, "kube-controller-manager",
                    components.controller_manager_argv(controller_manager, self.files, port=port), port=port)

    def _start_dra_driver(self, state: PlaneState) -> None:
        # `dev` is not installed with hoss: the driver finds it in this checkout.
        path = os.pathsep.join(filter(None, (str(REPOSITORY), os.environ.get("PYTHONPATH"))))
        self._spawn(state, components.DRA_DRIVER_PROCESS, components.dra_driver_argv(self.files),
                    binary=components.DRA_DRIVER_MODULE, env={"PYTHONPATH": path})

    def _start_redis(self, state: PlaneState, redis: str) -> None:
        acl = redis_server.write_acl(self.files.redis_acl_file, state.redis_passwords, redis_server=redis)
        self._spawn(state, "redis-server",
                    redis_server.redis_argv(redis, port=state.redis_port, directory=self.directory, acl=acl),
                    port=state.redis_port)

    def start_controller_manager(self) -> Process:
        """Start the plane's kube-controller-manager again (after ``stop_process("kube-controller-manager")``)."""
        state = self.state()
        self._start_controller_manager(state, binaries.require("kube-controller-manager"))
        return self._recorded(state, "kube-controller-manager")

    def start_scheduler(
        self,
        state: PlaneState | None = None,
        *,
        scheduler_name: str,
        qps: int = 5000,
        plugin_config: Sequence[Mapping[str, Any]] = (),
        percentage_of_nodes_to_score: int | None = None,
    ) -> Process:
        """Start a real kube-scheduler serving ``scheduler_name`` (several may run under different names).

        ``plugin_config`` is the profile's ``pluginConfig`` (e.g. NodeResourcesFit's scoring strategy);
        ``percentage_of_nodes_to_score`` its percentageOfNodesToScore (unset: the adaptive default). Its
        ``/metrics`` is readable over HTTPS on the Process's port with the admin identity (system:masters).
        """
        state = state or self.state()
        config = self.directory / f"kube-scheduler-{scheduler_name}.yaml"
        configuration = components.scheduler_configuration(
            self.files, scheduler_name=scheduler_name, qps=qps, plugin_config=plugin_config,
            percentage_of_nodes_to_score=percentage_of_nodes_to_score)
        config.write_text(json.dumps(configuration, indent=2))
        port = free_port()
        argv = components.scheduler_argv(binaries.require("kube-scheduler"), self.files, config=config, port=port)
        return self._spawn(state, components.scheduler_process_name(scheduler_name), argv, port=port)

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
        serving = serving or credentials.resolver_serving_pair(self.files, ip_addresses=LANE_HOSTS)
        port = free_port()
        argv = components.resolver_argv(self.files, hosts=LANE_HOSTS, port=port, serving=serving, enforce=enforce,
                                        routing_file=ROUTING_FILE, extra_args=extra_args,
                                        client_auth=state.client_auth)
        return self._spawn(state, name, argv, port=port, binary=components.RESOLVER_MODULE, wait=wait,
                           env={"HOSS_REDIS_URL": state.redis_url_for("hoss-resolver")})

    def start_kueue(self) -> Process:
        """Start Kueue's controller manager (dev/local/kueue.py) with the admin identity, its CRDs installed first;
        healthy once its readiness probe answers."""
        state = self.state()
        crds = kueue.crd_files()
        self.kubectl("apply", "--server-side", "--force-conflicts", *(arg for crd in crds for arg in ("-f", str(crd))))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                     *(f"crd/{crd.stem.split('_', 1)[1]}.{crd.stem.split('_', 1)[0]}" for crd in crds))
        cert_dir = self.directory / "kueue-certs"
        serving = pki.issue(pki.ensure_ca(self.files.pki_dir), directory=self.files.pki_dir, name="kueue-serving",
                            common_name="kueue-webhook", dns_names=("localhost",), ip_addresses=("127.0.0.1",),
                            server=True)
        for directory in (cert_dir, kueue.METRICS_CERT_DIR):
            try:
                directory.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(serving.cert, directory / "tls.crt")
                shutil.copyfile(serving.key, directory / "tls.key")
            except OSError as error:
                raise PlaneError(f"cannot write Kueue's certificate to {directory} (its binary reads the metrics "
                                 f"one from there): {error}") from error
        port = free_port()
        config = self.directory / "kueue.yaml"
        config.write_text(json.dumps(kueue.configuration(health_port=port, webhook_port=free_port(),
                                                         cert_dir=cert_dir), indent=2))
        argv = kueue.argv(binaries.require("kueue"), config=config, kubeconfig=self.kubeconfig("admin"))
        return self._spawn(state, kueue.PROCESS_NAME, argv, port=port)

    def start_dispatcher(
        self, state: PlaneState | None = None, *, name: str = "hoss-dispatcher", extra_args: Sequence[str] = (),
        wait: bool = True, port: int | None = None,
    ) -> Process:
        """Start hoss-dispatcher with its own identity; its HTTP port (status, dashboard) is in the Process
        (``wait=False``: return at once, see `wait_healthy`; ``port``: that one, e.g. a stopped dispatcher's,
        instead of a free one)."""
        return self._start_service("dispatcher.main", "hoss-dispatcher", state, name=name, extra_args=extra_args,
                                   wait=wait, port=port)

    def start_rescheduler(
        self, state: PlaneState | None = None, *, name: str = "hoss-rescheduler", extra_args: Sequence[str] = (),
        wait: bool = True,
    ) -> Process:
        """Start hoss-rescheduler with its own identity (`extra_args`: its settings, e.g. --node-selector;
        ``wait=False``: return at once, see `wait_healthy`)."""
        return self._start_service("rescheduler.main", "hoss-rescheduler", state, name=name, extra_args=extra_args,
                                   wait=wait)

    def _start_service(self, module: str, identity: str, state: PlaneState | None, *, name: str,
                       extra_args: Sequence[str], wait: bool, port: int | None = None) -> Process:
        """A hoss service (`python -m module`) with `identity`'s kubeconfig and Redis user, on a free port."""
        state = state or self.state()
        port = port or free_port()
        argv = components.service_argv(module, self.files, identity=identity, name=name, port=port,
                                       extra_args=extra_args)
        return self._spawn(state, name, argv, port=port, binary=module, wait=wait,
                           env={"HOSS_REDIS_URL": state.redis_url_for(identity)})

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
        pin = [] if cpu is None else [processes.taskset(), "-c", str(cpu)]
        argv = components.worker_argv(worker_id, self.files, policies=policies, policies_file=POLICIES_FILE,
                                      port=port, extra_args=extra_args, pin=pin)
        return self._spawn(state, f"hoss-worker-{worker_id}", argv, port=port, binary="workers.main", wait=wait,
                           env={"HOSS_REDIS_URL": state.redis_url_for("hoss-worker")})

    # --- the resolver's webhooks -------------------------------------------------------------------------

    def webhook_configuration(self, manifest: Path = WEBHOOK_MANIFEST) -> dict[str, object]:
        """deploy/webhook.yaml (or `manifest`, e.g. deploy/router.yaml), pointed at the local resolver by URL with
        the plane's CA as caBundle."""
        resolver = self.state().process("hoss-resolver")
        if resolver is None:
            raise PlaneError("hoss-resolver is not running in this plane; start it before registering the webhook")
        return webhook_configuration(manifest, resolver_port=resolver.port, ca_cert=self.files.ca_cert)

    def register_webhook(self) -> None:
        """Register the resolver's webhooks: the validating one on bindings and the router (deploy/router.yaml)."""
        for manifest, written in ((WEBHOOK_MANIFEST, "webhook.json"), (ROUTER_MANIFEST, "router.json")):
            path = self.directory / written
            path.write_text(json.dumps(self.webhook_configuration(manifest), indent=2))
            self.kubectl("apply", "-f", str(path))

    def unregister_webhook(self) -> None:
        self.kubectl("delete", "validatingwebhookconfiguration", "hoss-resolver", "--ignore-not-found")
        self.kubectl("delete", "mutatingwebhookconfiguration", "hoss-router", "--ignore-not-found")

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

    # --- stopping and restarting -------------------------------------------------------------------------

    def stop_process(self, name: str) -> None:
        """Stop one recorded process (e.g. an extra kube-scheduler) and forget it."""
        self._forget(name)

    def stop_processes(self, names: Sequence[str]) -> None:
        """Stop several recorded processes at once (each gets SIGTERM first, then each is waited for) and
        forget them."""
        state = self.state()
        chosen = [p for p in state.processes if p.name in set(names)]
        processes.terminate_all(chosen)
        state.processes = [p for p in state.processes if p.name not in set(names)]
        save_state(self.files, state)

    def stop_scheduler(self, scheduler_name: str = "default-scheduler") -> None:
        """Stop a kube-scheduler started by ``start_scheduler`` (the plane's own by default); state.json forgets
        it, and ``start_scheduler`` brings it back."""
        self.stop_process(components.scheduler_process_name(scheduler_name))

    def restart_apiserver(self) -> Process:
        """Stop kube-apiserver and start it again on the same port over the same etcd (no data is lost), as a
        control-plane upgrade does: every client sees its connections drop and its watches end mid-stream.
        Returns once the new apiserver is ready."""
        state = self._stopped_for_restart("kube-apiserver")
        self._start_apiserver(state, binaries.require("kube-apiserver"))
        return self._recorded(state, "kube-apiserver")

    def restart_redis(self) -> Process:
        """Stop redis-server and start it again on the same port. It keeps nothing on disk, so it comes back
        empty, as after a crash: the resolver rebuilds the ledger, the dispatcher and workers find their queues
        gone. Returns once the new redis-server answers."""
        state = self._stopped_for_restart("redis-server")
        self._start_redis(state, redis_server.find_redis_server())
        return self._recorded(state, "redis-server")

    def _stopped_for_restart(self, name: str) -> PlaneState:
        """The state after stopping ``name``, which must be recorded."""
        if self.state().process(name) is None:
            raise PlaneError(f"{name} is not running in this plane")
        return self._forget(name)

    def _forget(self, name: str) -> PlaneState:
        """Stop the recorded process ``name`` (if any) and forget it; the state after."""
        state = self.state()
        for process in [p for p in state.processes if p.name == name]:
            processes.terminate(process)
        state.processes = [p for p in state.processes if p.name != name]
        save_state(self.files, state)
        return state

    @staticmethod
    def _recorded(state: PlaneState, name: str) -> Process:
        process = state.process(name)
        if process is None:
            raise PlaneError(f"{name} was started but is not recorded in the plane's state")
        return process

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
