"""A dependency-free progress bar for long runs (calibration, benchmarks).

On a terminal it redraws one line; in a log (CI, a file) it prints a line every tenth of the
way, so logs stay short::

    with Progress("traces", total=160) as bar:
        for _ in range(160):
            bar.advance()
    # traces  [##########----------]  80/160  50%  3.1/s  eta 26s
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

_WIDTH = 20


class Progress:
    """Counts finished items of a known total and shows rate and time left."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 0)
        self.done = 0
        self._stream = stream if stream is not None else sys.stderr
        self._interactive = self._stream.isatty()
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._last_tenth = -1
        self._note = ""

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def advance(self, count: int = 1, note: str = "") -> None:
        """Count `count` more items done; `note` is shown after the figures."""
        self.done += count
        self._note = note or self._note
        self._draw()

    def close(self) -> None:
        self._draw(force=True)
        if self._interactive:
            self._stream.write("\n")
            self._stream.flush()

    @property
    def line(self) -> str:
        elapsed = time.monotonic() - self._started
        fraction = self.done / self.total if self.total else 1.0
        filled = min(round(fraction * _WIDTH), _WIDTH)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else None
        eta = f"eta {left:.0f}s" if left is not None and self.done < self.total else ""
        return (
            f"{self.label}  [{'#' * filled}{'-' * (_WIDTH - filled)}]  "
            f"{self.done}/{self.total}  {fraction:.0%}  {rate:.2f}/s  "
            f"{elapsed:.0f}s {eta}  {self._note}"
        ).rstrip()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._interactive:
            if force or now - self._last_draw >= 0.2 or self.done >= self.total:
                self._stream.write("\r\033[K" + self.line)
                self._stream.flush()
                self._last_draw = now
            return
        tenth = int(10 * self.done / self.total) if self.total else 10
        if (force and self.done == 0) or tenth > self._last_tenth:
            self._last_tenth = tenth
            self._stream.write(self.line + "\n")
            self._stream.flush()
