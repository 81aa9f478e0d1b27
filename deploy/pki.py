"""A small certificate authority for the local control plane and for webhook serving certificates.

One CA signs the apiserver's serving certificate, one client certificate per identity (so the apiserver, and the
resolver webhook, see who made each request) and the resolver's serving certificate. Keys are ECDSA P-256.

Private keys are never readable by anyone but their owner, not even for an instant: each is written to a new file
created with mode 0600 and renamed over the old one (so a process reloading it never reads half a key). A
certificate found on disk is reused only while it is valid for longer than ``RENEW_BEFORE`` (a third of its
validity) and was signed by the CA asked for; otherwise it is issued again, so a plane started again renews what
is about to expire, and a renewed CA renews everything it signed.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = _VALIDITY / 3
"""A certificate with less validity left than this is issued again (a CA: ten times as much)."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte: a new file made by mkstemp (0600), then
    renamed over ``path``, so no reader ever sees a wider mode or a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    write_private(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def still_good(
    cert_path: Path, *, issuer: x509.Certificate | None = None, renew_before: datetime.timedelta = RENEW_BEFORE,
    now: datetime.datetime | None = None,
) -> bool:
    """True when the certificate at ``cert_path`` is readable, valid for longer than ``renew_before`` and (when
    ``issuer`` is given) signed by ``issuer``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return False
    moment = now or datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc - moment <= renew_before:
        return False
    if issuer is not None:
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature):
            return False
    return True


def _alt_names(cert_path: Path) -> tuple[set[str], set[object]]:
    """The DNS names and IP addresses a certificate names (empty sets when it names none)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    return set(names.get_values_for_type(x509.DNSName)), set[object](names.get_values_for_type(x509.IPAddress))


def _load(pair: KeyPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pair.key} is not an EC private key")
    return cert, key


def ensure_ca(directory: Path, *, common_name: str = "hoss-local-ca") -> KeyPair:
    """Create a self-signed CA in ``directory`` unless one is already there."""
    pair = KeyPair(directory / "ca.crt", directory / "ca.key")
    if pair.key.exists() and still_good(pair.cert, renew_before=RENEW_BEFORE * 10):
        return pair
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY * 10)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key, pair.key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


def issue(
    ca: KeyPair,
    *,
    directory: Path,
    name: str,
    common_name: str,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    reuse: bool = True,
    validity: datetime.timedelta = _VALIDITY,
) -> KeyPair:
    """Issue a certificate signed by ``ca``: a client certificate, or a serving one when ``server``.

    Reuses an existing ``<name>.crt``/``<name>.key`` in ``directory`` while it is good (see `still_good`: signed
    by ``ca``, not about to expire) and names the same hosts, unless ``reuse`` is false, in which case a new key and
    certificate replace them.
    """
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    ca_cert, ca_key = _load(ca)
    if reuse and pair.key.exists() and still_good(pair.cert, issuer=ca_cert) \
            and _alt_names(pair.cert) == (set(dns_names), set[object](ipaddress.ip_address(ip) for ip in ip_addresses)):
        return pair
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    directory.mkdir(parents=True, exist_ok=True)
    _write_key(key, pair.key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pair


def ensure_signing_key(path: Path) -> tuple[Path, Path]:
    """An EC key pair for signing service-account tokens (the apiserver requires one): (private, public)."""
    public = path.with_suffix(".pub")
    if not path.exists() or not public.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key, path)
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return path, public
