"""The parameters of one run, as the command line sets them."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

CONCURRENCY = 200
"""Streams at once in a load round, by default."""


class Settings(BaseModel):
    """What one run of the benchmark does."""

    concurrency: int = CONCURRENCY
    """Streams at once in a load round."""
    rounds: int = 3
    """Load rounds per path."""
    token_delay: float = 0.002
    """Seconds per token of the scripted upstream."""
    sequential: int = 20
    """Single requests each way, one after the other, before the load."""
    endpoint_concurrency: int
    """The relay's ``max_concurrency`` per endpoint."""
    timeout: float = 300.0
    """The clients' timeout, seconds."""
    keepalive_expiry: float = 5.0
    """Seconds the clients keep an idle connection."""
    workers: list[int] | None = None
    """Worker counts to compare (``--workers 1,2,4``: relaygen serve --workers N for each N,
    instead of the server-against-core run)."""
    quick: bool = False
    """Whether ``--quick`` set the defaults of `concurrency` and `rounds`."""
    json_path: Path | None = None
    """Where to write all figures and samples."""


QUICK = {"concurrency": 50, "rounds": 2}
"""The defaults ``--quick`` changes (explicit flags still win)."""
