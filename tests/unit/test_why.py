"""`hoss why`'s answer (deploy/explanation.py) against the worker's own decision on the same table: the message it
would write, the node it would choose, the rescheduler's hold, quotas and gangs; the manifest and target parsing of
the shell (deploy/why.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from deploy.cli import main
from deploy.explanation import HOLD_FILTER, Facts, GangFacts, explain, quota_refusal, render_table, to_json
from deploy.why import WHAT_IF_UID, WhyError, read_manifest, target_of
from dispatcher.gangs import GangKey, GangState
from hoss.framework.cycle import Placement, Unschedulable, decide
from hoss.framework.nodes import NodeTable
from hoss.framework.pod import parse_pod
from hoss.framework.profiles import load_profiles
from hoss.ledger.arguments import ElasticQuota
from hoss.ledger.results import QuotaReport, QuotaUse
from tests.kube_objects import Json, raw_node, raw_pod, table

POLICIES = Path(__file__).resolve().parents[2] / "configs" / "policies.yaml"
PROFILES, DEFAULT = load_profiles(POLICIES)
SMALL = {"cpu": "4", "memory": "16Gi", "pods": "110"}
GANG_LABELS = {"pod-group.scheduling.sigs.k8s.io/name": "train", "pod-group.scheduling.sigs.k8s.io/min-available": "2"}


def nodes(*used_cpu: int) -> NodeTable:
    """One 4-cpu node per entry, n0, n1, ..., with that much cpu used (milli-CPU)."""
    built = table(*(raw_node(f"n{i}", SMALL) for i in range(len(used_cpu))))
    for i, used in enumerate(used_cpu):
        built.add_used(f"n{i}", {"cpu": used})
    return built


def test_a_pod_that_fits_nowhere_gets_the_message_the_worker_would_write() -> None:
    built = nodes(1000, 3000, 0)
    pod = raw_pod("big", {"cpu": "5", "memory": "1Gi"})
    report = explain(pod, profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=built))
    decision = decide(PROFILES[DEFAULT], parse_pod(pod), built, rng=np.random.default_rng(0))
    assert isinstance(decision, Unschedulable)
    assert report.message == decision.message == "0/3 nodes are available: 3 Insufficient cpu."
    assert report.summary == f"fits no node now: {decision.message}"
    assert report.chosen == "" and report.candidates == []
    [only] = report.classes
    assert (only.nodes, only.closest.node) == (["n0", "n1", "n2"], "n2")


def test_a_pod_that_fits_goes_where_the_worker_would_put_it_with_its_score_parts() -> None:
    built = nodes(3500, 1000, 2500, 4000)
    pod = raw_pod("web", {"cpu": "1", "memory": "1Gi"}, labels={"hoss.io/policy": "binpack"})
    report = explain(pod, profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=built), top=3)
    decision = decide(PROFILES["binpack"], parse_pod(pod), built, rng=np.random.default_rng(0), top=3)
    assert isinstance(decision, Placement)
    assert report.profile == "binpack"
    assert report.chosen == decision.candidates[0] == "n2"  # the fullest node that still fits: bin-packing
    assert [c.node for c in report.candidates] == decision.candidates
    for candidate in report.candidates:
        assert sum(candidate.parts.values()) == pytest.approx(candidate.score, abs=0.01)
    assert report.summary == "fits 2 of 4 nodes; the worker would choose n2"
    assert {v.node: v.filter for v in report.verdicts}["n3"] == "NodeResourcesFit"


def test_equal_best_scores_are_said_to_be_a_random_pick() -> None:
    report = explain(raw_pod("web"), profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=nodes(0, 0)))
    assert report.summary.endswith("(2 nodes share the best score: the worker picks one of them at random)")


def test_a_rescheduler_hold_keeps_the_pod_to_its_nodes_and_names_the_others() -> None:
    report = explain(raw_pod("web"), profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=nodes(0, 0, 0), held=["n1"]))
    verdicts = {v.node: v for v in report.verdicts}
    assert verdicts["n0"].filter == HOLD_FILTER
    assert verdicts["n0"].reasons == ("node(s) were not where hoss-rescheduler holds room for the pod (n1)",)
    assert report.chosen == "n1"


def test_the_namespaces_quota_refuses_a_pod_that_fits_on_nodes() -> None:
    quota = QuotaUse(quota=ElasticQuota(namespace="team", min={}, max={"cpu": 2000}), used={"cpu": 1500})
    report = explain(raw_pod("web"), profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=nodes(0), quotas=QuotaReport(quotas=[quota], sum_min={}, sum_used={})))
    assert report.summary == ("its namespace's elastic quota refuses it on every node: quota team: cpu 1500m used + "
                              "1 requested > max 2")
    assert report.chosen == ""


def test_quota_refusal_applies_the_sum_of_min_as_the_ledger_does() -> None:
    team = QuotaUse(quota=ElasticQuota(namespace="team", min={"cpu": 2000}, max={}), used={"cpu": 2000})
    other = QuotaUse(quota=ElasticQuota(namespace="other", min={"cpu": 2000}, max={}), used={"cpu": 1500})
    report = QuotaReport(quotas=[team, other], sum_min={"cpu": 4000}, sum_used={"cpu": 3500})
    assert quota_refusal("team", {"cpu": 500}, report) is None  # borrows what other leaves
    assert quota_refusal("team", {"cpu": 1000}, report) == (
        "quota team: cpu 3500m used by all quotas + 1 requested > 4 guaranteed (sum of min)")
    assert quota_refusal("elsewhere", {"cpu": 10_000}, report) is None


def gang_member(name: str, cpu: str = "4") -> Json:
    return raw_pod(name, {"cpu": cpu, "memory": "1Gi"}, labels=GANG_LABELS, uid=f"uid-{name}")


def test_a_gang_short_of_members_waits_with_the_dispatchers_message() -> None:
    state = GangState(key=GangKey("team", "train"), pending=1, min_available=2)
    member = gang_member("train-0")
    report = explain(member, profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=nodes(0, 0), gang=GangFacts(state=state, members=[member])))
    assert report.summary == state.waiting_message()
    assert report.gang is not None and report.gang["pending"] == 1
    assert report.feasible == 2  # the member itself would fit: the gang is what it waits for


def test_a_gang_that_only_half_fits_binds_nothing_and_says_how_many_fit() -> None:
    state = GangState(key=GangKey("team", "train"), pending=2, min_available=2)
    members = [gang_member("train-0"), gang_member("train-1")]
    report = explain(members[0], profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=nodes(0, 4000), gang=GangFacts(state=state, members=members)))
    assert report.summary.startswith("its gang does not fit: gang team/train: only 1 of 2 members fit "
                                     "(min-available 2)")
    assert report.chosen == ""


def test_a_gang_that_fits_names_this_members_node() -> None:
    state = GangState(key=GangKey("team", "train"), pending=2, min_available=2)
    members = [gang_member("train-0"), gang_member("train-1")]
    report = explain(members[1], profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=nodes(0, 0), gang=GangFacts(state=state, members=members)))
    assert report.gang is not None
    placement = report.gang["placement"]
    assert isinstance(placement, dict) and sorted(placement) == ["train-0", "train-1"]
    assert report.chosen == placement["train-1"]
    assert len(set(placement.values())) == 2


def test_pods_the_worker_does_not_decide_are_said_to_be_so() -> None:
    bound = raw_pod("web", node="n0")
    assert explain(bound, profiles=PROFILES, default_profile=DEFAULT,
                   facts=Facts(table=nodes(0))).summary == "bound to n0: nothing to explain"
    claims = raw_pod("web")
    claims["spec"]["resourceClaims"] = [{"name": "gpu"}]
    assert explain(claims, profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=nodes(0))).summary \
        == "hoss does not support spec.resourceClaims yet: the worker leaves it pending"
    bad = raw_pod("web", tolerations=[{"key": "k", "operator": "Sometimes"}])
    assert explain(bad, profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=nodes(0))).summary.startswith(
        "hoss cannot schedule this pod: spec.tolerations[0].operator")


def test_notes_say_what_keeps_a_pod_from_any_worker() -> None:
    pod = raw_pod("web", labels={"hoss.io/policy": "nightly"})
    pod["spec"]["schedulingGates"] = [{"name": "wait"}]
    report = explain(pod, profiles=PROFILES, default_profile=DEFAULT, facts=Facts(table=nodes(0), workers=[]))
    assert report.profile == DEFAULT
    joined = "\n".join(report.notes)
    assert "the policies file has no profile nightly" in joined
    assert "no live worker serves policy nightly" in joined
    assert "scheduling gates wait" in joined


def test_the_table_shows_a_line_per_class_and_the_json_every_node() -> None:
    built = table(raw_node("gpu-0", {"cpu": "8", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "8"}),
                  *(raw_node(f"cpu-{i}", SMALL) for i in range(3)),
                  raw_node("tainted", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]))
    built.add_used("gpu-0", {"nvidia.com/gpu": 8})
    pod = raw_pod("train", {"cpu": "1", "nvidia.com/gpu": "1"})
    report = explain(pod, profiles=PROFILES, default_profile=DEFAULT,
                     facts=Facts(table=built, condition=("Unschedulable", "0/5 nodes are available"), phase="Pending",
                                 workers=["w1"]))
    text = render_table(report)
    assert "hoss said: Unschedulable: 0/5 nodes are available" in text
    rows = [" ".join(line.split()) for line in text.splitlines()]
    assert "3: cpu-0, +2 NodeResourcesFit Insufficient nvidia.com/gpu nvidia.com/gpu: asked 1, free 0 of 0" in rows
    assert "1: gpu-0 NodeResourcesFit Insufficient nvidia.com/gpu nvidia.com/gpu: asked 1, free 0 of 8" in rows
    assert ("1: tainted TaintToleration node(s) had untolerated taint {dedicated: x} taint dedicated=x:NoSchedule not "
            "tolerated") in rows
    assert "tainted" in render_table(report, each_node=True)
    document = orjson.loads(orjson.dumps(to_json(report)))
    assert document["nodes"] == 5 and document["feasible"] == 0
    assert {v["node"] for v in document["verdicts"]} == {"gpu-0", "cpu-0", "cpu-1", "cpu-2", "tainted"}
    gpu = next(v for v in document["verdicts"] if v["node"] == "gpu-0")
    assert gpu["figures"]["nvidia.com/gpu"] == {"asked": 1, "free": 0, "allocatable": 8}
    assert [c["count"] for c in document["classes"]] == [3, 1, 1]


def test_target_is_namespace_and_pod() -> None:
    assert target_of("team/web-0") == ("team", "web-0")
    assert target_of("web-0") == ("default", "web-0")
    with pytest.raises(WhyError, match="expected <namespace>/<pod>"):
        target_of("a/b/c")


def test_a_manifest_is_one_pod_given_a_uid_and_namespace(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: app}]}\n")
    manifest = read_manifest(path)
    assert manifest["metadata"] == {"name": "web", "namespace": "default", "uid": WHAT_IF_UID}
    path.write_text("kind: Deployment\nmetadata: {name: web}\n")
    with pytest.raises(WhyError, match="expected one Pod manifest, got Deployment"):
        read_manifest(path)
    path.write_text("kind: Pod\nmetadata: {}\nspec: {}\n")
    with pytest.raises(WhyError, match=r"metadata\.name is required"):
        read_manifest(path)


def test_hoss_why_needs_one_pod_and_where_to_read(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("HOSS_REDIS_URL", raising=False)
    assert main(["why", "team/web"]) == 2
    assert "needs --kubeconfig (or $KUBECONFIG) and --redis-url" in capsys.readouterr().err
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("HOSS_REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["why"]) == 2
    assert "needs one pod: <namespace>/<pod>, or --what-if FILE" in capsys.readouterr().err
    assert main(["why", "team/web", "--what-if", "pod.yaml"]) == 2
