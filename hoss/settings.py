"""Settings for the hoss services: one pydantic model per service, filled from a YAML file, env and flags.

Precedence, lowest to highest: field defaults, the YAML file (``--config`` or ``$HOSS_CONFIG``), environment
variables ``HOSS_<FIELD>``, command-line flags ``--<field-name>``. Every field's docstring (its ``description``)
is the flag's help. A bad value stops start-up with a message naming the field, the value and the source.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
import sys
import typing
import urllib.parse
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import uvloop
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from hoss.errors import HossError

S = TypeVar("S", bound=BaseModel)
T = TypeVar("T")


class SettingsError(HossError):
    """A setting is missing or invalid; the message names the field, the value and where it came from."""


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def run_service(
    model: type[S], argv: Sequence[str] | None, *, prog: str, description: str,
    serve: Callable[[S], Coroutine[Any, Any, int]],
) -> int:
    """A component's entry point: its settings from flags, env and YAML (exit code 2 and the message on stderr when
    they are bad), logging at the settings' ``log_level``, then ``serve`` until it returns its exit code."""
    try:
        settings = load_settings(model, argv, prog=prog, description=description)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(settings, "log_level", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_loop(serve(settings))


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine on uvloop: its transports, TLS included, and its scheduling of callbacks are
    compiled, which takes a good share of the CPU a service spends per pod (the webhook's connections, the workers'
    bindings and Redis calls) off the two cores the apiserver needs."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def load_settings(model: type[S], argv: Sequence[str] | None, *, prog: str, description: str) -> S:
    """Parse flags, env and YAML into ``model``; raise SettingsError with a readable message on bad input."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML file with settings (env HOSS_CONFIG)")
    for name, field in model.model_fields.items():
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = f"default {field.default_factory()!r}"  # type: ignore[call-arg]
        else:
            default = f"default {field.default!r}"
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest=name,
            default=None,
            metavar="VALUE",
            help=f"{field.description or ''} (env HOSS_{name.upper()}; {default})",
        )
    args = parser.parse_args(argv)

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    config_path = args.config or os.environ.get("HOSS_CONFIG")
    if config_path:
        try:
            loaded = yaml.safe_load(Path(config_path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise SettingsError(f"cannot read settings file {config_path}: {error}") from error
        if not isinstance(loaded, dict):
            raise SettingsError(f"settings file {config_path} must hold a mapping, not {type(loaded).__name__}")
        for key, value in loaded.items():
            values[str(key).replace("-", "_")] = value
            sources[str(key).replace("-", "_")] = f"file {config_path}"
    for name, field in model.model_fields.items():
        raw: str | None = os.environ.get(f"HOSS_{name.upper()}")
        source = f"env HOSS_{name.upper()}"
        if getattr(args, name) is not None:
            raw, source = getattr(args, name), f"flag --{name.replace('_', '-')}"
        if raw is None:
            continue
        values[name] = [part.strip() for part in raw.split(",") if part.strip()] if _is_list(field.annotation) else raw
        sources[name] = source
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
    return f"{socket.gethostname()}-{os.getpid()}"


class AccessSettings(BaseModel):
    """Who may read a component's /status and /metrics: the same three settings on every hoss component
    (hoss.kube.access)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

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


def check_lease_timing(renew_interval: float, renew_deadline: float, lease_duration: float) -> None:
    """A leader must try to renew before it gives up, and give up before another replica may take over."""
    if not renew_interval < renew_deadline < lease_duration:
        raise ValueError(
            "lease timing must satisfy renew_interval_seconds < renew_deadline_seconds < lease_duration_seconds"
            f" (got {renew_interval} < {renew_deadline} < {lease_duration})"
        )
