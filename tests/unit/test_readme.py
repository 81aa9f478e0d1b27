"""The README stays true: every setting of every service is documented there."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import BaseModel

from deploy.cli import build_parser
from dispatcher.settings import DispatcherSettings
from rescheduler.settings import ReschedulerSettings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("model", [ResolverSettings, DispatcherSettings, WorkerSettings, ReschedulerSettings])
def test_every_setting_is_in_the_readme_with_its_flag_and_env(model: type[BaseModel]) -> None:
    for name in model.model_fields:
        assert f"`--{name.replace('_', '-')}`" in README, name
        assert f"`HOSS_{name.upper()}`" in README, name


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README
    assert "make test" in README


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(command, option) for every option of every subcommand of the `hoss` CLI."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, (*path, name))
        else:
            found += [(" ".join(path), option) for option in action.option_strings if option.startswith("--")
                      and option != "--help"]
    return found


def test_every_cli_command_and_option_is_in_the_readme() -> None:
    options = _options(build_parser())
    assert len(options) > 20
    for command, option in options:
        assert f"`hoss {command}`" in README, command
        row = next(line for line in README.splitlines() if line.startswith(f"| `hoss {command}` |"))
        assert f"`{option}" in row, (command, option)
