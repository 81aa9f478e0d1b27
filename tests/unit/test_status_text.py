"""``hoss status`` prints each ledger resource with one unit for both columns, readable at a glance."""

from __future__ import annotations

import pytest

from deploy.status import readable_totals, render
from dispatcher.status import LedgerStatus, ResourceTotal
from tests.status_documents import status_with, worker_row

GIB = 1 << 30


@pytest.mark.parametrize(
    ("resource", "used", "alloc", "expected"),
    [
        ("cpu", 1_001_750, 2_560_000, ("1,001.75", "2,560", "cores")),
        ("cpu", 500, 16_000, ("0.5", "16", "cores")),
        ("cpu", 0, 4_000, ("0", "4", "cores")),
        ("memory", 3 * GIB + GIB // 2, 64 * GIB, ("3.5", "64", "GiB")),
        ("memory", 256 << 20, 768 << 20, ("256", "768", "MiB")),
        ("hugepages-2Mi", 4 << 20, 2 * GIB, ("<0.01", "2", "GiB")),
        ("nvidia.com/gpu", 13, 160, ("13", "160", "")),
        ("pods", 1_234, 22_000, ("1,234", "22,000", "")),
        ("pods", 100, 1_000, ("100", "1,000", "")),
    ],
)
def test_readable_totals(resource: str, used: int, alloc: int, expected: tuple[str, str, str]) -> None:
    assert readable_totals(resource, used, alloc) == expected


def test_render_prints_one_unit_per_resource_line() -> None:
    status = status_with(ledger=LedgerStatus(ready=True, epoch="e", nodes=160, assumed=0, bound=10, resources={
        "cpu": ResourceTotal(alloc=2_560_000, used=1_001_750),
        "memory": ResourceTotal(alloc=10_240 * GIB, used=512 * GIB),
    }))
    lines = render(status, url="http://x/status").splitlines()
    cpu = next(line for line in lines if line.strip().startswith("cpu"))
    memory = next(line for line in lines if line.strip().startswith("memory"))
    assert cpu.split() == ["cpu", "1,001.75", "/", "2,560", "cores", "(39%", "used)"]
    assert memory.split() == ["memory", "512", "/", "10,240", "GiB", "(5%", "used)"]


def test_render_marks_a_live_worker_the_leader_does_not_route_to() -> None:
    status = status_with([
        worker_row("w-routed", alive=True, routed=True), worker_row("w-new", alive=True, routed=False),
        worker_row("w-dead", alive=False, routed=False), worker_row("w-unknown", alive=True, routed=None),
    ])
    lines = render(status, url="http://x/status").splitlines()
    alive = {line.split()[0]: line.split()[1] for line in lines if line.strip().startswith("w-")}
    assert alive == {"w-routed": "yes", "w-new": "yes*", "w-dead": "NO", "w-unknown": "yes"}
    assert sum("* alive but not sent new pods" in line for line in lines) == 1
