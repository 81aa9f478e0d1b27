"""The webhook's TLS: the serving context, its reload when the files change, and what a client's certificate says.

Only the apiserver may post reviews (``--client-ca-file``): the handshake asks every client for a certificate and
verifies one that is presented against that CA alone (a bad one ends the handshake). The certificate is asked for,
not required, so that the kubelet's probes (which present none) reach /healthz and /readyz on the same port; the
review paths then refuse a connection without one (`resolver.app`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import ssl

from cryptography import x509

log = logging.getLogger(__name__)

_EXPIRY_CACHE: dict[str, tuple[float, float]] = {}


def tls_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """The serving context; with ``client_ca_file`` it asks clients for a certificate and verifies it against that
    CA alone (never the system's trust store: a public CA must not vouch for a reviewer)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.load_verify_locations(cafile=client_ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
    # No session tickets: the apiserver's webhook client keeps no session cache, so each new connection is a full
    # handshake anyway, and issuing tickets nobody presents costs every handshake.
    context.options |= ssl.OP_NO_TICKET
    return context


async def reload_certificates(
    context: ssl.SSLContext, cert_file: str, key_file: str, interval: float = 5.0, *, client_ca_file: str | None = None
) -> None:
    """Load the serving certificate again whenever its files change (new handshakes use the new one), and the
    client CA file when it changes (its CAs are added to those trusted: a context cannot forget a CA, so a CA
    removed from the file stays trusted until the resolver restarts)."""

    def stamp(*paths: str) -> tuple[float, ...]:
        return tuple(os.stat(path).st_mtime for path in paths)

    seen = stamp(cert_file, key_file)
    seen_ca = stamp(client_ca_file) if client_ca_file is not None else ()
    while True:
        await asyncio.sleep(interval)
        try:
            current = stamp(cert_file, key_file)
            if current != seen:
                context.load_cert_chain(cert_file, key_file)
                seen = current
                log.info("reloaded serving certificate from %s", cert_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("cannot reload serving certificate (keeping the old one): %s", error)
        if client_ca_file is None:
            continue
        try:
            current = stamp(client_ca_file)
            if current != seen_ca:
                context.load_verify_locations(cafile=client_ca_file)
                seen_ca = current
                log.info("reloaded the webhook's client CA from %s", client_ca_file)
        except (OSError, ssl.SSLError) as error:
            log.warning("cannot reload the client CA (keeping the old one): %s", error)


def certificate_expiry(cert_file: str) -> float:
    """The notAfter of the PEM certificate in ``cert_file`` as Unix time (re-read only when the file changes); NaN
    when it cannot be read."""
    try:
        stamp = os.stat(cert_file).st_mtime
        cached = _EXPIRY_CACHE.get(cert_file)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        with open(cert_file, "rb") as pem:
            expiry = x509.load_pem_x509_certificate(pem.read()).not_valid_after_utc.timestamp()
    except (OSError, ValueError):
        return math.nan
    _EXPIRY_CACHE[cert_file] = (stamp, expiry)
    return expiry


def client_names(peercert: object) -> tuple[str, ...] | None:
    """The names in a client certificate as the TLS layer reports a verified one (``getpeercert()``): subject
    common name first, then DNS subject alternative names; None when there is none (no certificate presented)."""
    if not isinstance(peercert, dict) or not peercert:
        return None
    names = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    names += [value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS"]
    return tuple(names)
