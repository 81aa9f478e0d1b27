"""The benchmark's progress line on stderr."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """One line on stderr: the step, a bar and a count."""

    def __init__(self) -> None:
        self.step = ""
        self.started = time.monotonic()

    def __call__(self, step: str, done: int, total: int) -> None:
        if step and step != self.step:
            if self.step:
                print(file=sys.stderr)
            self.step = step
        width = 30
        filled = int(width * done / total) if total else 0
        elapsed = time.monotonic() - self.started
        print(f"\r[{elapsed:6.0f}s] {self.step:<62} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr)
