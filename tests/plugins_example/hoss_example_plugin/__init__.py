"""prefer-label: an example hoss score plugin that prefers nodes whose label has a configured value.

In policies.yaml::

    scores:
      - name: prefer-label
        weight: 5
        args: {label: disktype, value: ssd}

Nodes with ``disktype=ssd`` score 100, all others 0. Announced to hoss by the entry point in this package's
pyproject.toml (group ``hoss.plugins``); the interface is documented in ``hoss/framework/plugins/__init__.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from hoss.framework.nodes import NodeTable
from hoss.framework.pod import PodView


class PreferLabelArgs(BaseModel):
    """The plugin's args."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str = Field(min_length=1)
    """The node label to look at."""
    value: str
    """The value that earns a node the full score."""


class PreferLabel:
    """Score: 100 on nodes whose `label` is `value`, 0 elsewhere."""

    name = "prefer-label"

    def __init__(self, args: PreferLabelArgs) -> None:
        self.args = args

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> Self:
        return cls(PreferLabelArgs.model_validate(args))

    def score(self, pod: PodView, nodes: NodeTable, feasible: NDArray[np.bool_]) -> NDArray[np.float64]:
        # Compare the per-row label codes with the wanted value's code: one vectorised pass, no loop over nodes.
        code = nodes.label_code(self.args.label, self.args.value)
        if code is None:
            return np.zeros(len(nodes), dtype=np.float64)
        return np.where(nodes.label_codes(self.args.label) == code, 100.0, 0.0)

    def normalize(self, scores: NDArray[np.float64], feasible: NDArray[np.bool_]) -> NDArray[np.float64]:
        # The scores already are 0 or 100; min-max scaling would turn "all equal" into "all 100" anyway.
        return np.where(feasible, scores, 0.0)
