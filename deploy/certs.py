"""``hoss certs``: the resolver's serving certificate, and the apiserver's trust in it.

Makes a CA and a serving certificate for the resolver's Service (``<service>.<namespace>.svc`` and the same name
under the cluster domain, plus any extra names asked for), then either writes them to a directory or installs them
through the Kubernetes API: the Secret the resolver Deployment mounts (type kubernetes.io/tls, with ``ca.crt``) and
the ``caBundle`` of every webhook in the ValidatingWebhookConfiguration.

Rotation never leaves a gap in which the apiserver distrusts the resolver (with ``failurePolicy: Fail`` that would
stop every binding): the caBundle is written first and keeps the CA of the certificate served now (the Secret's
current ``ca.crt``) beside the new one, so both the old and the new serving certificate are trusted until the kubelet
has refreshed the mounted Secret and the resolver has reloaded it. The next run drops that older CA. In API mode the
CA's private key is thrown away once the serving certificate is signed: nothing can mint another certificate the
webhook would trust.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.config.incluster_config import SERVICE_CERT_FILENAME, SERVICE_TOKEN_FILENAME

from deploy import pki
from hoss.model.objects import Json

DEFAULT_NAMESPACE = "hoss-system"
DEFAULT_SERVICE = "hoss-resolver"
DEFAULT_SECRET = "hoss-resolver-tls"
DEFAULT_WEBHOOK = "hoss-resolver"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"
CA_COMMON_NAME = "hoss-resolver-ca"
FIELD_MANAGER = "hoss-certs"

_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")


class CertsError(RuntimeError):
    """Certificates cannot be made or installed; the message names the object or file and what went wrong."""


@dataclass(frozen=True)
class ServingNames:
    """The names a serving certificate must carry; the first DNS name is also its common name."""

    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...] = ()

    @property
    def common_name(self) -> str:
        return self.dns_names[0]


@dataclass(frozen=True)
class Material:
    """PEM bytes of a CA certificate and of a serving certificate and key that it signed."""

    ca_cert: bytes
    cert: bytes
    key: bytes


def serving_names(
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    extra: Sequence[str] = (),
) -> ServingNames:
    """The apiserver calls a webhook Service as ``<service>.<namespace>.svc``; ``extra`` adds DNS names or IPs."""
    dns = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.{cluster_domain}"]
    ips: list[str] = []
    for raw in extra:
        name = raw.strip().lower()
        try:
            ips.append(str(ipaddress.ip_address(name)))
            continue
        except ValueError:
            pass
        if len(name) > 253 or not _DNS_NAME.match(name):
            raise CertsError(f"extra name {raw!r} is neither an IP address nor a valid DNS name")
        dns.append(name)
    for name in dns[:2]:
        if not _DNS_NAME.match(name):
            raise CertsError(
                f"{name!r} (from service {service!r}, namespace {namespace!r}, cluster domain {cluster_domain!r})"
                " is not a valid DNS name"
            )
    return ServingNames(dns_names=tuple(dict.fromkeys(dns)), ip_addresses=tuple(dict.fromkeys(ips)))


def issue_serving(directory: Path, names: ServingNames) -> Material:
    """A serving certificate for ``names`` from the CA in ``directory`` (made there if absent).

    The CA is reused so that a re-run keeps the caBundle already registered; the serving certificate is always new,
    so a changed list of names takes effect.
    """
    try:
        ca = pki.ensure_ca(directory, common_name=CA_COMMON_NAME)
        pair = pki.issue(
            ca,
            directory=directory,
            name="tls",
            common_name=names.common_name,
            dns_names=names.dns_names,
            ip_addresses=names.ip_addresses,
            server=True,
            reuse=False,
        )
        return Material(ca_cert=ca.cert.read_bytes(), cert=pair.cert.read_bytes(), key=pair.key.read_bytes())
    except (OSError, ValueError, TypeError) as error:
        raise CertsError(f"cannot make certificates in {directory}: {error}") from error


def tls_secret(*, name: str, namespace: str, material: Material) -> Json:
    """The Secret the resolver mounts: a kubernetes.io/tls Secret that also carries the CA as ``ca.crt``."""

    def encoded(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "hoss-resolver",
                "app.kubernetes.io/part-of": "hoss",
                "app.kubernetes.io/managed-by": FIELD_MANAGER,
            },
        },
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": encoded(material.cert),
            "tls.key": encoded(material.key),
            "ca.crt": encoded(material.ca_cert),
        },
    }


def _ca_certificates(pem: bytes) -> list[x509.Certificate]:
    """The CA certificates in ``pem`` (others skipped); ValueError when it is not PEM at all."""
    if not pem.strip():
        return []
    result = []
    for certificate in x509.load_pem_x509_certificates(pem):
        try:
            is_ca = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if is_ca:
            result.append(certificate)
    return result


def ca_bundle(new_ca: bytes, *, previous: bytes | None = None, now: datetime.datetime | None = None) -> bytes:
    """``new_ca`` followed by the still-valid CAs of ``previous`` (the CA of the certificate being served now).

    An unreadable ``previous`` is left out rather than blocking a fresh install over a damaged Secret.
    """
    moment = now or datetime.datetime.now(datetime.UTC)
    try:
        bundle = _ca_certificates(new_ca)
    except ValueError as error:
        raise CertsError(f"cannot read the new CA certificate: {error}") from error
    if not bundle:
        raise CertsError("the new CA certificate is not a CA (no basicConstraints ca=true)")
    try:
        kept = _ca_certificates(previous or b"")
    except ValueError:
        kept = []
    for certificate in kept:
        if certificate.not_valid_after_utc <= moment or certificate in bundle:
            continue
        bundle.append(certificate)
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in bundle)


ROUTER_WEBHOOK = "hoss-router"
"""The router's MutatingWebhookConfiguration (deploy/router.yaml), whose caBundle `install` patches too."""


def ca_bundle_patch(configuration: Json, bundle: bytes) -> list[Json]:
    """A JSON patch setting ``bundle`` as every webhook's caBundle, each guarded by a test of the webhook's name.

    The test makes the patch fail rather than write a bundle into the wrong webhook if the list changed since it
    was read.
    """
    webhooks = configuration.get("webhooks") or []
    name = configuration.get("metadata", {}).get("name", "?")
    if not webhooks:
        raise CertsError(f"webhook configuration {name} has no webhooks to give a caBundle")
    value = base64.b64encode(bundle).decode()
    patch: list[Json] = []
    for index, webhook in enumerate(webhooks):
        patch.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook["name"]})
        patch.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": value})
    return patch


def write_files(directory: Path, *, secret: Json) -> list[Path]:
    """Next to the PEM files that issue_serving wrote, the Secret as ``secret.yaml`` (it holds the private key)."""
    path = directory / "secret.yaml"
    try:
        pki.write_private(path, yaml.safe_dump(secret, sort_keys=False).encode())
    except OSError as error:
        raise CertsError(f"cannot write {path}: {error}") from error
    return [directory / "ca.crt", directory / "ca.key", directory / "tls.crt", directory / "tls.key", path]


# --- the API shell ---------------------------------------------------------------------------------------------


def _explain(status: int | None, reason: str | None, body: str | bytes | None) -> str:
    """The apiserver's own message (it names the object and the rule), else the HTTP status."""
    try:
        message = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        message = None
    head = f"{status} {reason}" if reason else str(status)
    return f"{head}: {message}" if message else head


def _reason(error: ApiException) -> str:
    return _explain(error.status, error.reason, error.body)


@dataclass(frozen=True)
class Installed:
    """What ``install`` changed: the Secret, the webhook configuration and how many CAs its caBundle now holds."""

    secret: str
    webhook: str
    bundled_cas: int


def kubeconfig_location(explicit: str | None) -> str | None:
    """``explicit``, else $KUBECONFIG (a list of files, as kubectl reads it), else ~/.kube/config; it must exist.

    None inside a pod that names none of them (the Helm chart's certificate Job): the pod's service account.
    """
    if not explicit and not os.environ.get("KUBECONFIG") and os.environ.get("KUBERNETES_SERVICE_HOST"):
        default = Path.home() / ".kube" / "config"
        if not default.is_file():
            return None
    where = explicit or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not any(Path(part).expanduser().is_file() for part in where.split(os.pathsep) if part):
        raise CertsError(f"kubeconfig {where} not found: pass --kubeconfig, or set KUBECONFIG")
    return where


async def connect(
    kubeconfig: str | None, *, context: str | None = None, token_file: str = SERVICE_TOKEN_FILENAME,
    ca_file: str = SERVICE_CERT_FILENAME,
) -> client.ApiClient:
    """A client from the kubeconfig file(s) ``kubeconfig``, or from the pod's service account when None
    (KUBERNETES_SERVICE_HOST and _PORT, the mounted token and CA)."""
    if kubeconfig is None:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration, token_filename=token_file, cert_filename=ca_file
            )
        except ConfigException as error:
            raise CertsError(f"cannot use the pod's service account: {error}") from error
        return client.ApiClient(configuration)
    try:
        # persist_config=False: never write refreshed credentials back into the operator's kubeconfig.
        return await config.new_client_from_config(config_file=kubeconfig, context=context, persist_config=False)
    except (ConfigException, OSError, TypeError, ValueError) as error:
        raise CertsError(f"cannot load kubeconfig {kubeconfig}: {error}") from error


async def install(
    api: client.ApiClient, *, material: Material, namespace: str, secret: str, webhook: str,
    router: str = ROUTER_WEBHOOK,
) -> Installed:
    """Patch the webhook configuration's caBundle, then apply the Secret (see the module docstring for why).

    The Secret is first applied as a server-side dry run, so that a missing namespace or a missing permission
    stops the command before anything has changed.
    """
    core: Any = client.CoreV1Api(api)
    admission: Any = client.AdmissionregistrationV1Api(api)
    secret_key = f"{namespace}/{secret}"
    configuration_kind = f"ValidatingWebhookConfiguration {webhook}"
    manifest = tls_secret(name=secret, namespace=namespace, material=material)

    async def apply_secret(*, dry_run: bool) -> None:
        await core.patch_namespaced_secret(
            secret,
            namespace,
            manifest,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
            **({"dry_run": "All"} if dry_run else {}),
        )

    def secret_error(error: ApiException) -> str:
        hint = f" (does namespace {namespace} exist? apply the hoss base first)" if error.status == 404 else ""
        return f"cannot write Secret {secret_key}{hint}: {_reason(error)}"

    try:
        configuration = await _read(configuration_kind, admission.read_validating_webhook_configuration, webhook)
        if configuration is None:
            raise CertsError(
                f"{configuration_kind} not found: apply the hoss base first (kubectl apply -k deploy/),"
                " or name another configuration with --webhook"
            )
        current = await _read(f"Secret {secret_key}", core.read_namespaced_secret, secret, namespace)
        served_ca = (current or {}).get("data", {}).get("ca.crt")
        bundle = ca_bundle(material.ca_cert, previous=base64.b64decode(served_ca) if served_ca else None)
        try:
            await apply_secret(dry_run=True)
        except ApiException as error:
            raise CertsError(f"{secret_error(error)}; nothing was changed") from error
        try:
            await admission.patch_validating_webhook_configuration(webhook, ca_bundle_patch(configuration, bundle))
        except ApiException as error:
            raise CertsError(f"cannot patch the caBundle of {configuration_kind}: {_reason(error)}") from error
        # The router (deploy/router.yaml) is served by the same resolver: its caBundle follows, when installed
        # (``router`` empty: a resolver that serves no router, and any router is left alone).
        router_kind = f"MutatingWebhookConfiguration {router}"
        routing = await _read(router_kind, admission.read_mutating_webhook_configuration, router) if router else None
        if routing is not None:
            try:
                await admission.patch_mutating_webhook_configuration(router, ca_bundle_patch(routing, bundle))
            except ApiException as error:
                raise CertsError(f"cannot patch the caBundle of {router_kind}: {_reason(error)}") from error
        try:
            await apply_secret(dry_run=False)
        except ApiException as error:
            kept = " beside the one served now" if served_ca else ""
            raise CertsError(
                f"{secret_error(error)}; the caBundle of {webhook} already trusts the new CA{kept}, so running"
                " hoss certs again is safe"
            ) from error
    except (aiohttp.ClientError, OSError) as error:
        raise CertsError(f"cannot reach the apiserver at {api.configuration.host}: {error}") from error
    return Installed(secret=secret_key, webhook=webhook, bundled_cas=len(_ca_certificates(bundle)))


async def _read(what: str, call: Any, *args: str) -> Json | None:
    """One object as the raw JSON the apiserver sent; None when it does not exist."""
    try:
        # Without preloading, the client raises only on transport errors: the status is ours to check.
        response = await call(*args, _preload_content=False)
        text = (await response.read()).decode(errors="replace")
    except ApiException as error:
        raise CertsError(f"cannot read {what}: {_reason(error)}") from error
    if response.status == 404:
        return None
    if not 200 <= response.status < 300:
        raise CertsError(f"cannot read {what}: {_explain(response.status, response.reason, text)}")
    body: Json = json.loads(text)
    return body


# --- what the command runs -------------------------------------------------------------------------------------


def summary(certificate_pem: bytes) -> str:
    """The names a certificate is good for and when it expires, for the operator's eyes."""
    certificate = x509.load_pem_x509_certificate(certificate_pem)
    try:
        alt_names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = "no subject alternative names"
    else:
        listed = [f"DNS:{n}" for n in alt_names.get_values_for_type(x509.DNSName)]
        listed += [f"IP:{ip}" for ip in alt_names.get_values_for_type(x509.IPAddress)]
        names = ", ".join(listed)
    return f"{names}; valid until {certificate.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"


def make_files(directory: Path, *, names: ServingNames, namespace: str, secret: str) -> tuple[Material, list[Path]]:
    """``--output``: CA, serving certificate and key as PEM files, and the Secret manifest, in ``directory``."""
    material = issue_serving(directory, names)
    return material, write_files(directory, secret=tls_secret(name=secret, namespace=namespace, material=material))


async def make_and_install(
    *,
    kubeconfig: str | None,
    context: str | None,
    names: ServingNames,
    namespace: str,
    secret: str,
    webhook: str,
    router: str = ROUTER_WEBHOOK,
) -> tuple[Material, Installed]:
    """A fresh CA and serving certificate, installed through the API; the CA's key never leaves a scratch dir."""
    api = await connect(kubeconfig, context=context)
    try:
        with tempfile.TemporaryDirectory(prefix="hoss-certs-") as scratch:
            material = issue_serving(Path(scratch), names)
        installed = await install(api, material=material, namespace=namespace, secret=secret, webhook=webhook,
                                  router=router)
    finally:
        await api.close()
    return material, installed


def run(
    *,
    output: Path | None,
    kubeconfig: str | None,
    context: str | None,
    service: str,
    namespace: str,
    cluster_domain: str,
    extra_names: Sequence[str],
    secret: str,
    webhook: str,
    router: str = ROUTER_WEBHOOK,
) -> list[str]:
    """``hoss certs``: files in ``output``, or the Secret and caBundle through the API. Returns lines to print."""
    names = serving_names(service=service, namespace=namespace, cluster_domain=cluster_domain, extra=extra_names)
    if output is not None:
        material, files = make_files(output, names=names, namespace=namespace, secret=secret)
        return [
            f"serving certificate: {summary(material.cert)}",
            *(f"wrote {path}" for path in files),
            f"caBundle (base64 of {output / 'ca.crt'}): {base64.b64encode(material.ca_cert).decode()}",
        ]
    location = kubeconfig_location(kubeconfig)
    material, installed = asyncio.run(
        make_and_install(
            kubeconfig=location, context=context, names=names, namespace=namespace, secret=secret, webhook=webhook,
            router=router,
        )
    )
    kept = " (the new CA and the one served until now)" if installed.bundled_cas > 1 else ""
    return [
        f"serving certificate: {summary(material.cert)}",
        f"patched the caBundle of ValidatingWebhookConfiguration {installed.webhook}:"
        f" {installed.bundled_cas} CA certificate(s){kept}",
        f"wrote Secret {installed.secret}; the resolver picks it up when the kubelet refreshes the mounted Secret"
        " (within about a minute)",
    ]
