"""Certificates and kubeconfigs of a local plane, and the apiserver's configuration files that name them.

Identities: ``admin`` (system:masters), ``kube-scheduler`` (system:kube-scheduler), ``kube-controller-manager``
(system:kube-controller-manager; each controller then acts as its own ServiceAccount in kube-system, through
TokenRequest, as kubeadm runs it), ``kwok`` (plays the kubelets), and one per hoss component whose user name is its
ServiceAccount's (``system:serviceaccount:hoss-system:<name>``), so the RBAC in deploy/rbac.yaml, the same file a
real cluster gets, is what the local plane enforces. Each has a client certificate from the plane's CA and a
kubeconfig of its own.

The apiserver authenticates itself to the resolver webhook as a real cluster's is set up to: its admission
configuration (``--admission-control-config-file``) names a kubeconfig whose client certificate (common name
``kube-apiserver``) comes from a CA of its own, ``pki/webhook-client/ca.crt``, which is the resolver's
``--client-ca-file``. Nothing else holds a certificate from that CA, so no other identity can post reviews. The
audit policy logs the hoss components' requests only (Metadata level).
"""

from __future__ import annotations

import json
from pathlib import Path

from deploy import lockdown, pki
from dev.local.state import PlaneFiles

HOSS_NAMESPACE = "hoss-system"
HOSS_COMPONENTS = ("hoss-dispatcher", "hoss-worker", "hoss-resolver", "hoss-rescheduler")
IDENTITIES = ("admin", "kube-scheduler", "kube-controller-manager", "kwok", *HOSS_COMPONENTS)
WEBHOOK_CLIENT_NAME = lockdown.WEBHOOK_CLIENT_NAME


def write_credentials(files: PlaneFiles, *, apiserver_url: str) -> None:
    """The plane's CA, the apiserver's serving certificate, the service-account signing key, a client certificate
    and kubeconfig per identity, the admission configuration and the audit policy."""
    ca = pki.ensure_ca(files.pki_dir)
    pki.issue(
        ca,
        directory=files.pki_dir,
        name="apiserver",
        common_name="kube-apiserver",
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        ip_addresses=("127.0.0.1", "10.96.0.1"),
        server=True,
    )
    pki.ensure_signing_key(files.pki_dir / "service-account.key")
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
            ca, directory=files.pki_dir, name=f"client-{identity}", common_name=common_name, organizations=groups
        )
        _write_kubeconfig(files.kubeconfig(identity), identity=identity, apiserver_url=apiserver_url, ca=ca.cert,
                          pair=pair)
    _write_admission_config(files)
    _write_audit_policy(files)


def resolver_serving_pair(files: PlaneFiles, *, ip_addresses: tuple[str, ...]) -> pki.KeyPair:
    """The resolver's serving certificate from the plane's CA, for ``ip_addresses`` (its lanes' loopback
    addresses)."""
    ca = pki.ensure_ca(files.pki_dir)
    return pki.issue(ca, directory=files.pki_dir, name="resolver-serving", common_name="hoss-resolver",
                     dns_names=("localhost",), ip_addresses=ip_addresses, server=True)


def _write_admission_config(files: PlaneFiles) -> None:
    """The apiserver's admission configuration: it presents a client certificate from the webhook-client CA to
    every webhook (user ``*``; the plane's only webhooks are hoss resolvers, on ports chosen later)."""
    client_ca = pki.ensure_ca(files.webhook_client_dir, common_name="hoss-local-webhook-client-ca")
    pair = pki.issue(client_ca, directory=files.webhook_client_dir, name="apiserver", common_name=WEBHOOK_CLIENT_NAME)
    kubeconfig = files.webhook_client_dir / "kubeconfig.yaml"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1",
        "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
    }, indent=2))
    files.admission_config.write_text(json.dumps({
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


def _write_audit_policy(files: PlaneFiles) -> None:
    """Metadata (who, verb, resource, response code; no bodies) for the hoss components' requests only."""
    users = [f"system:serviceaccount:{HOSS_NAMESPACE}:{component}" for component in HOSS_COMPONENTS]
    files.audit_policy.write_text(json.dumps({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": users}, {"level": "None"}],
    }, indent=2))


def _write_kubeconfig(path: Path, *, identity: str, apiserver_url: str, ca: Path, pair: pki.KeyPair) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hoss-local", "cluster": {"server": apiserver_url, "certificate-authority": str(ca)}}],
        "users": [{"name": identity, "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
        "contexts": [{"name": identity, "context": {"cluster": "hoss-local", "user": identity}}],
        "current-context": identity,
    }
    # JSON is valid YAML; kubectl and every client read it.
    path.write_text(json.dumps(config, indent=2))
