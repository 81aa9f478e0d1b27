"""deploy/pki: private keys are 0600 from the first byte, and certificates are renewed before they expire."""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from deploy import pki


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: files get exactly the mode they are created with."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_private_keys_are_owner_only_even_under_a_permissive_umask(tmp_path: Path, open_umask: None) -> None:
    ca = pki.ensure_ca(tmp_path)
    pair = pki.issue(ca, directory=tmp_path, name="client", common_name="someone")
    signing, _public = pki.ensure_signing_key(tmp_path / "sa.key")
    for key in (ca.key, pair.key, signing):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    # A key file left readable by others is replaced by a new 0600 file, never rewritten in place.
    pair.key.chmod(0o644)
    before = pair.key.stat().st_ino
    pki.write_private(pair.key, b"secret")
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
    assert pair.key.stat().st_ino != before
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left behind"


def test_a_certificate_is_reused_while_good_and_issued_again_before_it_expires(tmp_path: Path) -> None:
    ca = pki.ensure_ca(tmp_path)
    good = pki.issue(ca, directory=tmp_path, name="long", common_name="long")
    first = serial(good.cert)
    assert serial(pki.issue(ca, directory=tmp_path, name="long", common_name="long").cert) == first

    short = pki.issue(ca, directory=tmp_path, name="short", common_name="short", validity=datetime.timedelta(days=10))
    expiring = serial(short.cert)
    renewed = pki.issue(ca, directory=tmp_path, name="short", common_name="short")
    assert serial(renewed.cert) != expiring
    left = x509.load_pem_x509_certificate(renewed.cert.read_bytes()).not_valid_after_utc - datetime.datetime.now(
        datetime.UTC
    )
    assert left > pki.RENEW_BEFORE


def test_a_certificate_signed_by_another_ca_is_issued_again(tmp_path: Path) -> None:
    old_ca = pki.ensure_ca(tmp_path / "old")
    new_ca = pki.ensure_ca(tmp_path / "new")
    pair = pki.issue(old_ca, directory=tmp_path, name="leaf", common_name="leaf")
    assert pki.still_good(pair.cert, issuer=x509.load_pem_x509_certificate(old_ca.cert.read_bytes()))
    new_issuer = x509.load_pem_x509_certificate(new_ca.cert.read_bytes())
    assert not pki.still_good(pair.cert, issuer=new_issuer)
    reissued = pki.issue(new_ca, directory=tmp_path, name="leaf", common_name="leaf")
    assert pki.still_good(reissued.cert, issuer=new_issuer)


def test_still_good_judges_the_time_left(tmp_path: Path) -> None:
    ca = pki.ensure_ca(tmp_path)
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650) - pki.RENEW_BEFORE * 10
    assert pki.still_good(ca.cert, renew_before=pki.RENEW_BEFORE * 10)
    assert not pki.still_good(ca.cert, renew_before=pki.RENEW_BEFORE * 10, now=later + datetime.timedelta(days=1))
    assert not pki.still_good(tmp_path / "missing.crt")
