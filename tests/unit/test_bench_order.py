"""The bench's repeated throughput rounds alternate which system goes first, so a machine that drifts slower (or
faster) over the run favours neither kube-scheduler nor hoss, nor one worker count over another."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.scenarios import sizes, throughput


class FakeBench:
    def __init__(self, ran: list[str]) -> None:
        self.ran = ran

    def kube_alone(self) -> None:
        self.ran.append("kube alone")

    def hoss_alone(self) -> None:
        self.ran.append("hoss alone")

    def progress(self, *_args: Any) -> None:
        pass


async def test_rounds_alternate_which_system_and_which_worker_count_goes_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    bench = FakeBench(ran)

    async def kube_run(_bench: Any, _size: Any, *, again: int) -> dict[str, Any]:
        ran.append(f"kube {again}")
        return {"pods_per_second": again}

    async def hoss_run(_bench: Any, _size: Any, workers: int, _cpus: Any, *, again: int) -> dict[str, Any]:
        ran.append(f"hoss-{workers}w {again}")
        return {"pods_per_second": again}

    async def ceiling(_bench: Any, _size: Any) -> dict[str, Any]:
        ran.append("ceiling")
        return {}

    monkeypatch.setattr(throughput, "_kube_run", kube_run)
    monkeypatch.setattr(throughput, "_hoss_run", hoss_run)
    monkeypatch.setattr(throughput, "ceiling", ceiling)
    size = dataclasses.replace(sizes.FULL, repeats=4)
    again = await throughput.throughput_again(bench, size)  # type: ignore[arg-type]

    assert ran == [
        "hoss alone", "ceiling", "hoss-4w 2", "hoss-1w 2", "kube alone", "kube 2", "ceiling",
        "kube alone", "kube 3", "ceiling", "hoss alone", "ceiling", "hoss-1w 3", "hoss-4w 3",
        "hoss alone", "ceiling", "hoss-4w 4", "hoss-1w 4", "kube alone", "kube 4", "ceiling",
        "hoss alone",
    ]
    # Each row's runs are in the order they ran, whichever side went first.
    assert [row["pods_per_second"] for row in again["kube-scheduler"]] == [2, 3, 4]
    assert [row["pods_per_second"] for row in again["hoss-1w"]] == [2, 3, 4]
    assert [row["pods_per_second"] for row in again["hoss-4w"]] == [2, 3, 4]
    assert len(again["apiserver-ceiling"]) == len(again["apiserver-ceiling+webhook"]) == 3
