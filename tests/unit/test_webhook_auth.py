"""Only the apiserver may post reviews: the webhook over real HTTPS, in process, with and without client certificates.

The ledger is on fakeredis; what is checked here is who may ask, not the verdicts (tests/unit/test_webhook.py).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import fakeredis
import pytest
from cryptography import x509

from deploy import pki
from hoss.ledger.client import Ledger
from hoss.settings import SettingsError, load_settings
from resolver.app import build_server
from resolver.main import main
from resolver.settings import ResolverSettings
from resolver.state import WebhookState
from resolver.tls import reload_certificates, tls_context
from tests.unit.webhooks import NODE_ROOM, review


@dataclass
class Served:
    port: int
    server_ca: pki.KeyPair
    client_ca: pki.KeyPair
    directory: Path
    state: WebhookState

    def client(self, name: str | None, *, ca: pki.KeyPair | None = None) -> ssl.SSLContext:
        """A client context trusting the server, presenting a certificate named ``name`` from ``ca`` (default: the
        webhook's client CA), or none."""
        context = ssl.create_default_context(cafile=str(self.server_ca.cert))
        if name is not None:
            pair = pki.issue(ca or self.client_ca, directory=self.directory, name=f"client-{name}", common_name=name,
                             reuse=False)
            context.load_cert_chain(pair.cert, pair.key)
        return context

    async def post(self, context: ssl.SSLContext, body: Any, path: str = "/validate-binding") -> tuple[int, Any]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
            method = session.post if path == "/validate-binding" else session.get
            async with method(f"https://127.0.0.1:{self.port}{path}", data=json.dumps(body)) as response:
                text = await response.text()
                return response.status, json.loads(text) if text.startswith("{") else text


async def serve(tmp_path: Path, **settings: Any) -> AsyncIterator[Served]:
    server_ca = pki.ensure_ca(tmp_path / "server-ca")
    serving = pki.issue(server_ca, directory=tmp_path, name="serving", common_name="hoss-resolver",
                        ip_addresses=("127.0.0.1",), server=True)
    client_ca = pki.ensure_ca(tmp_path / "client-ca", common_name="webhook-client-ca")
    config = ResolverSettings(
        tls_cert_file=str(serving.cert), tls_key_file=str(serving.key), client_ca_file=str(client_ca.cert), **settings
    )
    redis = fakeredis.FakeAsyncRedis(decode_responses=True)
    ledger = Ledger(redis)
    await ledger.rebuild(nodes=[("n1", NODE_ROOM, {})], bound=[])
    state = WebhookState(settings=config, ledger=ledger)
    server = build_server(state)
    context = tls_context(config.tls_cert_file, config.tls_key_file, config.client_ca_file)
    port = await server.start("127.0.0.1", 0, ssl_context=context)
    try:
        yield Served(port, server_ca, client_ca, tmp_path, state)
    finally:
        await server.close()
        await redis.aclose()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async for one in serve(tmp_path, client_names=["kube-apiserver"]):
        yield one


BINDING = review(pod_name="small", uid="u-small", node="nowhere")


async def test_a_review_without_a_client_certificate_is_refused_with_401_and_not_judged(served: Served) -> None:
    status, body = await served.post(served.client(None), BINDING)
    assert status == 401
    assert "client certificate" in body["error"]
    assert not served.state.verdict_counts, "a refused review is never judged"


async def test_a_certificate_from_the_client_ca_with_another_name_gets_403(served: Served) -> None:
    status, body = await served.post(served.client("hoss-worker"), BINDING)
    assert status == 403
    assert "hoss-worker" in body["error"]
    assert not served.state.verdict_counts


async def test_a_certificate_from_another_ca_fails_the_handshake(served: Served, tmp_path: Path) -> None:
    stranger = pki.ensure_ca(tmp_path / "stranger-ca", common_name="webhook-client-ca")  # same name, other key
    with pytest.raises(aiohttp.ClientError):
        await served.post(served.client("kube-apiserver", ca=stranger), BINDING)
    assert not served.state.verdict_counts


async def test_the_apiserver_certificate_is_judged_and_probes_need_no_certificate(served: Served) -> None:
    status, body = await served.post(served.client("kube-apiserver"), BINDING)
    assert status == 200
    assert body["response"]["allowed"] is False  # judged: the pod is not known to this resolver
    assert served.state.verdict_counts["unknown-pod"] == 1
    for path in ("/healthz", "/readyz"):
        status, _ = await served.post(served.client(None), None, path=path)
        assert status == 200, path


async def test_without_client_names_any_certificate_of_the_client_ca_may_post(tmp_path: Path) -> None:
    async for one in serve(tmp_path):
        status, _ = await one.post(one.client("anyone"), BINDING)
        assert status == 200
        status, _ = await one.post(one.client(None), BINDING)
        assert status == 401


async def test_many_reviews_on_one_connection_are_checked_once_and_all_answered(served: Served) -> None:
    context = served.client("kube-apiserver")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=1)) as session:
        for _ in range(20):
            async with session.post(f"https://127.0.0.1:{served.port}/validate-binding",
                                    data=json.dumps(BINDING)) as response:
                assert response.status == 200
    assert served.state.server is not None
    assert served.state.server.accepted == 1, "one kept-alive connection"
    assert served.state.verdict_counts["unknown-pod"] == 20


def test_client_names_without_a_client_ca_stop_start_up() -> None:
    with pytest.raises(SettingsError, match="client_names needs client_ca_file"):
        load_settings(ResolverSettings, ["--tls-cert-file=c", "--tls-key-file=k", "--client-names=kube-apiserver"],
                      prog="hoss-resolver", description="")


def test_a_missing_client_ca_file_stops_start_up_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = pki.ensure_ca(tmp_path)
    serving = pki.issue(ca, directory=tmp_path, name="s", common_name="s", server=True)
    missing = tmp_path / "nope" / "ca.crt"
    code = main([f"--tls-cert-file={serving.cert}", f"--tls-key-file={serving.key}", f"--client-ca-file={missing}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"client_ca_file (--client-ca-file, HOSS_CLIENT_CA_FILE): {missing}: No such file" in err


async def test_a_client_ca_added_to_the_file_is_trusted_after_reload(tmp_path: Path) -> None:
    first = pki.ensure_ca(tmp_path / "first-ca", common_name="first")
    second = pki.ensure_ca(tmp_path / "second-ca", common_name="second")
    serving = pki.issue(first, directory=tmp_path, name="serving", common_name="s", server=True)
    ca_file = tmp_path / "client-ca.crt"
    ca_file.write_bytes(first.cert.read_bytes())
    context = tls_context(str(serving.cert), str(serving.key), str(ca_file))
    assert context.cert_store_stats()["x509_ca"] == 1
    reloading = asyncio.create_task(
        reload_certificates(context, str(serving.cert), str(serving.key), interval=0.05, client_ca_file=str(ca_file))
    )
    try:
        await asyncio.sleep(0.1)
        await asyncio.to_thread(ca_file.write_bytes, first.cert.read_bytes() + second.cert.read_bytes())
        for _ in range(100):
            if context.cert_store_stats()["x509_ca"] == 2:
                break
            await asyncio.sleep(0.05)
        assert context.cert_store_stats()["x509_ca"] == 2
    finally:
        reloading.cancel()


def not_after(path: Path) -> float:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()


async def test_metrics_tell_when_the_serving_certificate_expires_and_follow_a_renewal(served: Served) -> None:
    expected = not_after(Path(served.state.settings.tls_cert_file))
    status, text = await served.post(served.client(None), None, path="/metrics")
    assert status == 200
    line = next(x for x in text.splitlines()
                if x.startswith("hoss_resolver_serving_certificate_expiry_timestamp_seconds "))
    assert float(line.split()[1]) == pytest.approx(expected)
    # A renewed certificate (longer validity) shows at the next scrape.
    renewed = pki.issue(pki.ensure_ca(served.directory / "server-ca"), directory=served.directory, name="serving",
                        common_name="hoss-resolver", ip_addresses=("127.0.0.1",), server=True, reuse=False,
                        validity=datetime.timedelta(days=700))
    later = not_after(renewed.cert)
    os.utime(renewed.cert, (time.time() + 5, time.time() + 5))  # a changed mtime even within the clock's tick
    _status, text = await served.post(served.client(None), None, path="/metrics")
    line = next(x for x in text.splitlines()
                if x.startswith("hoss_resolver_serving_certificate_expiry_timestamp_seconds "))
    assert float(line.split()[1]) == pytest.approx(later) and later > expected
