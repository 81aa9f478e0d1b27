"""The README stays true: the two commands, and every command and option of `hoss` and of `python -m dev` in a
table. Settings are documented in docs/settings.md, which has a staleness test of its own."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from deploy.cli import build_parser as operator_parser
from dev.cli import build_parser as dev_parser

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README
    assert "make test" in README


def test_readme_points_to_the_settings_reference() -> None:
    assert "(docs/settings.md)" in README


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, str | None]]:
    """(command, option) for every option of every subcommand; (command, None) for a command without options."""
    found: list[tuple[str, str | None]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, (*path, name)) or [(" ".join((*path, name)), None)]
        elif path:
            found += [(" ".join(path), option) for option in action.option_strings if option.startswith("--")
                      and option != "--help"]
    return found


@pytest.mark.parametrize(("program", "parser"), [("hoss", operator_parser), ("python -m dev", dev_parser)])
def test_every_command_and_option_is_in_a_readme_table(
    program: str, parser: Callable[[], argparse.ArgumentParser]
) -> None:
    options = _options(parser())
    assert len({command for command, _option in options}) >= 4
    for command, option in options:
        rows = [line for line in README.splitlines() if line.startswith(f"| `{program} {command}` |")]
        assert rows, f"no row for `{program} {command}` in the README's table"
        if option is not None:
            assert f"`{option}" in rows[0], (command, option)
