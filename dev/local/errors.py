"""The local plane's error: raised when a part cannot start or the plane is not in the state asked for."""

from __future__ import annotations


class PlaneError(RuntimeError):
    """The local plane cannot start or is not in the state asked for; the message names the part and its log."""
