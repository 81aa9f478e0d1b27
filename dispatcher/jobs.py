"""Jobs, for pods that depend on them (``hoss.io/depends-on``, dispatcher/dependencies.py): mirror their state."""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from dispatcher import dependencies
from dispatcher.core import Dispatcher
from hoss.kube.client import InformerHandlers, run_informer
from hoss.model.objects import Json


async def watch_jobs(api: client.ApiClient, dispatcher: Dispatcher) -> None:
    """Mirror every Job's state into the dispatcher; a change releases the pods waiting for it."""
    batch: Any = client.BatchV1Api(api)

    def key(job: Json) -> tuple[str, str]:
        metadata = job.get("metadata") or {}
        return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")

    async def on_list(items: list[Json]) -> None:
        listed = {key(job) for job in items}
        for namespace, jobs in list(dispatcher.jobs.items()):
            for name in [n for n in jobs if (namespace, n) not in listed]:
                dispatcher.on_job(namespace, name, None)
        for job in items:
            dispatcher.on_job(*key(job), dependencies.job_state(job))

    async def on_event(kind: str, job: Json) -> None:
        dispatcher.on_job(*key(job), None if kind == "DELETED" else dependencies.job_state(job))

    await run_informer("jobs", batch.list_job_for_all_namespaces, InformerHandlers(on_list=on_list,
                                                                                  on_event=on_event))
