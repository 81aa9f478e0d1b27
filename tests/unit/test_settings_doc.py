"""docs/settings.md is what the settings models say, and names every service hoss installs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from dev.settings_doc import REGENERATE, SERVICES, render
from hoss.settings import setting_specs

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "settings.md"


def test_the_committed_settings_reference_is_up_to_date() -> None:
    expected = render(SERVICES)
    assert REFERENCE.read_text() == expected, f"docs/settings.md is stale: run `{REGENERATE}` and commit it"


def test_every_setting_of_every_service_has_a_row_with_its_flag_and_env() -> None:
    text = REFERENCE.read_text()
    for command, model in SERVICES.items():
        for spec in setting_specs(model):
            assert f"| `{spec.flag}` | `{spec.env}` |" in text, f"{command}: {spec.name} is missing"


def test_every_service_command_has_its_settings_in_the_reference() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    services = {name for name in scripts if name != "hoss"}  # `hoss` is the operator's CLI, not a service
    assert services == set(SERVICES)
