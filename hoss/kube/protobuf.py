"""Kubernetes' protobuf wire form for the two bodies the hot path writes for every pod: its Binding and its
Scheduled Event. Pure.

The apiserver decodes a JSON body by reflection (finding apiVersion and kind first, then unmarshalling, defaulting
and converting); measured with pprof on the local plane that cost it about 80 µs per binding, against a few µs
for the same Binding in protobuf, which is what kube-scheduler sends. Both bodies are small and fixed in shape,
so they are encoded here by hand from the field numbers of k8s.io/api/core/v1's generated.proto (Binding, Event,
EventSource, ObjectReference), k8s.io/apimachinery's (ObjectMeta, Time) and its runtime.Unknown envelope, behind
the 4-byte magic ``k8s\\0``. Answers are still asked for in JSON (``Accept``): an error's Status is read as before.

Invariant: the bytes are exactly those of k8s.io/apimachinery's protobuf serializer (what client-go sends) for the
same object, which tests/golden/protobuf holds for every shape written here. Like Kubernetes' generated Go code,
this writes every field that is not a pointer in Go, empty or zero as it may be, in field-number order, and map
entries sorted by key. A Time is its seconds and zero nanos; only the zero Time (JSON null) is empty, and an empty
Time is what the apiserver reads as the zero Time, not the epoch.
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
_EMPTY = [key + b"\x00" for key in _KEYS]
"""An empty length-delimited field by field number."""


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2: strings, bytes, embedded messages, map entries), empty or not."""
    size = len(payload)
    return _KEYS[number] + (_BYTES[size] if size < 0x80 else _varint(size)) + payload


def _string(number: int, value: str) -> bytes:
    """A string field, written when empty too: Go's generated code writes every string field of these messages."""
    if not value:
        return _EMPTY[number]
    data = value.encode()
    size = len(data)
    return _KEYS[number] + (_BYTES[size] if size < 0x80 else _varint(size)) + data


_UNKNOWN_TAIL = _string(3, "") + _string(4, "")
"""runtime.Unknown's contentEncoding 3 and contentType 4, both empty: the raw bytes are protobuf."""
_META_AFTER_VERSION = b"\x38\x00" + _field(8, b"")
"""ObjectMeta's generation 7 (a varint, 0) and creationTimestamp 8 (the zero Time), both unset."""
_META_TAIL = _string(6, "") + _META_AFTER_VERSION
"""ObjectMeta's resourceVersion 6, generation 7 and creationTimestamp 8, all unset."""
_ZERO_TIME = _field(10, b"")
"""Event's eventTime 10 (a MicroTime), unset: the zero time."""


_TYPE_METAS = {kind: MAGIC + _field(1, _string(1, "v1") + _string(2, kind)) for kind in ("Binding", "Event")}
"""The magic and runtime.Unknown's typeMeta 1 (apiVersion 1, kind 2) of each core/v1 kind written here."""


def _envelope(kind: str, message: bytes) -> bytes:
    """runtime.Unknown (typeMeta 1, raw 2, contentEncoding 3, contentType 4) of a core/v1 object, behind the
    magic."""
    return b"".join((_TYPE_METAS[kind], _field(2, message), _UNKNOWN_TAIL))


def _metadata(name: str, namespace: str, uid: str, labels: Mapping[str, str] | None,
              resource_version: str = "") -> bytes:
    """ObjectMeta: name 1, generateName 2, namespace 3, selfLink 4, uid 5, resourceVersion 6, the unset tail, labels
    11 (map entries: key 1, value 2)."""
    tail = _string(6, resource_version) + _META_AFTER_VERSION if resource_version else _META_TAIL
    parts = [_string(1, name), _string(2, ""), _string(3, namespace), _string(4, ""), _string(5, uid), tail]
    if labels:
        parts.extend(_field(11, _string(1, key) + _string(2, labels[key])) for key in sorted(labels))
    return b"".join(parts)


# ObjectReference: kind 1, namespace 2, name 3, uid 4, apiVersion 5, resourceVersion 6, fieldPath 7; of a node,
# all but its name are constants.
_NODE_BEFORE_NAME = _string(1, "Node") + _string(2, "")
_NODE_AFTER_NAME = _string(4, "") + _string(5, "v1") + _string(6, "") + _string(7, "")


def binding(namespace: str, name: str, uid: str, node: str, labels: Mapping[str, str] | None = None, *,
            resource_version: str = "") -> bytes:
    """The body of ``POST .../pods/<name>/binding`` binding the pod (``uid``: refused if the pod was replaced;
    ``resource_version``: refused if the pod changed since that version) to ``node``, with ``labels`` on the
    Binding."""
    target = b"".join((_NODE_BEFORE_NAME, _string(3, node), _NODE_AFTER_NAME))
    # Binding: metadata 1, target 2
    metadata = _metadata(name, namespace, uid, labels, resource_version)
    return _envelope("Binding", _field(1, metadata) + _field(2, target))


_TYPE_FIELDS = {"apiVersion": "v1", "kind": "Event"}
_REFERENCE_NAMES = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
"""ObjectReference's string fields in field-number order (1 to 7)."""
_SOURCE_NAMES = ("component", "host")
"""EventSource's string fields in field-number order (1 and 2)."""
_META_NAMES = ("name", "namespace")
_NAME_SETS: dict[tuple[str, ...], frozenset[str]] = {
    names: frozenset(names) for names in (_REFERENCE_NAMES, _SOURCE_NAMES, _META_NAMES)}
EVENT_KEYS = frozenset(("metadata", "involvedObject", "reason", "message", "source", "firstTimestamp",
                        "lastTimestamp", "count", "type", "action", "reportingComponent", "reportingInstance",
                        *_TYPE_FIELDS))
"""The core/v1 Event fields (JSON names) this module encodes; hoss.kube.events writes no others."""


def _text(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise Unencodable(f"{what}: expected a string, got {value!r}")
    return value


def _strings(what: str, value: Any, names: tuple[str, ...]) -> list[str]:
    """The values of an object of string fields, in the order of ``names``; "" for the ones it leaves out."""
    if not isinstance(value, Mapping):
        raise Unencodable(f"{what}: expected an object, got {value!r}")
    if not value.keys() <= _NAME_SETS[names]:
        extra = next(key for key in value if key not in names)
        raise Unencodable(f"{what}.{extra}: not encoded here ({value[extra]!r})")
    texts = [value.get(key, "") for key in names]
    for key, text in zip(names, texts, strict=True):
        if not isinstance(text, str):
            raise Unencodable(f"{what}.{key}: expected a string, got {text!r}")
    return texts


def _numbered(texts: list[str]) -> bytes:
    """A message of string fields numbered from 1, each written even when empty."""
    return b"".join([_string(number, text) for number, text in enumerate(texts, 1)])


def _time(body: Mapping[str, Any], key: str) -> bytes:
    """meta/v1 Time of ``body[key]``; empty, the zero Time, when ``body`` has no ``key``."""
    if key not in body:
        return b""
    value = body[key]
    encoded = _timestamp(value) if isinstance(value, str) else None
    if encoded is None:
        raise Unencodable(f"{key}: expected a time like 2026-01-02T03:04:05Z, got {value!r}")
    return encoded


@functools.lru_cache(maxsize=16)
def _timestamp(text: str) -> bytes | None:
    """meta/v1 Time of ``text``, an RFC 3339 time in whole seconds as Time marshals to JSON: a Timestamp (seconds 1,
    nanos 2: varints, both written, nanos zero). None when ``text`` is no such time or one before the epoch (not
    encoded here). An event's two timestamps are the same second for many events: each is encoded once."""
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    seconds = int(moment.timestamp())
    return b"\x08" + _varint(seconds) + b"\x10\x00" if seconds >= 0 else None


def event(body: Mapping[str, Any]) -> bytes:
    """The body of ``POST /api/v1/namespaces/<ns>/events`` for a core/v1 Event written as JSON would be (the
    shape of ``hoss.kube.events.pod_event``). A field this module does not encode raises Unencodable naming
    it: the caller posts that event as JSON instead."""
    get = body.get
    if not body.keys() <= EVENT_KEYS:
        raise Unencodable(f"{next(key for key in body if key not in EVENT_KEYS)}: not encoded here")
    for key, expected in _TYPE_FIELDS.items():
        if get(key, expected) != expected:
            raise Unencodable(f"{key}: expected {expected!r}, got {body[key]!r}")
    count = get("count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**31:
        raise Unencodable(f"count: expected a non-negative int32, got {count!r}")
    name, namespace = _strings("metadata", get("metadata", {}), _META_NAMES)
    # Event in field-number order; series 11 and related 13 are pointers in Go, left out when unset.
    message = b"".join((
        _field(1, _metadata(name, namespace, "", None)),
        _field(2, _numbered(_strings("involvedObject", get("involvedObject", {}), _REFERENCE_NAMES))),
        _string(3, _text("reason", get("reason", ""))),
        _string(4, _text("message", get("message", ""))),
        _field(5, _numbered(_strings("source", get("source", {}), _SOURCE_NAMES))),
        _field(6, _time(body, "firstTimestamp")),
        _field(7, _time(body, "lastTimestamp")),
        b"\x40" + _varint(count),
        _string(9, _text("type", get("type", ""))),
        _ZERO_TIME,
        _string(12, _text("action", get("action", ""))),
        _string(14, _text("reportingComponent", get("reportingComponent", ""))),
        _string(15, _text("reportingInstance", get("reportingInstance", ""))),
    ))
    return _envelope("Event", message)
