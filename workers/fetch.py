"""Pods for work items that carry none (queued by a dispatcher older than compact work items): read once from the
apiserver, then parsed like any item's."""

from __future__ import annotations

import dataclasses
import logging
from typing import Literal

import aiohttp

from hoss.kube.client import KubeError
from hoss.kube.rest import KubeREST
from hoss.model import compact
from hoss.queue import GangMember, WorkItem
from workers.intake import Work, members_of, parse_work

log = logging.getLogger(__name__)

NO_POD = "hoss cannot schedule this pod: its work item carries no pod"


async def fetch_pods(rest: KubeREST, item: WorkItem) -> list[GangMember] | None:
    """The item's pods still waiting (same uid, no node yet), in compact form; None when a read failed (the item is
    tried again soon)."""
    fetched: list[GangMember] = []
    for member in members_of(item):
        try:
            raw = await rest.get_pod(member.namespace, member.name)
        except KubeError as error:
            if error.status == 404:
                continue
            log.warning("cannot read pod %s/%s: %s", member.namespace, member.name, error)
            return None
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.warning("cannot read pod %s/%s: %s", member.namespace, member.name, error)
            return None
        if (raw.get("metadata") or {}).get("uid") != member.uid or (raw.get("spec") or {}).get("nodeName"):
            continue  # replaced or bound meanwhile
        form = compact.compact_pod(raw)
        fetched.append(GangMember(uid=member.uid, namespace=member.namespace, name=member.name,
                                  pod=compact.encode(form).decode(), digest=compact.digest(form)))
    return fetched


async def fetch(rest: KubeREST | None, work: Work) -> Literal["filled", "gone", "retry"]:
    """Fill in the pods of `work`, which carries none: "filled" (parsed into it, or marked malformed without an
    apiserver to read them from), "gone" (none is still waiting) or "retry" (a read failed: try again soon)."""
    if rest is None:
        work.problem = NO_POD
        work.fetch = False
        return "filled"
    fetched = await fetch_pods(rest, work.item)
    if fetched is None:
        return "retry"
    if not fetched:
        return "gone"
    fill(work, fetched)
    return "filled"


def fill(work: Work, fetched: list[GangMember]) -> None:
    """Parse the `fetched` pods into `work` (its item stays as queued: the acknowledgement names it). No I/O."""
    item = work.item
    if item.members:
        filled = dataclasses.replace(item, members=tuple(fetched))
    else:
        filled = dataclasses.replace(item, pod=fetched[0].pod, digest="")
    parsed = parse_work(work.message_id, filled)
    work.pod, work.raw, work.members, work.problem = parsed.pod, parsed.raw, parsed.members, parsed.problem
    work.fetch = False
