"""KubeREST against a real in-process HTTPS server: mutual TLS from a kubeconfig or the service account, the exact
paths, methods, content types and orjson bodies of the hot-path calls, and apiserver errors as KubeError."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from deploy import pki
from hoss.kube import protobuf
from hoss.kube.client import KubeError
from hoss.kube.events import (
    pod_event,
    post_event,
    scheduled_event,
    set_unschedulable,
    unschedulable_condition,
)
from hoss.kube.rest import STRATEGIC_MERGE_PATCH, KubeREST, TokenFile
from tests.unit.protobuf_golden import golden
from tests.unit.tls_apiserver import Seen, TLSApiserver, status
from tests.waiting import until
from workers.core import EVENT_POSTS_IN_FLIGHT, apiserver_requests_in_flight
from workers.settings import WorkerSettings


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[TLSApiserver]:
    server = TLSApiserver(tmp_path)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def rest(apiserver: TLSApiserver) -> AsyncIterator[KubeREST]:
    async with await KubeREST.connect(str(apiserver.kubeconfig())) as client:
        yield client


async def test_binding_is_one_protobuf_post_with_the_pod_uid_over_mutual_tls_from_the_kubeconfig(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    answer = await rest.create_binding("team", "web-0", "uid-1", "n7", lane="2")

    [seen] = apiserver.seen
    assert (seen.method, seen.raw_path) == ("POST", "/api/v1/namespaces/team/pods/web-0/binding")
    assert seen.content_type == "application/vnd.kubernetes.protobuf", "as kube-scheduler sends it"
    assert seen.client_cn == "hoss-worker", "the kubeconfig's client certificate is presented"
    assert seen.authorization == "Bearer t0k3n"
    on_lane = golden("binding on a webhook lane")
    assert on_lane.object["metadata"] == {"name": "web-0", "namespace": "team", "uid": "uid-1",
                                          "labels": {"hoss.io/lane": "2"}}
    assert on_lane.object["target"]["name"] == "n7"
    assert seen.body == on_lane.protobuf, "the bytes Kubernetes' own serializer writes for this Binding"
    assert answer["status"] == "Success", "the answer is read as JSON"


async def test_calls_reuse_one_keep_alive_connection(apiserver: TLSApiserver, rest: KubeREST) -> None:
    for index in range(5):
        await rest.create_binding("team", f"web-{index}", f"uid-{index}", "n1")
    assert len({seen.peer for seen in apiserver.seen}) == 1


async def test_event_is_posted_into_its_namespace_as_kube_scheduler_words_it(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    event = scheduled_event(namespace="team", name="web-0", uid="uid-1", node="n7", component="hoss-worker-3")
    await rest.create_event(event)

    [seen] = apiserver.seen
    assert (seen.method, seen.raw_path, seen.content_type) == ("POST", "/api/v1/namespaces/team/events",
                                                               "application/vnd.kubernetes.protobuf")
    assert seen.body == protobuf.event(event), "every field of the event, in protobuf (test_protobuf_golden)"
    assert (event["type"], event["reason"], event["action"]) == ("Normal", "Scheduled", "Binding")
    assert event["message"] == "Successfully assigned team/web-0 to n7"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team", "name": "web-0",
                                       "uid": "uid-1"}
    assert event["source"] == {"component": "hoss-worker-3"}


async def test_pod_status_patch_is_a_strategic_merge_patch(apiserver: TLSApiserver, rest: KubeREST) -> None:
    patch = unschedulable_condition("0/3 nodes are available: 3 Insufficient cpu.")
    await rest.patch_pod_status("team", "web-0", patch)

    [seen] = apiserver.seen
    assert (seen.method, seen.raw_path) == ("PATCH", "/api/v1/namespaces/team/pods/web-0/status")
    assert seen.content_type == STRATEGIC_MERGE_PATCH == "application/strategic-merge-patch+json"
    assert orjson.loads(seen.body) == patch


async def test_path_segments_are_percent_encoded(apiserver: TLSApiserver, rest: KubeREST) -> None:
    pod = await rest.get_pod("team", "we/ird ?name")
    [seen] = apiserver.seen
    assert (seen.method, seen.raw_path) == ("GET", "/api/v1/namespaces/team/pods/we%2Fird%20%3Fname")
    assert seen.body == b""
    assert pod["kind"] == "Pod"


async def test_request_sends_params_and_passes_bytes_bodies_through(apiserver: TLSApiserver, rest: KubeREST) -> None:
    await rest.request("GET", "/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1,status.phase!=Failed"})
    await rest.request("POST", "/api/v1/namespaces/team/events", body=b'{"raw": true}')

    get, post = apiserver.seen
    assert get.query == {"fieldSelector": "spec.nodeName=n1,status.phase!=Failed"}
    assert post.body == b'{"raw": true}'


async def test_a_conflict_status_raises_kube_error_with_409_and_the_apiserver_message(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    async def conflict(seen: Seen) -> web.StreamResponse:
        return status(409, "hoss: node n1 has no room for team/big: cpu requested 3, free 2", "Conflict")

    apiserver.respond = conflict
    with pytest.raises(KubeError) as error:
        await rest.create_binding("team", "big", "uid-big", "n1")
    assert error.value.status == 409
    assert str(error.value) == "409: hoss: node n1 has no room for team/big: cpu requested 3, free 2"


async def test_an_error_without_a_status_body_carries_the_text(apiserver: TLSApiserver, rest: KubeREST) -> None:
    async def broken(seen: Seen) -> web.StreamResponse:
        return web.Response(status=503, text="upstream connect error")

    apiserver.respond = broken
    with pytest.raises(KubeError) as error:
        await rest.get_pod("team", "web-0")
    assert (error.value.status, str(error.value)) == (503, "503: upstream connect error")


async def test_a_response_that_never_comes_hits_the_deadline(apiserver: TLSApiserver, rest: KubeREST) -> None:
    never = asyncio.Event()

    async def hang(seen: Seen) -> web.StreamResponse:
        await never.wait()
        return web.Response()

    apiserver.respond = hang
    with pytest.raises(TimeoutError):
        await rest.get_pod("team", "web-0", timeout=0.2)
    never.set()


async def test_a_kubeconfig_naming_another_ca_fails_the_tls_handshake(apiserver: TLSApiserver, tmp_path: Path) -> None:
    other = pki.ensure_ca(tmp_path / "other-ca", common_name="someone-else")
    async with await KubeREST.connect(str(apiserver.kubeconfig(ca=other.cert))) as client:
        with pytest.raises(ssl.SSLCertVerificationError):
            await client.get_pod("team", "web-0")
    assert apiserver.seen == []


async def test_in_cluster_uses_the_service_account_and_picks_up_a_rotated_token(
    apiserver: TLSApiserver, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(apiserver.port)}
    async with KubeREST.in_cluster(token_file=str(token), ca_file=str(apiserver.ca.cert), environ=environ,
                                   token_reread_seconds=0) as client:
        await client.get_pod("team", "a")
        token.write_text("second")
        await client.get_pod("team", "b")
    assert [seen.authorization for seen in apiserver.seen] == ["Bearer first", "Bearer second"]
    assert apiserver.seen[0].client_cn is None


def test_token_file_is_read_again_only_after_the_interval_and_kept_when_unreadable(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "token"
    path.write_text("one")
    token = TokenFile(path, reread_seconds=60, clock=lambda: now[0])
    path.write_text("two")
    now[0] = 59.0
    assert token() == "Bearer one"
    now[0] = 60.0
    assert token() == "Bearer two"
    path.unlink()
    now[0] = 200.0
    assert token() == "Bearer two"


async def test_post_event_and_set_unschedulable_accept_a_kube_rest_and_never_raise(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    event = pod_event(namespace="team", name="web-0", uid="u", reason="FailedScheduling", message="m",
                      component="hoss")
    await post_event(rest, event)
    await set_unschedulable(rest, namespace="team", name="web-0", message="0/1 nodes are available")
    assert [(seen.method, seen.raw_path) for seen in apiserver.seen] == [
        ("POST", "/api/v1/namespaces/team/events"),
        ("PATCH", "/api/v1/namespaces/team/pods/web-0/status"),
    ]
    assert apiserver.seen[1].content_type == STRATEGIC_MERGE_PATCH

    async def refuse(seen: Seen) -> web.StreamResponse:
        return status(403, "forbidden")

    apiserver.respond = refuse
    await post_event(rest, event)
    await set_unschedulable(rest, namespace="team", name="web-0", message="m")
    assert len(apiserver.seen) == 4


async def test_an_event_with_a_field_protobuf_is_not_written_for_goes_as_json(
    apiserver: TLSApiserver, rest: KubeREST
) -> None:
    event = {**scheduled_event(namespace="team", name="web-0", uid="u", node="n7", component="c"),
             "series": {"count": 2}}
    with pytest.raises(protobuf.Unencodable, match="series"):
        protobuf.event(event)
    for bad in ({"count": -1}, {"count": True}, {"lastTimestamp": "yesterday"},
                {"firstTimestamp": "1960-01-01T00:00:00Z"}, {"kind": "Binding"},
                {"source": {"component": 3}}, {"involvedObject": "pod"}):
        with pytest.raises(protobuf.Unencodable):
            protobuf.event({**event, **bad})
    await rest.create_event(event)
    [seen] = apiserver.seen
    assert seen.content_type == "application/json" and orjson.loads(seen.body) == event


async def test_a_workers_client_carries_every_binding_its_setting_allows(apiserver: TLSApiserver) -> None:
    # The worker sizes its client from its settings (workers/main.py); a fixed pool of 100 once capped a lone
    # worker's bindings at 100 whatever --max-binds-in-flight said.
    settings = WorkerSettings(max_binds_in_flight=150)
    release = asyncio.Event()

    async def held(seen: Seen) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"kind": "Status", "status": "Success", "code": 201}, status=201)

    apiserver.respond = held
    async with await KubeREST.connect(str(apiserver.kubeconfig()),
                                      limit=apiserver_requests_in_flight(settings)) as rest:
        posts = [asyncio.ensure_future(rest.create_binding("default", f"p-{i}", f"u-{i}", "n"))
                 for i in range(150 + EVENT_POSTS_IN_FLIGHT)]
        # every binding and event at once, none waiting for a connection
        await until(lambda: apiserver.in_flight == len(posts), timeout=10, what=f"all {len(posts)} posts in flight")
        release.set()
        await asyncio.gather(*posts)
