"""`hoss certs`: the serving certificate names the resolver's Service, chains to its CA, and lands in a TLS Secret."""

from __future__ import annotations

import base64
import datetime
import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes_asyncio import client

from deploy import certs
from deploy.cli import main as hoss
from tests.unit.tls_apiserver import TLSApiserver

SERVICE_NAMES = ("hoss-resolver.hoss-system.svc", "hoss-resolver.hoss-system.svc.cluster.local")


def alt_names(pem: bytes) -> tuple[list[str], list[str]]:
    extension = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    ips = [str(ip) for ip in extension.value.get_values_for_type(x509.IPAddress)]
    return extension.value.get_values_for_type(x509.DNSName), ips


def test_serving_certificate_names_the_service_and_the_extra_names(tmp_path: Path) -> None:
    names = certs.serving_names(extra=["Resolver.Example.com", "10.0.0.7", "::1"])
    material = certs.issue_serving(tmp_path, names)

    dns, ips = alt_names(material.cert)
    assert dns == [*SERVICE_NAMES, "resolver.example.com"]
    assert ips == ["10.0.0.7", "::1"]
    subject = x509.load_pem_x509_certificate(material.cert).subject
    assert subject.rfc4514_string() == "CN=hoss-resolver.hoss-system.svc"


def test_service_names_follow_namespace_service_and_cluster_domain() -> None:
    names = certs.serving_names(service="guard", namespace="sched", cluster_domain="corp.internal")
    assert names.dns_names == ("guard.sched.svc", "guard.sched.svc.corp.internal")
    assert names.common_name == "guard.sched.svc"


def test_serving_certificate_chains_to_the_ca_and_is_only_good_for_serving(tmp_path: Path) -> None:
    material = certs.issue_serving(tmp_path, certs.serving_names())
    ca = x509.load_pem_x509_certificate(material.ca_cert)
    serving = x509.load_pem_x509_certificate(material.cert)

    serving.verify_directly_issued_by(ca)  # raises when the signature or issuer name is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usages = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert serving.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)


def test_a_rerun_into_the_same_directory_keeps_the_ca_and_reissues_the_serving_certificate(tmp_path: Path) -> None:
    first = certs.issue_serving(tmp_path, certs.serving_names())
    second = certs.issue_serving(tmp_path, certs.serving_names(extra=["127.0.0.1"]))

    assert second.ca_cert == first.ca_cert, "the caBundle already registered must stay valid"
    assert second.cert != first.cert
    assert alt_names(second.cert)[1] == ["127.0.0.1"]
    x509.load_pem_x509_certificate(second.cert).verify_directly_issued_by(
        x509.load_pem_x509_certificate(first.ca_cert)
    )


@pytest.mark.parametrize("bad", ["under_score", "-leading.dash", "a..b", "x" * 254, "spaces in name"])
def test_an_extra_name_that_is_neither_dns_nor_ip_is_refused_by_value(bad: str) -> None:
    with pytest.raises(certs.CertsError, match="neither an IP address nor a valid DNS name") as error:
        certs.serving_names(extra=[bad])
    assert repr(bad) in str(error.value)


def test_secret_is_a_kubernetes_tls_secret_that_also_carries_the_ca(tmp_path: Path) -> None:
    material = certs.issue_serving(tmp_path, certs.serving_names())
    secret = certs.tls_secret(name="hoss-resolver-tls", namespace="hoss-system", material=material)

    assert secret["apiVersion"] == "v1"
    assert secret["kind"] == "Secret"
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "hoss-resolver-tls"
    assert secret["metadata"]["namespace"] == "hoss-system"
    data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
    assert data == {"tls.crt": material.cert, "tls.key": material.key, "ca.crt": material.ca_cert}
    assert data["tls.key"].startswith(b"-----BEGIN PRIVATE KEY-----")


def test_bundle_keeps_the_ca_being_served_beside_the_new_one_during_rotation(tmp_path: Path) -> None:
    old = certs.issue_serving(tmp_path / "old", certs.serving_names())
    new = certs.issue_serving(tmp_path / "new", certs.serving_names())

    bundle = x509.load_pem_x509_certificates(certs.ca_bundle(new.ca_cert, previous=old.ca_cert))

    assert bundle == [x509.load_pem_x509_certificate(pem) for pem in (new.ca_cert, old.ca_cert)]
    for material in (old, new):  # both serving certificates verify against the bundle
        serving = x509.load_pem_x509_certificate(material.cert)
        assert any(_issued_by(serving, ca) for ca in bundle)


def test_bundle_drops_expired_and_repeated_cas_and_anything_that_is_not_a_ca(tmp_path: Path) -> None:
    material = certs.issue_serving(tmp_path, certs.serving_names())
    ca = x509.load_pem_x509_certificate(material.ca_cert)

    repeated = certs.ca_bundle(material.ca_cert, previous=material.ca_cert + material.cert)
    assert x509.load_pem_x509_certificates(repeated) == [ca]

    older = certs.issue_serving(tmp_path / "older", certs.serving_names())
    after_expiry = ca.not_valid_after_utc + datetime.timedelta(days=1)
    expired = certs.ca_bundle(material.ca_cert, previous=older.ca_cert, now=after_expiry)
    assert x509.load_pem_x509_certificates(expired) == [ca]


def test_ca_bundle_patch_sets_every_webhook_and_guards_each_by_name() -> None:
    configuration = {
        "metadata": {"name": "hoss-resolver"},
        "webhooks": [{"name": "binding.resolver.hoss.io"}, {"name": "other.resolver.hoss.io"}],
    }
    patch = certs.ca_bundle_patch(configuration, b"PEM")
    assert patch == [
        {"op": "test", "path": "/webhooks/0/name", "value": "binding.resolver.hoss.io"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "UEVN"},
        {"op": "test", "path": "/webhooks/1/name", "value": "other.resolver.hoss.io"},
        {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "UEVN"},
    ]
    with pytest.raises(certs.CertsError, match="hoss-resolver has no webhooks"):
        certs.ca_bundle_patch({"metadata": {"name": "hoss-resolver"}, "webhooks": []}, b"PEM")


def test_hoss_certs_output_writes_pem_files_and_an_appliable_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "certs"
    assert hoss(["certs", "--output", str(out), "--san", "192.0.2.10", "--namespace", "sched"]) == 0

    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "secret.yaml", "tls.crt", "tls.key"]
    for private in ("ca.key", "tls.key", "secret.yaml"):
        assert (out / private).stat().st_mode & 0o077 == 0, f"{private} must be readable by its owner only"
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    assert secret["metadata"] == {**secret["metadata"], "name": "hoss-resolver-tls", "namespace": "sched"}
    assert base64.b64decode(secret["data"]["tls.crt"]) == (out / "tls.crt").read_bytes()
    dns, ips = alt_names((out / "tls.crt").read_bytes())
    assert dns[:2] == ["hoss-resolver.sched.svc", "hoss-resolver.sched.svc.cluster.local"]
    assert [ipaddress.ip_address(ip) for ip in ips] == [ipaddress.ip_address("192.0.2.10")]
    printed = capsys.readouterr().out
    assert base64.b64encode((out / "ca.crt").read_bytes()).decode() in printed, "the caBundle to register"


def test_hoss_certs_names_a_missing_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.yaml"
    assert hoss(["certs", "--kubeconfig", str(missing)]) == 2
    assert f"kubeconfig {missing} not found" in capsys.readouterr().err


def _issued_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def test_inside_a_pod_without_a_kubeconfig_hoss_certs_takes_the_pods_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Helm chart's certificate Job runs `hoss certs` with no kubeconfig, as its pod's ServiceAccount."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(certs.CertsError, match="not found: pass --kubeconfig"):
        certs.kubeconfig_location(None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert certs.kubeconfig_location(None) is None
    explicit = tmp_path / "admin.yaml"
    with pytest.raises(certs.CertsError, match=f"kubeconfig {explicit} not found"):
        certs.kubeconfig_location(str(explicit))


async def test_the_service_account_client_calls_the_apiserver_over_tls_with_the_mounted_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = TLSApiserver(tmp_path)
    await server.start()
    try:
        token = tmp_path / "token"
        token.write_text("pod-token")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        api = await certs.connect(None, token_file=str(token), ca_file=str(server.ca.cert))
        try:
            admission: Any = client.AdmissionregistrationV1Api(api)
            await admission.read_validating_webhook_configuration("hoss-resolver", _preload_content=False)
        finally:
            await api.close()
    finally:
        await server.stop()
    (seen,) = server.seen
    assert seen.raw_path == "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/hoss-resolver"
    assert seen.authorization == "Bearer pod-token"


async def test_a_pod_without_its_service_account_token_is_told_so(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(certs.CertsError, match="cannot use the pod's service account"):
        await certs.connect(None, token_file=str(tmp_path / "absent"), ca_file=str(tmp_path / "absent-ca"))
