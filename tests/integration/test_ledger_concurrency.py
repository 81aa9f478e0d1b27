"""The ledger under real concurrency on a real redis-server: many connections and several OS processes at once.

Each uid is driven by one client through a short story (reserve, maybe move, then confirm, bind, release or
keep; or a foreign binding confirmed directly). Stories of different uids run concurrently. Afterwards the
ledger must agree with what every client was told, and for every node and resource ``used <= alloc`` and
``used`` equals the sum of the entries on that node.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from hoss.ledger.arguments import BoundPod, GangMember
from hoss.ledger.client import Ledger
from hoss.ledger.results import Confirmed, Conflict, GangReserved, LedgerNotReady, PodEntry, Reserved
from hoss.model.resources import ResourceVector, add

Mi, Gi = 2**20, 2**30
NODES: dict[str, ResourceVector] = {
    "n1": {"cpu": 4000, "memory": 8 * Gi, "pods": 110},
    "n2": {"cpu": 2000, "memory": 4 * Gi, "pods": 6},
    "gpu1": {"cpu": 8000, "memory": 16 * Gi, "nvidia.com/gpu": 4, "pods": 110},
}
TTL = 120.0
Finish = Literal["keep", "confirm", "bind", "release", "foreign"]
Held = tuple[str, str] | None
"""(node, state) a uid ends up holding, or None"""

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Story:
    """What one client does with one uid: reserve on each node in turn (a move after the first success), then
    `finish` on the node it holds. ``foreign`` skips the reservations: a foreign binding confirmed on nodes[0]."""

    uid: str
    request: dict[str, int]
    nodes: list[str]
    finish: Finish


async def run_story(ledger: Ledger, story: Story, *, owner: str) -> Held:
    """Plays `story` and returns where the uid must be held afterwards, judged from the ledger's answers alone."""
    uid, pod, request = story.uid, f"ns/{story.uid}", story.request
    if story.finish == "foreign":
        node = story.nodes[0]
        result = await ledger.confirm(
            uid=uid, pod=pod, node=node, request=request, owner=f"foreign:{owner}", verify_after_seconds=TTL
        )
        if isinstance(result, Conflict):
            assert result.wanted > result.free, result
            return None
        assert result == Confirmed(node=node, foreign=True), result
        return node, "admitted"

    held: str | None = None
    for node in story.nodes:
        reserved = await ledger.reserve(uid=uid, pod=pod, node=node, request=request, owner=owner, ttl_seconds=TTL)
        if isinstance(reserved, Conflict):
            assert reserved.wanted > reserved.free, reserved
        else:
            assert reserved == Reserved(node), reserved
            held = node
    if held is None:
        return None
    if story.finish == "confirm":
        confirmed = await ledger.confirm(
            uid=uid, pod=pod, node=held, request=request, owner="foreign:nobody", verify_after_seconds=TTL
        )
        assert confirmed == Confirmed(node=held, foreign=False), confirmed
        return held, "admitted"
    elif story.finish == "bind":
        await ledger.bind(uid=uid, pod=pod, node=held, request=request)
        return held, "bound"
    elif story.finish == "release":
        assert await ledger.release(uid)
        return None
    return held, "assumed"


async def run_stories(url: str, stories: Sequence[Story], *, owner: str) -> dict[str, Held]:
    """One client (its own connection pool) playing all `stories` concurrently."""
    async with Ledger.from_url(url) as ledger:
        held = await asyncio.gather(*(run_story(ledger, story, owner=owner) for story in stories))
    return {story.uid: place for story, place in zip(stories, held, strict=True)}


def worker_main() -> None:
    """Entry point of a worker process: {url, owner, stories} as JSON on stdin, {uid: [node, state] | null} out."""
    job = json.load(sys.stdin)
    stories = [Story(**story) for story in job["stories"]]
    held = asyncio.run(run_stories(job["url"], stories, owner=job["owner"]))
    json.dump(held, sys.stdout)


async def run_stories_in_process(url: str, stories: Sequence[Story], *, owner: str) -> dict[str, Held]:
    code = "from tests.integration.test_ledger_concurrency import worker_main; worker_main()"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=PROJECT_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    job = {"url": url, "owner": owner, "stories": [asdict(story) for story in stories]}
    out, err = await process.communicate(json.dumps(job).encode())
    assert process.returncode == 0, err.decode()
    return {uid: (place[0], place[1]) if place else None for uid, place in json.loads(out).items()}


async def fresh_ledger(url: str) -> None:
    async with redis.asyncio.Redis.from_url(url) as client:
        await client.flushdb()
    async with Ledger.from_url(url) as ledger:
        await ledger.rebuild(nodes=[(name, alloc, {}) for name, alloc in NODES.items()], bound=[])


async def assert_consistent(ledger: Ledger, url: str) -> None:
    """used <= alloc everywhere, used and entry counts match the entries, one entry per uid."""
    snapshot = await ledger.snapshot()
    entries = await ledger.entries()
    assert len({entry.uid for entry in entries}) == len(entries)
    async with redis.asyncio.Redis.from_url(url) as client:
        pod_keys = [key async for key in client.scan_iter(match="{hoss}:pod:*", count=1000)]
    assert len(pod_keys) == len(entries), "a pod entry is not indexed under its node"

    sums: dict[str, ResourceVector] = {}
    states: Counter[tuple[str, str]] = Counter()
    for entry in entries:
        assert entry.node in snapshot.nodes, entry
        sums[entry.node] = add(sums.get(entry.node, {}), entry.request)
        states[entry.node, entry.state] += 1
    for name, node in snapshot.nodes.items():
        assert node.used == {r: v for r, v in sums.get(name, {}).items() if v}, name
        assert (node.assumed, node.bound, node.admitted) == (states[name, "assumed"], states[name, "bound"],
                                                          states[name, "admitted"]), name
        for resource, amount in node.used.items():
            assert amount <= node.alloc.get(resource, 0), f"{name} oversold {resource}: {amount} > {node.alloc}"


async def assert_ledger_matches(url: str, expected: dict[str, Held]) -> None:
    async with Ledger.from_url(url) as ledger:
        await assert_consistent(ledger, url)
        actual = {entry.uid: (entry.node, entry.state) for entry in await ledger.entries()}
    assert actual == {uid: place for uid, place in expected.items() if place is not None}


requests = st.builds(
    lambda cpu, memory, gpu: {"cpu": cpu * 100, "memory": memory * 256 * Mi, "nvidia.com/gpu": gpu, "pods": 1},
    st.integers(0, 20),
    st.integers(0, 16),
    st.sampled_from([0, 0, 0, 1, 2]),
)
story_shapes = st.tuples(
    requests,
    st.lists(st.sampled_from(sorted(NODES)), min_size=1, max_size=3),
    st.sampled_from(["keep", "confirm", "bind", "release", "foreign"]),
)


def to_stories(shapes: Sequence[tuple[dict[str, int], list[str], str]]) -> list[Story]:
    finishes: dict[str, Finish] = {f: f for f in ("keep", "confirm", "bind", "release", "foreign")}
    return [
        Story(uid=f"uid-{index}", request=request, nodes=nodes, finish=finishes[finish])
        for index, (request, nodes, finish) in enumerate(shapes)
    ]


def deal(stories: Sequence[Story], hands: int) -> list[list[Story]]:
    return [list(stories[hand::hands]) for hand in range(hands)]


@settings(max_examples=20, deadline=None)
@given(shapes=st.lists(story_shapes, min_size=10, max_size=80))
async def test_many_clients_at_once_never_oversell_and_agree_with_the_ledger(
    redis_url: str, shapes: list[tuple[dict[str, int], list[str], str]]
) -> None:
    await fresh_ledger(redis_url)
    hands = deal(to_stories(shapes), 8)

    results = await asyncio.gather(
        *(run_stories(redis_url, hand, owner=f"w{index}") for index, hand in enumerate(hands))
    )

    expected = {uid: place for result in results for uid, place in result.items()}
    await assert_ledger_matches(redis_url, expected)


@settings(max_examples=4, deadline=None)
@given(shapes=st.lists(story_shapes, min_size=30, max_size=80))
async def test_clients_in_several_processes_never_oversell(
    redis_url: str, shapes: list[tuple[dict[str, int], list[str], str]]
) -> None:
    await fresh_ledger(redis_url)
    hands = deal(to_stories(shapes), 6)

    results = await asyncio.gather(
        *(run_stories_in_process(redis_url, hand, owner=f"p{index}") for index, hand in enumerate(hands[:4])),
        *(run_stories(redis_url, hand, owner=f"w{index}") for index, hand in enumerate(hands[4:])),
    )

    expected = {uid: place for result in results for uid, place in result.items()}
    await assert_ledger_matches(redis_url, expected)


gangs = st.lists(
    st.lists(st.tuples(requests, st.sampled_from(sorted(NODES))), min_size=2, max_size=4),
    min_size=4,
    max_size=16,
)


@settings(max_examples=15, deadline=None)
@given(gang_shapes=gangs)
async def test_gangs_racing_for_room_are_all_or_nothing(
    redis_url: str, gang_shapes: list[list[tuple[dict[str, int], str]]]
) -> None:
    await fresh_ledger(redis_url)
    members = [
        [
            GangMember(uid=f"g{gang}-{index}", pod=f"ns/g{gang}-{index}", node=node, request=request)
            for index, (request, node) in enumerate(shape)
        ]
        for gang, shape in enumerate(gang_shapes)
    ]
    clients = [Ledger.from_url(redis_url) for _ in members]
    try:
        results = await asyncio.gather(
            *(
                client.reserve_gang(members=gang, owner=f"w{index}", ttl_seconds=TTL)
                for index, (client, gang) in enumerate(zip(clients, members, strict=True))
            )
        )
    finally:
        await asyncio.gather(*(client.close() for client in clients))

    expected: dict[str, Held] = {}
    for gang, result in zip(members, results, strict=True):
        assert isinstance(result, GangReserved | Conflict), result
        for member in gang:
            expected[member.uid] = (member.node, "assumed") if isinstance(result, GangReserved) else None
    await assert_ledger_matches(redis_url, expected)


async def test_rebuild_after_flushall_restores_exactly_the_given_truth(ledger: Ledger, redis_url: str) -> None:
    await fresh_ledger(redis_url)
    stories = [
        Story(uid=f"uid-{index}", request=request, nodes=[node], finish="bind")
        for index, (request, node) in enumerate(
            ({"cpu": 100 * (i % 7), "memory": (i % 5) * 64 * Mi, "pods": 1}, sorted(NODES)[i % 3]) for i in range(60)
        )
    ]
    held = {}
    for hand in deal(stories, 4):
        held.update(await run_stories(redis_url, hand, owner="w"))
    before = await ledger.snapshot()
    truth = [entry for entry in await ledger.entries() if entry.state == "bound"]
    assert len(truth) == sum(place is not None for place in held.values()) > 0

    async with redis.asyncio.Redis.from_url(redis_url) as client:
        await client.flushall()
    assert not await ledger.is_ready()
    assert isinstance(
        await ledger.reserve(uid="x", pod="ns/x", node="n1", request={"pods": 1}, owner="w", ttl_seconds=TTL),
        LedgerNotReady,
    )

    rebuilt = await ledger.rebuild(
        nodes=[(name, alloc, {"rebuilt": "yes"}) for name, alloc in NODES.items()],
        bound=[BoundPod(uid=e.uid, pod=e.pod, node=e.node, request=e.request) for e in truth],
    )

    after = await ledger.snapshot()
    assert after.ready and after.epoch == rebuilt.epoch != before.epoch
    assert {name: (node.alloc, node.used, node.bound, node.assumed) for name, node in after.nodes.items()} == {
        name: (node.alloc, node.used, node.bound, node.assumed) for name, node in before.nodes.items()
    }

    def essentials(entries: Sequence[PodEntry]) -> list[tuple[str, str, str, str, ResourceVector]]:
        return [(e.uid, e.pod, e.node, e.state, e.request) for e in entries]

    assert essentials(await ledger.entries()) == essentials(truth)
    await assert_consistent(ledger, redis_url)


async def test_rebuild_racing_with_reservations_leaves_consistent_totals(ledger: Ledger, redis_url: str) -> None:
    await fresh_ledger(redis_url)
    stories = [
        Story(uid=f"uid-{i}", request={"cpu": 300, "memory": 256 * Mi, "pods": 1}, nodes=[sorted(NODES)[i % 3]],
              finish="keep")
        for i in range(90)
    ]  # fmt: skip
    rebuilds = [ledger.rebuild(nodes=[(name, alloc, {}) for name, alloc in NODES.items()], bound=[]) for _ in range(5)]

    results = await asyncio.gather(
        *(run_stories(redis_url, hand, owner=f"w{i}") for i, hand in enumerate(deal(stories, 6))), *rebuilds
    )

    held = {uid: place for result in results if isinstance(result, dict) for uid, place in result.items()}
    await assert_ledger_matches(redis_url, held)
