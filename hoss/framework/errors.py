"""The workers package's error hierarchy.

Every error a worker raises on purpose is a `WorkerError`. A bad policy file is a `ProfileError` (also a
`ValueError`) that names where the mistake is -- profile, plugin and field -- so an operator can fix the YAML
from the message alone. Malformed pods and nodes keep the resolver's `PodSpecError` / `NodeSpecError`, which
already name the field by its JSON path.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base of every error the workers package raises on purpose."""


class ProfileError(WorkerError, ValueError):
    """A policy profile that cannot be built, or a pod that asks for a profile that does not exist.

    `profile`, `plugin` and `field` are None when the mistake is not inside one (e.g. the file is not YAML).
    """

    def __init__(
        self,
        *,
        reason: str,
        profile: str | None = None,
        plugin: str | None = None,
        field: str | None = None,
        source: str = "policies",
    ) -> None:
        self.reason = reason
        self.profile = profile
        self.plugin = plugin
        self.field = field
        self.source = source
        where = [
            f"{label} {value!r}"
            for label, value in (("profile", profile), ("plugin", plugin), ("field", field))
            if value is not None
        ]
        super().__init__(f"{source}: {', '.join(where)}: {reason}" if where else f"{source}: {reason}")


class UnsupportedPodField(WorkerError):
    """A pod uses a field kube-scheduler honours and hoss does not yet: it is refused, never placed as if the field
    were absent. `field` is the JSON path, e.g. ``spec.affinity.podAntiAffinity``."""

    def __init__(self, field: str) -> None:
        self.field = field
        super().__init__(f"hoss does not support {field} yet")


class PluginError(WorkerError):
    """A plugin broke the framework's contract (e.g. returned an array that does not cover every node)."""


class UnknownNodeError(WorkerError, LookupError):
    """A node the worker's node table does not hold (not yet seen from the apiserver, or already deleted)."""

    def __init__(self, node: str) -> None:
        self.node = node
        super().__init__(f"node {node!r} is not in the node table")
