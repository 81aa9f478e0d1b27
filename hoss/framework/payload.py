"""Typed readers for raw apiserver JSON, shared by the pod and node parsers. Pure, no I/O.

Each reader returns the value with its Python type or raises the given `SpecError` subclass naming the field by
its JSON path (``spec.tolerations[2].effect``). A missing optional field reads as its empty value, as the
apiserver omits empty fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hoss.errors import SpecError


def mapping(value: object, *, field: str, error: type[SpecError], required: bool = False) -> Mapping[str, Any]:
    """A JSON object; None reads as ``{}`` unless `required`."""
    if value is None:
        if required:
            raise error(field=field, reason="missing")
        return {}
    if not isinstance(value, Mapping):
        raise error(field=field, reason=f"expected an object, got {type(value).__name__}")
    return value


def items(value: object, *, field: str, error: type[SpecError]) -> list[Any]:
    """A JSON array; None reads as ``[]``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise error(field=field, reason=f"expected a list, got {type(value).__name__}")
    return value


def string(value: object, *, field: str, error: type[SpecError], required: bool = False) -> str:
    """A JSON string; None reads as ``""`` unless `required` (then an empty string is rejected too)."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise error(field=field, reason=f"expected a string, got {type(value).__name__}")
    if required and not value:
        raise error(field=field, reason="missing")
    return value


def string_map(value: object, *, field: str, error: type[SpecError]) -> dict[str, str]:
    """A JSON object of strings (labels, annotations, nodeSelector); None reads as ``{}``."""
    result: dict[str, str] = {}
    for key, item in mapping(value, field=field, error=error).items():
        result[str(key)] = string(item, field=f"{field}.{key}", error=error)
    return result


def boolean(value: object, *, field: str, error: type[SpecError]) -> bool:
    """A JSON boolean; None reads as False."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise error(field=field, reason=f"expected a boolean, got {type(value).__name__}")
    return value


def integer(value: object, *, field: str, error: type[SpecError]) -> int:
    """A JSON integer; None reads as 0."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(field=field, reason=f"expected an integer, got {type(value).__name__}")
    return value
