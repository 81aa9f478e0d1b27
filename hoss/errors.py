"""The resolver package's error hierarchy.

Every error the resolver raises on purpose is a `HossError`. Errors about bad input (a quantity, a pod or a
node payload) are also `ValueError`s and name the offending field by its JSON path, e.g.
``spec.initContainers[1].resources.requests.memory``, so a message can be shown to a user as is. Errors about the
ledger's Redis keep the client library's exception as their cause (`raise ... from`).
"""

from __future__ import annotations


class HossError(Exception):
    """Base of every error the resolver package raises on purpose."""


class QuantityError(HossError, ValueError):
    """A Kubernetes quantity that cannot be parsed or is not allowed (e.g. negative)."""

    def __init__(self, *, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}: invalid quantity {value!r}: {reason}")


class SpecError(HossError, ValueError):
    """A Kubernetes payload whose shape is not what the apiserver would return (missing or mistyped field)."""

    def __init__(self, *, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class PodSpecError(SpecError):
    """A malformed pod; `field` is the JSON path inside the pod, e.g. ``spec.containers[0].resources``."""


class NodeSpecError(SpecError):
    """A malformed node; `field` is the JSON path inside the node, e.g. ``status.allocatable``."""


class LedgerUnavailable(HossError):
    """The ledger's Redis cannot be reached or refused the command; the cause is the client library's error."""


class LedgerNotReadyError(HossError):
    """A ledger write that has no result value to carry `LedgerNotReady` found the ledger not rebuilt.

    Raised by the operations that return plain values (bind, release, expire, ...); reserve, reserve_gang and
    confirm return the `LedgerNotReady` result instead, because their callers turn it into a verdict.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"ledger not ready: {reason}")
