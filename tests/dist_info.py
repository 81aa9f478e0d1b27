"""A distribution as pip installs it, without pip: for tests of plugins found through entry points."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hoss.framework.plugins import ENTRY_POINT_GROUP


def install_dist_info(site: Path, *, name: str, version: str, entry_points: Mapping[str, str]) -> None:
    """What pip leaves in site-packages for a distribution: METADATA and entry_points.txt (the ``hoss.plugins``
    group) in a dist-info."""
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = "".join(f"{entry} = {target}\n" for entry, target in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}", encoding="utf-8")
