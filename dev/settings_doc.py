"""docs/settings.md, the settings reference, rendered from the services' settings models.

``python -m dev.settings_doc > docs/settings.md`` (``make settings-doc``) writes it; tests/unit/test_settings_doc.py
fails when the committed file differs from what the models say. The settings every service shares (the classes in
hoss.settings) are listed once, then each service's own.

A development tool: it imports the four services' models, which nothing an operator installs may do all at once.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping, Sequence

from dispatcher.settings import DispatcherSettings
from hoss.settings import CONFIG_ENV, ENV_PREFIX, AccessSettings, HossSettings, SettingSpec, setting_specs
from rescheduler.settings import ReschedulerSettings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

SERVICES: Mapping[str, type[HossSettings]] = {
    "hoss-resolver": ResolverSettings,
    "hoss-dispatcher": DispatcherSettings,
    "hoss-worker": WorkerSettings,
    "hoss-rescheduler": ReschedulerSettings,
}
"""Each service's command and its settings model."""

SHARED: Sequence[tuple[str, type[HossSettings]]] = (
    ("Logging", HossSettings),
    ("Who may read /status and /metrics", AccessSettings),
)
"""The settings every service has, by the class that declares them, each with its section's title."""

REGENERATE = "make settings-doc"

INTRO = """
Each service takes its settings from a YAML file (`--config FILE` or `{config_env}`), from environment variables
`{env_prefix}<NAME>` and from flags `--<name>`, in increasing order of precedence: default < file < env < flag. In
the file a setting is written by its name (`redis_url: ...`); a list is a YAML list there and comma-separated in env
and flags. A bad value stops the service at start-up with a message naming the setting, the value and where it came
from. `--help` lists a service's settings.
"""


def _cell(text: str) -> str:
    # '|' would end the cell, and '<component>' would be read as an HTML tag and vanish.
    return text.replace("|", "\\|").replace("<", "\\<")


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"  # GitHub's tables unescape '\|' in code too


def _table(specs: Sequence[SettingSpec]) -> list[str]:
    lines = ["| flag | env | type | default | meaning |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {_code(spec.flag)} | {_code(spec.env)} | {_cell(spec.type)} | {_code(spec.default)} | "
              f"{_cell(spec.description)} |" for spec in specs]
    return lines


def _summary(model: type[HossSettings]) -> str:
    return " ".join((inspect.getdoc(model) or "").split())


def render(services: Mapping[str, type[HossSettings]]) -> str:
    """The settings reference of ``services`` (command -> settings model) as Markdown."""
    for command, model in services.items():
        missing = [shared.__name__ for _title, shared in SHARED if not issubclass(model, shared)]
        if missing:
            raise TypeError(f"{command}: {model.__name__} lacks the shared settings of {', '.join(missing)}")
    lines = [
        "# Settings",
        "",
        f"<!-- Generated from the settings models by `{REGENERATE}` (python -m dev.settings_doc); do not edit. -->",
        "",
        INTRO.format(config_env=CONFIG_ENV, env_prefix=ENV_PREFIX).strip(),
        "",
        "## Every service",
        "",
        f"`{'`, `'.join(services)}` all take these.",
    ]
    shown: set[str] = set()
    for title, model in SHARED:
        specs = [spec for spec in setting_specs(model) if spec.name not in shown]
        shown |= {spec.name for spec in specs}
        lines += ["", f"### {title}", "", _summary(model), "", *_table(specs)]
    for command, model in services.items():
        own = [spec for spec in setting_specs(model) if spec.name not in shown]
        lines += ["", f"## `{command}`", "", _summary(model), "", *_table(own)]
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(render(SERVICES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
