"""Story 2, gangs: a gang held with ``GangIncomplete`` until its last member exists, then bound all together; a
second gang that cannot fit binds nothing (not even the member that would fit) and starts once the first one
leaves. Each node of the story has room for exactly one member (8 cpu; members request 8)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dev.demo.observe import bound, list_pods, wait_bound, wait_condition
from dev.demo.stage import GANG_NODES, GANGS_NAMESPACE, story_pod
from dev.local.cluster import Cluster
from hoss.model.objects import Json

GANG_NAME_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
GANG_MIN_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"


@dataclass
class GangStory:
    gang_nodes: int
    """Nodes of the story, each with room for exactly one member (8 cpu, members request 8)."""
    first_gang: str
    first_min_available: int
    held_with: int
    """Members of the first gang created before the last one: fewer than min-available."""
    held_reason: str
    """The PodScheduled=False reason the held members showed (the dispatcher's ``GangIncomplete``)."""
    held_message: str
    first_bound_when_complete: int
    """Members of the first gang bound once its last member was created (all of them: all or nothing)."""
    second_gang: str
    second_members: int
    second_fit_alone: int
    """Members of the second gang that would fit on their own while the first gang runs (free nodes)."""
    second_bound_while_blocked: int
    """Members of the second gang bound while it could not fit as a whole (0: all or nothing)."""
    second_message: str
    """What the second gang's members said while they waited."""
    second_bound_after_room: int
    """Members of the second gang bound after the first gang's pods were deleted."""
    seconds_to_start_after_room: float


def gang_member(gang: str, index: int, min_available: int) -> Json:
    return story_pod(f"{gang}-{index}", "gangs", requests={"cpu": "8", "memory": "8Gi"},
                     labels={GANG_NAME_LABEL: gang, GANG_MIN_LABEL: str(min_available)})


async def gang_story(cluster: Cluster, progress: Callable[[str], None]) -> GangStory:
    """train-a needs 3 of the 4 nodes; it is created one member short, then completed. train-b needs 2 nodes while
    only one is free: nothing of it is bound until train-a is deleted."""
    first, second = "train-a", "train-b"
    first_size, second_size = GANG_NODES - 1, 2
    progress(f"gangs: {first} ({first_size} members of 8 cpu, min-available {first_size}) created one member short")
    await cluster.create_pods([gang_member(first, i, first_size) for i in range(first_size - 1)],
                              namespace=GANGS_NAMESPACE)
    held_reason, held_message = await wait_condition(
        cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}", contains="GangIncomplete",
        what=f"{first}'s members to say GangIncomplete")
    progress(f"gangs: {first} waits ({held_reason}); creating its last member")
    await cluster.create_pods([gang_member(first, first_size - 1, first_size)], namespace=GANGS_NAMESPACE)
    await wait_bound(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}", first_size,
                     what=f"{first} to be bound")
    first_bound = len(bound(await list_pods(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={first}")))

    progress(f"gangs: {second} ({second_size} members of 8 cpu) while one node is free")
    await cluster.create_pods([gang_member(second, i, second_size) for i in range(second_size)],
                              namespace=GANGS_NAMESPACE)
    _reason, second_message = await wait_condition(
        cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}", contains="members fit",
        what=f"{second}'s members to say how many fit")
    blocked = len(bound(await list_pods(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}")))
    progress(f"gangs: {second} holds nothing ({blocked} bound); deleting {first} to free its nodes")
    freed = time.monotonic()
    for i in range(first_size):
        await cluster.call(cluster.core.delete_namespaced_pod, f"{first}-{i}", GANGS_NAMESPACE, grace_period_seconds=0)
    await wait_bound(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}", second_size,
                     what=f"{second} to start once {first} left")
    started = time.monotonic() - freed
    second_bound = len(bound(await list_pods(cluster, GANGS_NAMESPACE, f"{GANG_NAME_LABEL}={second}")))
    return GangStory(
        gang_nodes=GANG_NODES, first_gang=first, first_min_available=first_size, held_with=first_size - 1,
        held_reason=held_reason, held_message=held_message, first_bound_when_complete=first_bound,
        second_gang=second, second_members=second_size, second_fit_alone=GANG_NODES - first_size,
        second_bound_while_blocked=blocked, second_message=second_message, second_bound_after_room=second_bound,
        seconds_to_start_after_room=round(started, 1),
    )

