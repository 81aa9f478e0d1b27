"""Custom plugins through ``hoss.plugins`` entry points, found by importlib.metadata exactly as when pip-installed.

No pip, no network, no change to the venv: each test writes the ``*.dist-info`` directory an install of
tests/plugins_example would create (its entry points read from that package's own pyproject.toml) into a
temporary directory, and puts that directory and the example's source on ``sys.path`` for the test only.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hoss.framework.cycle import Placement, decide
from hoss.framework.errors import ProfileError
from hoss.framework.plugins import ENTRY_POINT_GROUP, load_registry
from hoss.framework.profiles import parse_profiles
from tests.dist_info import install_dist_info
from tests.kube_objects import pod_view, raw_node, table

EXAMPLE = Path(__file__).resolve().parents[1] / "plugins_example"
EXAMPLE_MODULE = "hoss_example_plugin"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary site directory on sys.path; the example package's modules are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in [name for name in sys.modules if name.split(".")[0] == EXAMPLE_MODULE]:
        del sys.modules[module]


@pytest.fixture
def example_installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/plugins_example as an editable install would make it visible."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    install_dist_info(
        site,
        name=project["name"],
        version=project["version"],
        entry_points=project["entry-points"][ENTRY_POINT_GROUP],
    )
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return site


def policies(*scores: dict[str, Any]) -> dict[str, Any]:
    return {
        "defaultProfile": "ssd",
        "profiles": [{"name": "ssd", "filters": [{"name": "NodeResourcesFit"}], "scores": list(scores)}],
    }


def test_example_plugin_is_registered_from_its_entry_point(example_installed: Path) -> None:
    registry = load_registry()

    assert "prefer-label" in registry.scores
    assert "prefer-label" not in registry.filters
    assert registry.origins["prefer-label"] == (
        "entry point prefer-label = hoss_example_plugin:PreferLabel (hoss-example-plugin 0.1.0)"
    )
    assert registry.origins["NodeResourcesFit"] == "built-in"


def test_example_plugin_changes_placement(example_installed: Path) -> None:
    nodes = table(raw_node("emptiest"), raw_node("ssd", labels={"disktype": "ssd"}))
    nodes.set_used("ssd", {"cpu": 16_000})
    spread = {"name": "LeastAllocated", "weight": 1}
    prefer = {"name": "prefer-label", "weight": 5, "args": {"label": "disktype", "value": "ssd"}}
    plain_profiles, _ = parse_profiles(policies(spread))
    ssd_profiles, _ = parse_profiles(policies(spread, prefer))

    plain = decide(plain_profiles["ssd"], pod_view(), nodes, rng=np.random.default_rng(0))
    preferred = decide(ssd_profiles["ssd"], pod_view(), nodes, rng=np.random.default_rng(0))

    assert isinstance(plain, Placement)
    assert isinstance(preferred, Placement)
    assert plain.candidates[0] == "emptiest"
    assert preferred.candidates[0] == "ssd"


def test_plugin_args_are_validated_with_profile_and_field_named(example_installed: Path) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profiles(policies({"name": "prefer-label", "args": {"label": "disktype"}}))

    assert (caught.value.profile, caught.value.plugin, caught.value.field) == (
        "ssd",
        "prefer-label",
        "scores[0].args.value",
    )


def test_without_the_entry_point_the_plugin_is_unknown(site: Path) -> None:
    with pytest.raises(ProfileError, match="known score plugins"):
        parse_profiles(policies({"name": "prefer-label", "args": {"label": "disktype", "value": "ssd"}}))


def test_entry_point_named_like_a_built_in_is_refused_naming_both(
    example_installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = example_installed / "other"
    install_dist_info(
        other, name="sneaky", version="1.0", entry_points={"NodeResourcesFit": "hoss_example_plugin:PreferLabel"}
    )
    monkeypatch.syspath_prepend(str(other))

    with pytest.raises(ProfileError) as caught:
        parse_profiles(policies({"name": "LeastAllocated"}))

    message = str(caught.value)
    assert "entry point NodeResourcesFit = hoss_example_plugin:PreferLabel (sneaky 1.0)" in message
    assert "clashes with the built-in plugin NodeResourcesFit" in message


def test_same_name_from_two_distributions_is_refused_naming_both(example_installed: Path) -> None:
    install_dist_info(
        example_installed,
        name="copycat",
        version="2.0",
        entry_points={"prefer-label": "hoss_example_plugin:PreferLabel"},
    )

    with pytest.raises(
        ProfileError, match=r"clashes with entry point prefer-label = .*\((hoss-example-plugin|copycat)"
    ):
        load_registry()


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("hoss_missing_module:Plugin", "fails to load: ModuleNotFoundError"),
        ("hoss_example_plugin:PreferLabelArgs", "is not a plugin: its name attribute is None"),
    ],
)
def test_broken_entry_point_is_a_profile_error_naming_it(example_installed: Path, target: str, reason: str) -> None:
    install_dist_info(example_installed, name="broken", version="0.0.1", entry_points={"broken-one": target})

    with pytest.raises(ProfileError, match=reason) as caught:
        load_registry(source="policies.yaml")

    assert caught.value.plugin == "broken-one"
    assert f"entry point broken-one = {target} (broken 0.0.1)" in str(caught.value)
