"""The apiserver objects a dispatcher keeps from its watches, by kind, as raw objects by key. Pure.

A catalog kind is a table: namespaced kinds are keyed (namespace, name), cluster-scoped ones by name. The watch of
a kind lists (`replace`) and then sends events (`apply`); an object without a name is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hoss.model.objects import Json, section


def object_name(obj: Mapping[str, Any]) -> str:
    return str(section(dict(obj), "metadata").get("name") or "")


def object_namespace(obj: Mapping[str, Any]) -> str:
    return str(section(dict(obj), "metadata").get("namespace") or "default")


class ObjectCatalog:
    """Raw objects by kind (each kind an attribute named after it, a dict by key)."""

    KINDS: ClassVar[tuple[str, ...]] = ()
    NAMESPACED: ClassVar[frozenset[str]] = frozenset()

    def key(self, kind: str, raw: Mapping[str, Any]) -> Any:
        return (object_namespace(raw), object_name(raw)) if kind in self.NAMESPACED else object_name(raw)

    def replace(self, kind: str, items: list[Json]) -> None:
        """The watch of `kind` listed `items`."""
        setattr(self, kind, {self.key(kind, raw): raw for raw in items if object_name(raw)})

    def apply(self, kind: str, event: str, raw: Json) -> None:
        """One watch event of `kind`."""
        if not object_name(raw):
            return
        table: dict[Any, Json] = getattr(self, kind)
        if event == "DELETED":
            table.pop(self.key(kind, raw), None)
        else:
            table[self.key(kind, raw)] = raw
