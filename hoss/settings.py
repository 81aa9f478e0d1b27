"""Settings for the hoss services: one pydantic-settings model per service, filled from a YAML file, env and flags.

Precedence, lowest to highest: field defaults, the YAML file (``--config`` or ``$HOSS_CONFIG``), environment
variables ``HOSS_<FIELD>``, command-line flags ``--<field-name>``; a list setting is comma-separated in env and
flags. A field's docstring is its flag's help and its row in docs/settings.md (hoss.settings_doc). A bad value stops
start-up with a message naming the field, the value and the source.

pydantic-settings reads the environment (its env source, prefix ``HOSS_``) and the YAML file (its YAML source).
The flags are a thin argparse layer over the same fields: pydantic-settings' CLI reads values its own way (``null``
as unset, JSON lists, a repeated flag as a list), which would change what the existing flags mean. `load_settings`
stacks the three layers itself so that an error can name the layer a bad value came from. A model built in code (a
test, ``hoss reschedule``) reads nothing from outside: it is its arguments and its defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import sys
import typing
import urllib.parse
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import pydantic_settings
import uvloop
import yaml
from pydantic import AfterValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from hoss.errors import HossError
from hoss.logs import LogFormat, LogLevel, configure_logging

T = TypeVar("T")

ENV_PREFIX = "HOSS_"
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
"""The environment variable naming the YAML settings file when ``--config`` is not given."""


class SettingsError(HossError):
    """A setting is missing or invalid; the message names the field, the value and where it came from."""


class HossSettings(BaseSettings):
    """What every hoss service has: its logging."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        use_attribute_docstrings=True,
        # pydantic-settings validates defaults; a default_factory's value (hostname-pid) never was, and a long
        # hostname must not stop a service that names itself with a flag anyway.
        validate_default=False,
    )

    log_level: LogLevel = "INFO"
    """Logging level."""
    log_format: LogFormat = "text"
    """How log lines are written to stderr: 'text' (time, level, logger: message) or 'json' (one object a line
    with time, level, logger, message and, for an error, exception)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Built in code, a model is its arguments: the outside world comes in through load_settings alone, which
        # can then say where each value came from.
        return (init_settings,)


S = TypeVar("S", bound=HossSettings)


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def comma_list(raw: str) -> list[str]:
    """A list setting as env and flags write it: ``a, b,c`` is ``["a", "b", "c"]``; empty parts are dropped."""
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_name(model: type[BaseSettings], name: str) -> str:
    """The environment variable of setting ``name``."""
    return f"{model.model_config.get('env_prefix', '')}{name.upper()}"


def flag_name(name: str) -> str:
    """The command-line flag of setting ``name``."""
    return f"--{name.replace('_', '-')}"


def _default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is default_identity:
        return "hostname-pid"  # differs per process: named, not computed
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "empty"
    return str(value)


def _type_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(str(arg) for arg in args)
    if origin is list:
        return f"list of {_type_text(args[0])}, comma-separated"
    if args and type(None) in args:
        others = [arg for arg in args if arg is not type(None)]
        return " or ".join(_type_text(arg) for arg in others) + " or unset"
    return getattr(annotation, "__name__", str(annotation))


@dataclass(frozen=True)
class SettingSpec:
    """One setting as a user meets it: its flag, its environment variable, its type, default and meaning."""

    name: str
    flag: str
    env: str
    type: str
    default: str
    description: str


def setting_specs(model: type[BaseSettings]) -> list[SettingSpec]:
    """Every setting of ``model``, in the order of its fields (a base class's first)."""
    return [
        SettingSpec(name=name, flag=flag_name(name), env=env_name(model, name), type=_type_text(field.annotation),
                    default=_default_text(field), description=" ".join((field.description or "").split()))
        for name, field in model.model_fields.items()
    ]


def run_service(
    model: type[S], argv: Sequence[str] | None, *, prog: str, description: str,
    serve: Callable[[S], Coroutine[Any, Any, int]],
) -> int:
    """A component's entry point: its settings from flags, env and YAML (exit code 2 and the message on stderr when
    they are bad), logging as the settings say (`hoss.logs.configure_logging`), then ``serve`` until it returns its
    exit code."""
    try:
        settings = load_settings(model, argv, prog=prog, description=description)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    return run_loop(serve(settings))


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine on uvloop: its transports, TLS included, and its scheduling of callbacks are
    compiled, which takes a good share of the CPU a service spends per pod (the webhook's connections, the workers'
    bindings and Redis calls) off the two cores the apiserver needs."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, with list settings comma-separated (``a,b``) instead of JSON."""

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool) -> Any:
        if isinstance(value, str) and _is_list(field.annotation):
            return comma_list(value)
        return super().prepare_field_value(field_name, field, value, value_is_complex)


class _YamlSource(YamlConfigSettingsSource):
    """pydantic-settings' YAML source, holding a mapping of setting names written with ``_`` or ``-``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        loaded: object = super()._read_file(file_path)
        if not isinstance(loaded, dict):
            raise SettingsError(f"settings file {file_path} must hold a mapping, not {type(loaded).__name__}")
        return {str(key).replace("-", "_"): value for key, value in loaded.items()}


Layer = dict[str, tuple[Any, str]]
"""Setting name -> its value and where it came from (e.g. ``flag --port``)."""


def _file_layer(model: type[BaseSettings], path: str) -> Layer:
    try:
        with open(path, "rb"):  # pydantic-settings passes over a missing file; one that was named must be there
            pass
        found = _YamlSource(model, yaml_file=Path(path))()
    except (OSError, yaml.YAMLError) as error:
        raise SettingsError(f"cannot read settings file {path}: {error}") from error
    return {name: (value, f"file {path}") for name, value in found.items()}


def _env_layer(model: type[BaseSettings]) -> Layer:
    try:
        found = _EnvSource(model)()
    except pydantic_settings.SettingsError as error:
        raise SettingsError(f"{error}: {error.__cause__}") from error
    return {name: (value, f"env {env_name(model, name)}") for name, value in found.items()}


def _flag_parser(specs: Sequence[SettingSpec], *, prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help=f"YAML file with settings (env {CONFIG_ENV})")
    for spec in specs:
        parser.add_argument(spec.flag, dest=spec.name, default=None, metavar="VALUE",
                            help=f"{spec.description} (env {spec.env}; default {spec.default})")
    return parser


def _flag_layer(model: type[BaseSettings], args: argparse.Namespace) -> Layer:
    layer: Layer = {}
    for name, field in model.model_fields.items():
        raw: str | None = getattr(args, name)
        if raw is not None:
            layer[name] = (comma_list(raw) if _is_list(field.annotation) else raw, f"flag {flag_name(name)}")
    return layer


def load_settings(model: type[S], argv: Sequence[str] | None, *, prog: str, description: str) -> S:
    """Parse flags, env and YAML into ``model``; raise SettingsError with a readable message on bad input."""
    args = _flag_parser(setting_specs(model), prog=prog, description=description).parse_args(argv)
    config_path: str | None = args.config or os.environ.get(CONFIG_ENV)
    layers = [_file_layer(model, config_path)] if config_path else []
    layers += [_env_layer(model), _flag_layer(model, args)]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:  # lowest precedence first
        for name, (value, source) in layer.items():
            values[name], sources[name] = value, source
    try:
        return model.model_validate(values)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field_name = ".".join(str(part) for part in item["loc"]) or "settings"
            top = str(item["loc"][0]) if item["loc"] else ""
            given = f" {redacted(repr(item['input']))}" if "input" in item and top in values else ""
            origin = f" (from {sources[top]})" if top in sources else ""
            problems.append(f"{field_name}{given}{origin}: {redacted(item['msg'])}")
        raise SettingsError(f"{prog}: invalid settings: " + "; ".join(problems)) from error


_TLS_FILE_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@/]*@")


def redacted(text: str) -> str:
    """``text`` with the password of any URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", text)


def check_redis_url(url: str) -> str:
    """A Redis URL as redis-py reads it: ``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS; query
    options ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``) or ``unix://``. The TLS
    files must be readable; they are only allowed with rediss://."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"scheme must be redis://, rediss:// (TLS) or unix://, not {parts.scheme + '://'!r}")
    options = urllib.parse.parse_qs(parts.query)
    for option in _TLS_FILE_OPTIONS:
        for path in options.get(option, []):
            if parts.scheme != "rediss":
                raise ValueError(f"{option} needs a rediss:// URL (TLS)")
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                raise ValueError(f"{option}={path}: {error.strerror or error}") from error
    return url


RedisURL = Annotated[str, AfterValidator(check_redis_url)]
"""A Redis URL setting, checked by `check_redis_url`."""


def default_identity() -> str:
    """A replica's default name: ``<hostname>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


class AccessSettings(HossSettings):
    """Who may read a component's /status and /metrics: the same three settings on every hoss component
    (hoss.kube.access)."""

    access: Literal["open", "kubernetes"] = "open"
    """Who may read /status and /metrics: 'open' (anyone who reaches host:port), or 'kubernetes': a bearer token
    the apiserver accepts (TokenReview) whose user may get <component>/status (<component>/metrics) in API group
    hoss.io, where <component> is dispatchers, resolvers, workers or reschedulers, in access_namespace
    (SubjectAccessReview; the ClusterRole hoss-viewer grants it); 401/403 otherwise. Health probes, the resolver's
    review paths (the apiserver's client certificate guards them) and the dispatcher's dashboard files stay open."""
    access_namespace: str = Field(default="hoss-system", min_length=1)
    """Namespace of the SubjectAccessReview (access 'kubernetes'): hoss-viewer bound there by a RoleBinding, or
    cluster-wide by a ClusterRoleBinding, lets a user read."""
    access_cache_seconds: float = Field(default=10.0, gt=0)
    """How long a token's review is remembered (access 'kubernetes')."""
    access_reviews_per_second: float = Field(default=5.0, gt=0)
    """How many tokens never accepted before are reviewed a second (TokenReview), a burst of 4 seconds' worth
    (access 'kubernetes'); beyond, 429 without a review. Tokens accepted before are reviewed whatever the rate."""


def check_lease_timing(renew_interval: float, renew_deadline: float, lease_duration: float) -> None:
    """A leader must try to renew before it gives up, and give up before another replica may take over."""
    if not renew_interval < renew_deadline < lease_duration:
        raise ValueError(
            "lease timing must satisfy renew_interval_seconds < renew_deadline_seconds < lease_duration_seconds"
            f" (got {renew_interval} < {renew_deadline} < {lease_duration})"
        )
