"""The README stays true: every setting of every service is documented there."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from dispatcher.settings import DispatcherSettings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("model", [ResolverSettings, DispatcherSettings, WorkerSettings])
def test_every_setting_is_in_the_readme_with_its_flag_and_env(model: type[BaseModel]) -> None:
    for name in model.model_fields:
        assert f"`--{name.replace('_', '-')}`" in README, name
        assert f"`HOSS_{name.upper()}`" in README, name


def test_readme_shows_the_two_commands() -> None:
    assert "make demo" in README
    assert "make test" in README
