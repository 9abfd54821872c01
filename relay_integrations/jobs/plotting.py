"""matplotlib, on demand: the ``plot`` extra, drawn off-screen (``Agg``) for files."""

from __future__ import annotations

from typing import Any

from ..upstream.errors import RelayError


def pyplot() -> Any:
    """``matplotlib.pyplot`` set to draw into files, or an error that says how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RelayError(
            "the plot needs matplotlib: pip install 'relay-integrations[plot]'"
        ) from None
    return plt
