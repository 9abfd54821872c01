"""Server-sent events, decoded as the HTML standard defines them (the event-stream format):
lines end in CR, LF or CR LF; the ``data:`` lines of one event are joined by LF; an empty
line dispatches the event; comments (``:``) and the other fields (``event``, ``id``,
``retry``) carry nothing the relay reads. What the bytes arrive in does not matter: a line
split anywhere, a CR LF split between two reads::

    decoder = EventDecoder()
    decoder.feed(b'data: {"a":\\r')    # []
    decoder.feed(b'\\ndata: 1}\\r\\n\\r\\n')  # [b'{"a":\\n1}']

    async for data in events(response.content.iter_any()):  # an aiohttp response's body
        ...

An event the stream ends in the middle of (no empty line after it) is not dispatched, as
the standard says; :attr:`EventDecoder.cut` tells a reader that the stream ended there, and
:meth:`EventDecoder.stray` what the stream held that is not an event (a server's JSON error
object sent as the whole body)::

    decoder = EventDecoder()
    decoder.feed(b'{"object": "error", "code": 400}')  # [] (not a field of an event)
    decoder.stray()                                     # b'{"object": "error", "code": 400}'
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

STRAY_KEPT = 8192
"""Bytes of stray lines (:meth:`EventDecoder.stray`) a decoder keeps."""
MAX_EVENT_BYTES = 32 * 2**20
"""Most bytes one event (or one line) may hold: far above a vLLM chunk (logprobs and all), far
below what a server that never ends its line could fill memory with."""
_FIELDS = frozenset({b"event", b"id", b"retry"})
"""The fields of an event other than ``data`` (read by the standard, not by the relay)."""


class EventTooLarge(ValueError):
    """An event (or a line) longer than :data:`MAX_EVENT_BYTES`: the stream is not read on."""


class EventDecoder:
    """Bytes of an event stream in, the ``data`` of each complete event out; an event longer
    than :data:`MAX_EVENT_BYTES` raises :class:`EventTooLarge`."""

    def __init__(self) -> None:
        self._line: list[bytes] = []  # the start of a line whose end has not arrived, in parts
        self._line_bytes = 0
        self._data: list[bytes] = []  # the data lines of the event being read
        self._data_bytes = 0
        self._after_cr = False  # the last byte fed was a CR: an LF next belongs to it
        self._stray = b""  # lines that are no field of an event, up to STRAY_KEPT bytes
        self.idle_bytes = 0
        """Bytes fed in chunks that completed no event (comments, keep-alives, an event's
        start): what a stall timer does not count as progress."""

    @property
    def cut(self) -> bool:
        """Whether the bytes fed so far end in the middle of a line or an event (a stream
        that ends here was cut)."""
        return bool(self._line or self._data)

    def stray(self) -> bytes:
        """The lines fed so far that are no field of an event stream, and an unfinished last
        line: a body that is not events (a JSON error object) is here whole, when short."""
        return self._stray + b"".join(self._line)[:STRAY_KEPT]

    def _is_stray(self, line: bytes) -> bool:
        """Whether `line` (not data, not empty) is kept as stray: no comment, no field of an
        event, and room left."""
        if line.startswith(b":") or len(self._stray) >= STRAY_KEPT:
            return False
        return line.partition(b":")[0] not in _FIELDS

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completes (each one's data lines joined by LF)."""
        if (  # what vLLM sends, a chunk an event, arriving alone: one scan of each kind
            chunk.startswith(b"data: ")
            and chunk.endswith(b"\n\n")
            and chunk.find(b"\n") == len(chunk) - 2
            and not (self._line or self._data or self._after_cr)
            and b"\r" not in chunk
        ):
            return [chunk[6:-2]]
        size = len(chunk)
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        if b"\r" in chunk:
            self._after_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._after_cr = False
        if b"\n" not in chunk:  # more of a line: kept in parts (joined once, at its end)
            if chunk:
                self._line.append(chunk)
                self._line_bytes += len(chunk)
                self._check_size()
            self.idle_bytes += size
            return []
        if self._line:
            chunk = b"".join((*self._line, chunk))
        lines = chunk.split(b"\n")
        last = lines.pop()
        self._line, self._line_bytes = ([last], len(last)) if last else ([], 0)
        events: list[bytes] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data, self._data_bytes = [], 0
            elif line.startswith(b"data"):
                field, _, value = line.partition(b":")
                if field == b"data":
                    self._data.append(value[1:] if value.startswith(b" ") else value)
                    self._data_bytes += len(value)
                # "data" followed by other letters is another field: ignored
            elif self._is_stray(line):
                self._stray += line[: STRAY_KEPT - len(self._stray)] + b"\n"
            # comments (":..."), event, id, retry and unknown fields carry nothing here
        self._check_size()
        if not events:
            self.idle_bytes += size
        return events

    def _check_size(self) -> None:
        if self._line_bytes + self._data_bytes > MAX_EVENT_BYTES:
            raise EventTooLarge(
                f"sent an event (or a line) of more than {MAX_EVENT_BYTES // 2**20} MiB, "
                "which is not vLLM's: the rest was not read"
            )


async def events(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The data of each event of a stream whose bytes arrive as `chunks`."""
    decoder = EventDecoder()
    async for chunk in chunks:
        for data in decoder.feed(chunk):
            yield data
