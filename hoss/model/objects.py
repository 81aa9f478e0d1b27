"""Raw Kubernetes objects: the JSON dicts the apiserver sends. Each consumer parses the parts it reads through one
typed function; these are the two shapes every such function starts from. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Json = dict[str, Any]
"""A raw Kubernetes object (or part of one), as the apiserver sends it: camelCase keys."""


def section(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` when it is a JSON object, else an empty one: a missing or malformed part of a raw object
    (metadata, spec, status) reads as empty, and the caller names what it then lacks."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}
