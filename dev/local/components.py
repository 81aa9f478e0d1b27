"""How the local plane runs each component: the command lines of etcd, kube-apiserver, kube-controller-manager, kwok,
the fake DRA driver, kube-scheduler (and its configuration) and the hoss services. Pure: files and ports in, argv
out; `LocalPlane` starts them.

Everything listens on loopback. etcd does not fsync (its data is on tmpfs when there is one, and a plane is thrown
away after use). The apiserver authorizes with RBAC, authenticates clients by the plane's CA and calls webhooks
with its own client certificate (dev/local/credentials.py). The hoss services get their Redis URL (it holds a
password) in the environment, never on the command line, where ps would show it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deploy import pki
from dev.local.credentials import WEBHOOK_CLIENT_NAME
from dev.local.state import PlaneFiles, PlaneState

WORKLOAD_FEATURE_GATES = ("GenericWorkload=true,GangScheduling=true,TopologyAwareWorkloadScheduling=true,"
                          "WorkloadAwarePreemption=true,WorkloadWithJob=true")
"""Kubernetes 1.36's Workload API (alpha): the apiserver serves scheduling.k8s.io/v1alpha2 Workload and PodGroup
and keeps pods' spec.schedulingGroup; the plane's kube-scheduler places such gangs all-or-nothing, as the control
hoss's gangs are compared with (tests/e2e/test_workload_gangs.py); the Job controller makes a Workload and a gang
PodGroup (minCount = parallelism) for an Indexed Job whose completions equal its parallelism (WorkloadWithJob; the
apiserver grants it the rights by the same gate)."""
WORKLOAD_RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha2=true"

CONTROLLERS = ("replicaset", "deployment", "job", "disruption", "namespace", "garbagecollector", "serviceaccount",
               "persistentvolume-binder-controller", "ephemeral-volume-controller",
               "persistentvolumeclaim-protection-controller", "persistentvolume-protection-controller",
               "resourceclaim-controller")
"""The kube-controller-manager controllers the local plane runs: workloads whose evicted pods come back (ReplicaSet,
Deployment, Job), PodDisruptionBudget status (disruption), namespaces that finish deleting (namespace, and the
garbage collector for owner references), each namespace's default ServiceAccount, and what kube-scheduler's volume
plugins rely on: the persistentvolume-binder (binds claims to PVs, Immediate ones by itself and
WaitForFirstConsumer ones once a scheduler claimed a PV or named a node), the ephemeral-volume controller (the
claim of a generic ephemeral volume) and the claim and PV protection controllers (their finalizers go once
unused, so namespaces with claims finish deleting); and what DynamicResources relies on: the resourceclaim
controller (the ResourceClaim of each pod's ResourceClaimTemplate, and a claim's deallocation once no pod reserves
it). Nothing else (no node lifecycle: kwok plays the kubelets; no attach-detach, no endpoints, no certificates),
which keeps its idle CPU small."""


def etcd_argv(etcd: Path, state: PlaneState) -> list[str]:
    client = f"http://127.0.0.1:{state.etcd_port}"
    peer = f"http://127.0.0.1:{state.etcd_peer_port}"
    return [
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
    ]


def apiserver_argv(apiserver: Path, state: PlaneState, files: PlaneFiles) -> list[str]:
    """With ``state.audit``, it writes an audit log (files.audit_log) of the hoss components' requests."""
    pki_dir = files.pki_dir
    audit = [f"--audit-policy-file={files.audit_policy}", f"--audit-log-path={files.audit_log}",
             "--audit-log-format=json", "--audit-log-maxsize=0"]
    return [
        str(apiserver),
        f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={state.apiserver_port}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={files.ca_cert}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'service-account.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'service-account.key'}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
        *([f"--admission-control-config-file={files.admission_config}"] if state.client_auth else []),
        *(audit if state.audit else []),
        "--endpoint-reconciler-type=none",
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        "--allow-privileged=true",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        f"--runtime-config={WORKLOAD_RUNTIME_CONFIG}",
        "--v=1",
    ]


def controller_manager_argv(controller_manager: Path, files: PlaneFiles, *, port: int) -> list[str]:
    """`CONTROLLERS`, few workers each and no leader election (one per plane)."""
    kubeconfig = files.kubeconfig("kube-controller-manager")
    return [
        str(controller_manager),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--root-ca-file={files.ca_cert}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--concurrent-replicaset-syncs=2",
        "--concurrent-deployment-syncs=2",
        "--concurrent-job-syncs=2",
        "--concurrent-namespace-syncs=2",
        "--concurrent-gc-syncs=2",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        "--kube-api-qps=100",
        "--kube-api-burst=200",
        "--v=1",
    ]


def kwok_argv(kwok: Path, files: PlaneFiles, *, port: int, stages: Path) -> list[str]:
    return [
        str(kwok),
        f"--kubeconfig={files.kubeconfig('kwok')}",
        "--manage-all-nodes=true",
        f"--config={stages}",
        f"--server-address=127.0.0.1:{port}",
        "--node-lease-duration-seconds=0",
    ]


DRA_DRIVER_MODULE = "dev.local.dradriver"
"""What ``python -m`` runs as the plane's fake DRA driver; the plane also recognises its process by this word."""
DRA_DRIVER_PROCESS = "fake-dra-driver"


def dra_driver_argv(files: PlaneFiles) -> list[str]:
    """The fake DRA driver (dev/local/dradriver.py) with kwok's identity: kwok plays the kubelets, the driver their
    DRA plugin."""
    return [sys.executable, "-m", DRA_DRIVER_MODULE, f"--kubeconfig={files.kubeconfig('kwok')}"]


def scheduler_process_name(scheduler_name: str) -> str:
    """The plane's name for the kube-scheduler process serving ``scheduler_name``."""
    return "kube-scheduler" if scheduler_name == "default-scheduler" else f"kube-scheduler-{scheduler_name}"


def scheduler_configuration(files: PlaneFiles, *, scheduler_name: str, qps: int,
                            plugin_config: Sequence[Mapping[str, Any]],
                            percentage_of_nodes_to_score: int | None = None) -> dict[str, Any]:
    """A KubeSchedulerConfiguration with one profile, ``scheduler_name``, and its ``pluginConfig``; no leader
    election (several kube-schedulers may run, each under its own name). ``percentage_of_nodes_to_score``: the
    profile's percentageOfNodesToScore (unset: kube-scheduler's adaptive default)."""
    profile: dict[str, Any] = {"schedulerName": scheduler_name}
    if plugin_config:
        profile["pluginConfig"] = [dict(entry) for entry in plugin_config]
    if percentage_of_nodes_to_score is not None:
        profile["percentageOfNodesToScore"] = percentage_of_nodes_to_score
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(files.kubeconfig("kube-scheduler")), "qps": qps, "burst": qps * 2},
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
    }


def scheduler_argv(scheduler: Path, files: PlaneFiles, *, config: Path, port: int) -> list[str]:
    return [
        str(scheduler),
        f"--config={config}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--authentication-kubeconfig={files.kubeconfig('kube-scheduler')}",
        f"--authorization-kubeconfig={files.kubeconfig('kube-scheduler')}",
        f"--feature-gates={WORKLOAD_FEATURE_GATES}",
        "--v=1",
    ]


RESOLVER_MODULE = "resolver.main"
"""What ``python -m`` runs as hoss-resolver; the plane also recognises its process by this word."""


def resolver_argv(files: PlaneFiles, *, hosts: Sequence[str], port: int, serving: pki.KeyPair, enforce: str,
                  routing_file: Path, extra_args: Sequence[str], client_auth: bool = True) -> list[str]:
    """hoss-resolver listening on each of ``hosts``, serving ``serving``, taking reviews only from the apiserver's
    webhook client certificate (without ``client_auth``: from anyone)."""
    clients = [f"--client-ca-file={files.webhook_client_ca}", f"--client-names={WEBHOOK_CLIENT_NAME}"]
    return [
        sys.executable, "-m", RESOLVER_MODULE,
        f"--kubeconfig={files.kubeconfig('hoss-resolver')}",
        f"--host={','.join(hosts)}",
        f"--port={port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-key-file={serving.key}",
        *(clients if client_auth else []),
        f"--enforce={enforce}",
        f"--routing-file={routing_file}",
        *extra_args,
    ]


def service_argv(module: str, files: PlaneFiles, *, identity: str, name: str, port: int,
                 extra_args: Sequence[str]) -> list[str]:
    """A hoss service (``python -m module``: the dispatcher, the rescheduler) with ``identity``'s kubeconfig, its
    HTTP server on 127.0.0.1:``port``, and ``name`` as its Lease identity."""
    return [
        sys.executable, "-m", module,
        f"--kubeconfig={files.kubeconfig(identity)}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--identity={name}",
        *extra_args,
    ]


def worker_argv(worker_id: str, files: PlaneFiles, *, policies: Sequence[str], policies_file: Path, port: int,
                extra_args: Sequence[str], pin: Sequence[str] = ()) -> list[str]:
    """One hoss-worker serving ``policies`` with the hoss-worker identity; ``pin`` goes first (taskset)."""
    return [
        *pin,
        sys.executable, "-m", "workers.main",
        f"--id={worker_id}",
        f"--policies={','.join(policies)}",
        f"--policies-file={policies_file}",
        f"--kubeconfig={files.kubeconfig('hoss-worker')}",
        "--host=127.0.0.1",
        f"--port={port}",
        *extra_args,
    ]
