"""The event-stream decoder: whole chunks (vLLM's usual shape, one event a chunk) decode as the
same bytes fed one at a time, whatever the line ends, fields and comments."""

from __future__ import annotations

import pytest

from relay_integrations.upstream import sse
from relay_integrations.upstream.sse import EventDecoder

STREAMS = [
    b'data: {"a": 1}\n\n',
    b'data: {"a": 1}\n\ndata: {"b": 2}\n\n',
    b"data:no space\n\n",
    b"data: one\ndata: two\n\n",
    b"data: a\r\rdata: b\r\r",
    b"data: a\r\n\r\ndata: b\r\n\r\n",
    b": keep-alive\n\ndata: x\n\n",
    b"event: message\nid: 7\ndata: x\n\n",
    b"database: not data\n\ndata: y\n\n",
    b"data: unfinished",
    b"data: x\n\ndata: unfinished",
    b"data: \n\n",
]


def byte_by_byte(stream: bytes) -> list[bytes]:
    decoder = EventDecoder()
    return [event for i in range(len(stream)) for event in decoder.feed(stream[i : i + 1])]


@pytest.mark.parametrize("stream", STREAMS)
def test_a_whole_chunk_decodes_as_its_bytes_one_at_a_time(stream: bytes) -> None:
    assert EventDecoder().feed(stream) == byte_by_byte(stream)


@pytest.mark.parametrize("stream", STREAMS)
def test_a_chunk_an_event_after_anything_decodes_as_one_stream(stream: bytes) -> None:
    decoder = EventDecoder()
    after = [*decoder.feed(stream), *decoder.feed(b'data: {"c": 3}\n\n')]
    assert after == byte_by_byte(stream + b'data: {"c": 3}\n\n')


def test_the_usual_chunk_gives_its_data() -> None:
    assert EventDecoder().feed(b'data: {"a": 1}\n\n') == [b'{"a": 1}']
    decoder = EventDecoder()
    assert decoder.feed(b"data: a\r") == []  # a CR whose LF may come next
    assert decoder.feed(b"\ndata: b\n\n") == [b"a\nb"]  # that LF ends the line, not the event


@pytest.mark.parametrize("stream", STREAMS)
def test_a_stream_is_cut_where_its_bytes_one_at_a_time_are(stream: bytes) -> None:
    whole, one_by_one = EventDecoder(), EventDecoder()
    whole.feed(stream)
    for i in range(len(stream)):
        one_by_one.feed(stream[i : i + 1])
    ended = stream.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
    assert whole.cut == one_by_one.cut == (not ended)


@pytest.mark.parametrize(
    "endless",
    [
        pytest.param(b"data: " + b"x" * 65536, id="a line that never ends"),
        pytest.param(b"data: " + b"x" * 65535 + b"\n", id="an event that never ends"),
    ],
)
def test_an_event_past_the_limit_is_refused_not_kept(
    endless: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never ends a line (or an event) does not fill the memory: past
    MAX_EVENT_BYTES the decoder raises, having kept about that much, whatever the pieces."""
    monkeypatch.setattr(sse, "MAX_EVENT_BYTES", 2**20)
    decoder = EventDecoder()
    with pytest.raises(sse.EventTooLarge, match="more than 1 MiB"):
        for _ in range(2**20 // len(endless) + 2):
            decoder.feed(endless)


def test_a_long_line_in_many_pieces_is_joined_once() -> None:
    """A line arriving in many pieces is kept in parts and joined at its end: linear, where
    joining at every piece copies the line so far each time."""
    decoder = EventDecoder()
    pieces = [b"data: "] + [b"y" * 4096] * 4096 + [b"\n\n"]  # 16 MiB
    events = [event for piece in pieces for event in decoder.feed(piece)]
    assert events == [b"y" * (4096 * 4096)]
