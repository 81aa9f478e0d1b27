"""The DRA CEL environment: a DeviceClass's or a request's selector evaluated against one device, as kube-scheduler
evaluates it (k8s.io/dynamic-resource-allocation/cel), over cel-python (celpy; docs/decisions/0013-cel-python.md).

The device is ``device.driver``, ``device.allowMultipleAllocations``, ``device.attributes[domain][name]`` and
``device.capacity[domain][name]``; a name without a domain is the driver's. An unknown domain reads as an empty map, so
``device.attributes["other.domain"].model`` is a runtime error (``no such key: model``), as in Kubernetes; ``has()``
and ``in`` are the guarded forms. Attribute values are CEL ints, bools, strings and semvers; capacities are
quantities. Kubernetes' quantity library (``quantity``, ``isQuantity``, ``sign``, ``isInteger``, ``asInteger``,
``asApproximateFloat``, ``add``, ``sub``, ``compareTo``, ``isGreaterThan``, ``isLessThan``) and semver library
(``semver``, ``isSemver``, ``major``, ``minor``, ``patch``, ``compareTo``, ``isGreaterThan``, ``isLessThan``) are
offered, plus celpy's standard functions (``size``, ``matches``, ``startsWith``, ...).

Pure: compiling and evaluating touch nothing outside. Compiled programs are cached by expression (bounded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
import semver
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError

from hoss.errors import HossError
from hoss.model.resources import parse_quantity


class CelError(HossError, ValueError):
    """A selector that does not compile or fails at run time; `message` is the error's text."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class Quantity:
    """A Kubernetes resource.Quantity as a CEL value: exact, compared by value (``1Gi == 1024Mi``)."""

    __slots__ = ("value",)

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.value})"


class Semver:
    """A semantic version (semver 2.0, strict) as a CEL value; equal when precedence is equal."""

    __slots__ = ("version",)

    def __init__(self, version: semver.Version) -> None:
        self.version = version

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.version.compare(other.version) == 0

    def __hash__(self) -> int:
        return hash(self.version.finalize_version())

    def __repr__(self) -> str:
        return f"Semver({self.version})"


def parse_signed_quantity(text: str) -> Fraction:
    """A quantity string that may be negative (CEL's ``quantity("-1")``); raises CelError when unreadable."""
    negative = text.startswith("-")
    try:
        amount = parse_quantity(text[1:] if negative else text, field="quantity")
    except ValueError as error:
        raise CelError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': "
                       f"{text!r}") from error
    return -amount if negative else amount


def parse_semver(text: str, *, normalize: bool = False) -> semver.Version:
    """A strict semver (blang/semver's Parse); with `normalize`, a leading ``v``, missing minor or patch and leading
    zeros are forgiven as Kubernetes' ``semver(s, true)`` does."""
    if normalize:
        parts = text.removeprefix("v").split(".", 2)
        parts = [part.lstrip("0") or "0" if part[:1].isdigit() and len(part) > 1 else part for part in parts]
        parts += ["0"] * (3 - len(parts))
        text = ".".join(parts)
    return semver.Version.parse(text)


def _quantity(value: Any) -> Quantity:
    if not isinstance(value, str):
        raise CelError(f"no such overload: quantity({type(value).__name__})")
    return Quantity(parse_signed_quantity(value))


def _is_quantity(value: Any) -> celtypes.BoolType:
    try:
        parse_signed_quantity(str(value))
    except CelError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _semver(value: Any, normalize: Any = False) -> Semver:
    try:
        return Semver(parse_semver(str(value), normalize=bool(normalize)))
    except ValueError as error:
        raise CelError(str(error)) from error


def _is_semver(value: Any, normalize: Any = False) -> celtypes.BoolType:
    try:
        parse_semver(str(value), normalize=bool(normalize))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _both(name: str, a: Any, b: Any) -> tuple[Any, Any]:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.value, b.value
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.version, b.version
    raise CelError(f"no such overload: {name}")


def _compare(a: Any, b: Any) -> int:
    left, right = _both("compareTo", a, b)
    if isinstance(left, semver.Version):
        return int(left.compare(right))
    return int(left > right) - int(left < right)


def _compare_to(a: Any, b: Any) -> celtypes.IntType:
    return celtypes.IntType(_compare(a, b))


def _is_greater_than(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_compare(a, b) == 1)


def _is_less_than(a: Any, b: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_compare(a, b) == -1)


def _of_quantity(name: str, value: Any) -> Fraction:
    if not isinstance(value, Quantity):
        raise CelError(f"no such overload: {name}")
    return value.value


_INT64 = 2**63


def _is_integer(value: Any) -> celtypes.BoolType:
    amount = _of_quantity("isInteger", value)
    return celtypes.BoolType(amount.denominator == 1 and -_INT64 <= amount < _INT64)


def _as_integer(value: Any) -> celtypes.IntType:
    amount = _of_quantity("asInteger", value)
    if amount.denominator != 1 or not -_INT64 <= amount < _INT64:
        raise CelError("cannot convert value to integer")
    return celtypes.IntType(int(amount))


def _as_float(value: Any) -> celtypes.DoubleType:
    return celtypes.DoubleType(float(_of_quantity("asApproximateFloat", value)))


def _sign(value: Any) -> celtypes.IntType:
    amount = _of_quantity("sign", value)
    return celtypes.IntType((amount > 0) - (amount < 0))


def _addend(name: str, value: Any) -> Fraction:
    if isinstance(value, Quantity):
        return value.value
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(int(value))
    raise CelError(f"no such overload: {name}")


def _add(a: Any, b: Any) -> Quantity:
    return Quantity(_of_quantity("add", a) + _addend("add", b))


def _sub(a: Any, b: Any) -> Quantity:
    return Quantity(_of_quantity("sub", a) - _addend("sub", b))


def _version_part(part: str) -> Callable[[Any], celtypes.IntType]:
    def read(value: Any) -> celtypes.IntType:
        if not isinstance(value, Semver):
            raise CelError(f"no such overload: {part}")
        return celtypes.IntType(getattr(value.version, part))
    return read


def _guarded(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function as celpy calls it: its CelError becomes a CEL error value, which ``&&`` and ``||`` may absorb
    as cel-go's do."""
    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except CelError as error:
            return CELEvalError(error.message, CelError, None)
    return call


_LIBRARY: dict[str, Callable[..., Any]] = {
    "quantity": _quantity, "isQuantity": _is_quantity, "sign": _sign, "isInteger": _is_integer,
    "asInteger": _as_integer, "asApproximateFloat": _as_float, "add": _add, "sub": _sub,
    "compareTo": _compare_to, "isGreaterThan": _is_greater_than, "isLessThan": _is_less_than,
    "semver": _semver, "isSemver": _is_semver,
    "major": _version_part("major"), "minor": _version_part("minor"), "patch": _version_part("patch"),
}
_FUNCTIONS = {name: _guarded(function) for name, function in _LIBRARY.items()}


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: a domain the device has nothing in reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


AttributeValue = int | bool | str | semver.Version
"""One device attribute's value as the inventory keeps it: int, bool, string or version."""


@dataclass(frozen=True)
class CelDevice:
    """What a selector sees of a device: its driver and its attributes and capacities by (domain, name)."""

    driver: str
    attributes: Mapping[tuple[str, str], AttributeValue]
    capacity: Mapping[tuple[str, str], Fraction]
    allow_multiple_allocations: bool = False

    @functools.cached_property
    def key(self) -> Hashable:
        """Equal for two devices every selector sees alike."""
        return (self.driver, self.allow_multiple_allocations,
                frozenset((name, type(value).__name__, value) for name, value in self.attributes.items()),
                frozenset(self.capacity.items()))


def _cel_value(value: AttributeValue) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return Semver(value)


def _activation(device: CelDevice) -> dict[str, Any]:
    attributes: dict[Any, dict[Any, Any]] = {}
    for (domain, name), value in device.attributes.items():
        attributes.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(name)] = _cel_value(value)
    capacity: dict[Any, dict[Any, Any]] = {}
    for (domain, name), amount in device.capacity.items():
        capacity.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(name)] = Quantity(amount)
    return {"device": celtypes.MapType({
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.allow_multiple_allocations),
        celtypes.StringType("attributes"): _Domains({k: celtypes.MapType(v) for k, v in attributes.items()}),
        celtypes.StringType("capacity"): _Domains({k: celtypes.MapType(v) for k, v in capacity.items()}),
    })}


_ENVIRONMENT = celpy.Environment()


@functools.lru_cache(maxsize=1024)
def compile_selector(expression: str) -> celpy.Runner:
    """The program for one selector expression; raises CelError naming the parse error."""
    try:
        return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression), functions=_FUNCTIONS)
    except CELParseError as error:
        raise CelError(f"compilation failed: {' '.join(str(error).split())}") from error


def _runtime_message(error: BaseException) -> str:
    """cel-go's wording for the usual runtime errors (a missing key above all), celpy's text otherwise."""
    if isinstance(error, CelError):
        return error.message
    args = error.args
    if len(args) >= 2 and args[1] is KeyError and isinstance(args[0], str):
        text = args[0]
        for prefix in ("no such member in mapping: ", "no such key: "):
            if text.startswith(prefix):
                return "no such key: " + text.removeprefix(prefix).strip("'")
        if text.startswith("undeclared reference to "):
            return text.split(" (in activation", 1)[0]
    if args and isinstance(args[0], str):
        return args[0]
    return str(error)


# Selector results by (expression, device key): a selector's result depends on nothing else, and celpy takes about
# a millisecond per evaluation, so each class's selectors are evaluated once per device, not once per pod and node.
# Bounded: cleared when full.
_RESULTS: dict[tuple[str, Hashable], bool | str] = {}
"""True, False, or the error's message"""
_RESULTS_MAX = 65536


def device_matches(expression: str, device: CelDevice) -> bool:
    """Whether the selector holds for the device. Raises CelError (``compilation failed: ...``, or the runtime
    error's text, e.g. ``no such key: model``) where kube-scheduler's CEL fails."""
    key = (expression, device.key)
    result = _RESULTS.get(key)
    if result is None:
        try:
            result = _evaluate(expression, device)
        except CelError as error:
            result = error.message
        if len(_RESULTS) >= _RESULTS_MAX:
            _RESULTS.clear()
        _RESULTS[key] = result
    if isinstance(result, str):
        raise CelError(result)
    return result


def _evaluate(expression: str, device: CelDevice) -> bool:
    program = compile_selector(expression)
    try:
        result = program.evaluate(_activation(device))
    except CelError:
        raise
    except CELEvalError as error:
        raise CelError(_runtime_message(error)) from error
    except (TypeError, ValueError, ArithmeticError, KeyError) as error:
        raise CelError(str(error)) from error
    if isinstance(result, CELEvalError):
        raise CelError(_runtime_message(result))
    if not isinstance(result, celtypes.BoolType):
        raise CelError(f"CEL result of type {type(result).__name__} could not be converted to bool")
    return bool(result)
