"""The demo's report says only what happened: a worker that placed few pods is told why (its policies, or the
dispatcher's packing), the foreign-scheduler story shows a denial it really saw or says plainly that none happened,
and the denials are counted from the apiserver's own metric."""

from __future__ import annotations

from dev.demo.observe import webhook_rejections
from dev.demo.printing import device_lines, race_lines, story_lines, worker_lines
from dev.demo.report import DemoReport
from dev.demo.stories.devices import DeviceStory, Placement
from dev.demo.stories.race import RaceStory, denial_example, story_denials
from dev.demo.stories.throughput import WorkerView, worker_notes

ASKED = {"default": 560, "binpack": 440}


def _worker(worker_id: str, *policies: str, alive: bool = True, routed: bool | None = True) -> WorkerView:
    return WorkerView(id=worker_id, policies=list(policies), alive=alive, routed=routed, bound=0)


def _race(**changes: object) -> RaceStory:
    fields: dict[str, object] = {"nodes": 4, "cpu_capacity": 16, "hoss_pods": 16, "kube_pods": 16, "rounds": 1,
                                 "hoss_bound": 9, "kube_bound": 7, "denials": 0}
    fields.update(changes)
    return RaceStory(**fields)  # type: ignore[arg-type]


def test_a_worker_kept_idle_by_packing_is_told_the_dispatcher_keeps_the_load_on_the_busy_worker() -> None:
    workers = [_worker("w1", "default"), _worker("w2", "default", "binpack", "gpu"), _worker("w3", "binpack", "gpu")]
    notes = worker_notes({"w1": 0, "w2": 936, "w3": 2}, workers, asked=ASKED, pack_depth=256)

    assert set(notes) == {"w1", "w3"}
    assert "as w2 does (which placed 936)" in notes["w1"]
    assert "keeps a load that one worker keeps up with on that worker" in notes["w1"]
    assert "about 256 pods wait" in notes["w1"] and "--pack-depth" in notes["w1"]
    assert "it serves binpack as w2 does" in notes["w3"]


def test_a_worker_whose_policies_no_pod_asks_for_is_told_so() -> None:
    workers = [_worker("w1", "default", "binpack"), _worker("w2", "gpu")]
    notes = worker_notes({"w1": 1000, "w2": 0}, workers, asked=ASKED, pack_depth=256)

    assert notes == {"w2": "it serves gpu, and none of the story's pods asks for that policy "
                           "(they ask for default 560, binpack 440)"}


def test_an_unrouted_or_dead_worker_is_told_so_and_a_fair_share_is_not_explained() -> None:
    workers = [_worker("w1", "default"), _worker("w2", "default", routed=False), _worker("w3", "default", alive=False),
               _worker("w4", "default")]
    notes = worker_notes({"w1": 500, "w2": 0, "w3": 0, "w4": 500}, workers, asked={"default": 1000}, pack_depth=256)

    assert set(notes) == {"w2", "w3"}
    assert "does not route to it" in notes["w2"]
    assert "heartbeat is gone" in notes["w3"]


def test_the_per_worker_line_carries_each_explanation() -> None:
    report = DemoReport(pods_total=1000, pods_bound=938, pods_pending=62, seconds=3.0, pods_per_second=312.7,
                        ledger_conflicts=0, webhook_denials=0, oversold_nodes=0,
                        per_worker={"w1": 0, "w2": 936, "w3": 2}, nodes=100, workers=3, status_url="",
                        per_worker_why={"w1": "why one", "w3": "why three"}, pods_by_policy=ASKED)

    lines = worker_lines(report)

    assert lines[0] == ("pods per worker", "w1 0, w2 936, w3 2 (throughput story; its pods by policy: default 560, "
                                           "binpack 440)")
    assert lines[1:] == [("", "w1 placed 0: why one"), ("", "w3 placed 2: why three")]


def test_no_denial_is_said_plainly_and_no_example_is_shown() -> None:
    lines = race_lines(_race(rounds=3, hoss_bound=0, kube_bound=16))

    assert len(lines) == 1
    assert "no binding was denied in 3 rounds" in lines[0]
    assert "for example" not in lines[0]


def test_denials_are_counted_and_shown_with_the_example_the_resolver_recorded() -> None:
    records = [
        {"at": 5.0, "pod": "hoss-demo-race/hoss-r2-001", "node": "demo-race-0000",
         "username": "system:serviceaccount:hoss-system:hoss-worker", "message": "hoss: no room (hoss)"},
        {"at": 4.0, "pod": "hoss-demo-race/kube-r2-003", "node": "demo-race-0001", "username": "system:kube-scheduler",
         "message": "hoss: node demo-race-0001 has no room for hoss-demo-race/kube-r2-003: cpu requested 1, free 0"},
        {"at": 1.0, "pod": "hoss-demo-race/kube-r1-000", "node": "demo-race-0001", "username": "system:kube-scheduler",
         "message": "before the story"},
        {"at": 6.0, "pod": "hoss-demo-gpu/x", "node": "demo-gpu-spread-0001", "username": "system:kube-scheduler",
         "message": "another story"},
    ]
    mine = story_denials(records, since=2.0)
    example = denial_example(mine)
    lines = race_lines(_race(rounds=2, denials=2, denied_by={"kube-scheduler": 1, "hoss": 1}, denial_example=example))

    assert [r["pod"] for r in mine] == ["hoss-demo-race/hoss-r2-001", "hoss-demo-race/kube-r2-003"]
    assert example == ("kube-scheduler's binding of hoss-demo-race/kube-r2-003 to demo-race-0001 was denied: "
                       "hoss: node demo-race-0001 has no room for hoss-demo-race/kube-r2-003: cpu requested 1, free 0")
    assert "(round 2; the first round had no conflicting binding)" in lines[0]
    assert "the webhook denied 2 bindings (counted by the apiserver), hoss's 1 and kube-scheduler's 1;" in lines[0]
    assert lines[1] == f"for example, {example}"


def test_denials_all_of_one_scheduler_are_said_so() -> None:
    lines = race_lines(_race(denials=3, denied_by={"kube-scheduler": 3}, denial_example="an example"))

    assert "the webhook denied 3 bindings (counted by the apiserver), all kube-scheduler's; 0 oversold" in lines[0]


def test_the_report_lines_put_the_example_under_the_foreign_scheduler_line() -> None:
    report = DemoReport(pods_total=10, pods_bound=10, pods_pending=0, seconds=1.0, pods_per_second=10.0,
                        ledger_conflicts=0, webhook_denials=1, oversold_nodes=0, per_worker={}, nodes=1, workers=1,
                        status_url="", race=_race(denials=1, denial_example="kube-scheduler's binding of p to n was "
                                                                            "denied: hoss: no room"))
    labels = [label for label, _text in story_lines(report)]

    assert labels == ["throughput", "foreign scheduler", "", "oversold nodes"]
    assert "none wait" in story_lines(report)[0][1]


def test_the_devices_story_says_what_each_pod_asked_and_got_and_counts_devices_in_two_claims() -> None:
    story = DeviceStory(nodes=2, gpus_per_node=8, pods=2, bound=2, devices_in_two_claims=0, placements={
        "dra-nvlink": Placement(asked="2 GPUs of one NVLink domain (matchAttribute)", node="n1",
                                devices=["gpu-4", "gpu-5"], nvlink_domains=[1, 1], models=["h100", "h100"]),
        "dra-pair": Placement(asked="2 GPUs", node="n1", devices=["gpu-3", "gpu-4"], nvlink_domains=[0, 1],
                              models=["h100", "h100"]),
    })
    first, nvlink, pair = device_lines(story)

    assert first == ("2/2 pods asking fake GPUs bound on 2 nodes of 8 fake GPUs (gpu.dra.hoss.dev); 0 devices in "
                     "two claims")
    assert nvlink == ("dra-nvlink asked 2 GPUs of one NVLink domain (matchAttribute): got gpu-4, gpu-5 on n1 (h100, "
                      "NVLink domain 1)")
    assert pair.endswith("got gpu-3, gpu-4 on n1 (h100, NVLink domains 0 and 1)")
    assert "1 device in two claims" in device_lines(DeviceStory(nodes=2, gpus_per_node=8, pods=0, bound=0,
                                                                devices_in_two_claims=1))[0]


def test_webhook_denials_are_the_apiserver_s_rejections_by_validating_webhooks_that_answered() -> None:
    metrics = "\n".join([
        "# HELP apiserver_admission_webhook_rejection_count [ALPHA] Admission webhook rejection count",
        "# TYPE apiserver_admission_webhook_rejection_count counter",
        'apiserver_admission_webhook_rejection_count{error_type="no_error",name="binding.resolver.hoss.io",'
        'operation="CREATE",rejection_code="409",type="validating"} 60',
        'apiserver_admission_webhook_rejection_count{error_type="no_error",name="binding-lane-1.resolver.hoss.io",'
        'operation="CREATE",rejection_code="409",type="validating"} 3',
        'apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",'
        'name="binding.resolver.hoss.io",operation="CREATE",rejection_code="500",type="validating"} 2',
        'apiserver_admission_webhook_rejection_count{error_type="no_error",name="hoss-router",operation="CREATE",'
        'rejection_code="400",type="admit"} 1',
        'apiserver_admission_webhook_request_total{code="409",name="binding.resolver.hoss.io",operation="CREATE",'
        'rejected="true",type="validating"} 60',
    ])

    assert webhook_rejections(metrics) == 63
