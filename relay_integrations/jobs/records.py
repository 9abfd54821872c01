"""Append-only JSON Lines files of pydantic records, for runs that resume (calibration traces,
benchmark results).

Each record is written as soon as it exists, so an interrupted run keeps its work; on reading,
a last line cut short by a crash is dropped from the file, and any other bad line is an error
that names its file and line::

    results = RecordFile(path, BenchRecord)
    done = results.read()
    results.append(record)
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from .datasets import DatasetError

M = TypeVar("M", bound=BaseModel)


class RecordFile(Generic[M]):
    """A JSON Lines file of `model` records, appended to as they finish."""

    def __init__(self, path: str | Path, model: type[M], kind: str | None = None) -> None:
        self.path = Path(path)
        self.model = model
        self.kind = kind or model.__name__  # what errors call a record: "trace", "result"

    def read(self) -> list[M]:
        """The records written so far; a line cut short by a crash is dropped from the file."""
        if not self.path.exists():
            return []
        lines = self.path.read_bytes().splitlines()
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(self.model.model_validate_json(line.decode("utf-8")))
            except (ValidationError, UnicodeDecodeError) as exc:
                if number == len(lines):  # the write of the last record was interrupted
                    self.path.write_bytes(b"".join(x + b"\n" for x in lines[:-1]))
                    break
                reason = (
                    f"not UTF-8 text (byte {exc.start + 1} of the line)"
                    if isinstance(exc, UnicodeDecodeError)
                    else exc.errors()[0]["msg"]
                )
                raise DatasetError(
                    f"{self.path}:{number}", f"not a {self.kind} record ({reason})"
                ) from None
        return records

    def append(self, record: M) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(record.model_dump_json() + "\n")
