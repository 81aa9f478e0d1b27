"""Kubernetes' protobuf wire form for the two bodies the hot path writes for every pod: its Binding and its
Scheduled Event. Pure.

The apiserver decodes a JSON body by reflection (finding apiVersion and kind first, then unmarshalling, defaulting
and converting); measured with pprof on the local plane that cost it about 80 µs per binding, against a few µs
for the same Binding in protobuf, which is what kube-scheduler sends. Both bodies are small and fixed in shape,
so they are encoded here by hand from the field numbers of k8s.io/api/core/v1's generated.proto (Binding, Event,
EventSource, ObjectReference), k8s.io/apimachinery's (ObjectMeta, Time) and its runtime.Unknown envelope, behind
the 4-byte magic ``k8s\\0``. Answers are still asked for in JSON (``Accept``): an error's Status is read as before.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Mapping
from typing import Any

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
_BYTES = [bytes((value,)) for value in range(0x80)]


class Unencodable(ValueError):
    """A body with a field or value this module does not encode; the caller sends it as JSON."""


def _varint(value: int) -> bytes:
    if value < 0x80:  # most lengths and field keys: one byte
        return _BYTES[value]
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_KEYS = [_varint(number << 3 | 2) for number in range(32)]
"""The key of a length-delimited field (wire type 2) by field number, for the numbers used here."""


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2: strings, bytes, embedded messages, map entries)."""
    size = len(payload)
    return _KEYS[number] + (_BYTES[size] if size < 0x80 else _varint(size)) + payload


def _string(number: int, value: str) -> bytes:
    return _field(number, value.encode()) if value else b""


def _integer(number: int, value: int) -> bytes:
    """A varint field (wire type 0) of a non-negative integer; zero, protobuf's default, is left out."""
    if value < 0:
        raise Unencodable(f"field {number}: negative integers are not encoded here, got {value}")
    return _varint(number << 3) + _varint(value) if value else b""


def _envelope(kind: str, message: bytes) -> bytes:
    """runtime.Unknown (typeMeta 1: apiVersion 1, kind 2; raw 2) of a core/v1 object, behind the magic."""
    return MAGIC + _field(1, _string(1, "v1") + _string(2, kind)) + _field(2, message)


def binding(namespace: str, name: str, uid: str, node: str, labels: Mapping[str, str] | None = None) -> bytes:
    """The body of ``POST .../pods/<name>/binding`` binding the pod (``uid``: refused if the pod was replaced) to
    ``node``, with ``labels`` on the Binding."""
    # ObjectMeta: name 1, namespace 3, uid 5, labels 11 (map entries: key 1, value 2)
    metadata = _string(1, name) + _string(3, namespace) + _string(5, uid)
    for key, value in (labels or {}).items():
        metadata += _field(11, _string(1, key) + _string(2, value))
    # ObjectReference: kind 1, name 3, apiVersion 5
    target = _string(1, "Node") + _string(3, node) + _string(5, "v1")
    # Binding: metadata 1, target 2
    message = _field(1, metadata) + _field(2, target)
    return _envelope("Binding", message)


EVENT_FIELDS = {"metadata": 1, "involvedObject": 2, "reason": 3, "message": 4, "source": 5, "firstTimestamp": 6,
                "lastTimestamp": 7, "count": 8, "type": 9, "action": 12, "reportingComponent": 14,
                "reportingInstance": 15}
"""The core/v1 Event fields this module encodes (hoss.kube.events writes no others), by field number."""
_TYPE_FIELDS = {"apiVersion": "v1", "kind": "Event"}
_META_FIELDS = {"name": 1, "namespace": 3}
_REFERENCE_FIELDS = {"kind": 1, "namespace": 2, "name": 3, "uid": 4, "apiVersion": 5, "resourceVersion": 6,
                     "fieldPath": 7}
_SOURCE_FIELDS = {"component": 1, "host": 2}


def _strings(what: str, value: Any, numbers: Mapping[str, int]) -> bytes:
    if not isinstance(value, Mapping):
        raise Unencodable(f"{what}: expected an object, got {value!r}")
    out = b""
    for key, text in value.items():
        if key not in numbers or not isinstance(text, str):
            raise Unencodable(f"{what}.{key}: not encoded here ({text!r})")
        out += _string(numbers[key], text)
    return out


def _time(what: str, value: Any) -> bytes:
    """meta/v1 Time (seconds 1, nanos 2) of an RFC 3339 time in whole seconds, as Time marshals to JSON."""
    seconds = _seconds(value) if isinstance(value, str) else None
    if seconds is None:
        raise Unencodable(f"{what}: expected a time like 2026-01-02T03:04:05Z, got {value!r}")
    return _integer(1, seconds)


@functools.lru_cache(maxsize=16)
def _seconds(text: str) -> int | None:
    """Seconds since the epoch of ``text`` (an event's two timestamps, the same second for many events: parsed
    once), None when it is no such time."""
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return int(moment.timestamp())


def event(body: Mapping[str, Any]) -> bytes:
    """The body of ``POST /api/v1/namespaces/<ns>/events`` for a core/v1 Event written as JSON would be (the
    shape of ``hoss.kube.events.pod_event``). A field this module does not encode raises Unencodable naming
    it: the caller posts that event as JSON instead."""
    message = b""
    for key, value in body.items():
        if key in _TYPE_FIELDS:
            if value != _TYPE_FIELDS[key]:
                raise Unencodable(f"{key}: expected {_TYPE_FIELDS[key]!r}, got {value!r}")
            continue
        number = EVENT_FIELDS.get(key)
        if number is None:
            raise Unencodable(f"{key}: not encoded here")
        if key == "metadata":
            message += _field(number, _strings(key, value, _META_FIELDS))
        elif key == "involvedObject":
            message += _field(number, _strings(key, value, _REFERENCE_FIELDS))
        elif key == "source":
            message += _field(number, _strings(key, value, _SOURCE_FIELDS))
        elif key in ("firstTimestamp", "lastTimestamp"):
            message += _field(number, _time(key, value))
        elif key == "count":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
                raise Unencodable(f"count: expected a non-negative int32, got {value!r}")
            message += _integer(number, value)
        elif isinstance(value, str):
            message += _string(number, value)
        else:
            raise Unencodable(f"{key}: expected a string, got {value!r}")
    return _envelope("Event", message)
