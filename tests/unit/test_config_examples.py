"""The example settings files in configs/ load as they are, each setting known to its service."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.settings import DispatcherSettings
from hoss.settings import HossSettings, load_settings
from resolver.settings import ResolverSettings
from workers.settings import WorkerSettings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(("name", "model"), [("resolver.yaml", ResolverSettings),
                                              ("dispatcher.yaml", DispatcherSettings),
                                              ("worker.yaml", WorkerSettings)])
def test_example_settings_file_loads(name: str, model: type[HossSettings], monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [v for v in os.environ if v.startswith("HOSS_")]:
        monkeypatch.delenv(variable)
    settings = load_settings(model, ["--config", str(CONFIGS / name)], prog=name, description="")
    assert settings.model_dump()["redis_url"].startswith("redis://hoss-redis.")
    assert settings.model_dump()["log_level"] == "INFO"
