"""The event-stream decoder: whole chunks (vLLM's usual shape, one event a chunk) decode as the
same bytes fed one at a time, whatever the line ends, fields and comments."""

from __future__ import annotations

import pytest

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
