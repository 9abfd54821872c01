"""What the relay sends upstream is what it was given, or refused where it was given; what it
reads back is bounded.

- A header (an endpoint's ``extra_headers``, a request's own ``headers``) goes out byte for
  byte as configured, or is refused when configured, naming the header and never its value:
  framing headers (``content-length``, ``transfer-encoding``, ``host``, ...), values that are
  not visible ASCII (line breaks, C1 controls, U+2028, obs-text), values a server would strip.
- A ``base_url`` or a proxy URL with whitespace or control characters (which urllib drops
  silently) is refused, as is a ``base_url`` whose query or fragment its requests would drop.
- TLS files are checked when configured: a CA directory works, a certificate without its
  key, a key of another certificate, an encrypted or unreadable key, a CA file with no
  certificate are errors naming the file (never the key).
- A whole body (JSON, or an error's) is read up to :data:`MAX_BODY_BYTES` decompressed: a
  small gzip body that grows to hundreds of MiB is refused once past it.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from relay_integrations.langchain import RelayChatModel
from relay_integrations.relay import RelayConfig
from relay_integrations.upstream import CompletionRequest, Endpoint, EndpointConfig, RelayError
from relay_integrations.upstream._http import MAX_BODY_BYTES, HttpClient
from relay_integrations.upstream.errors import InvalidHeaderError
from relay_integrations.upstream.headers import FRAMING_HEADERS
from tests.component.test_http import (  # noqa: F401  (tls_files: a fixture)
    JSON_OK,
    answering,
    client,
    events_of,
    server_tls,
    serving,
    stream_server,
    tls_files,
)
from tests.fakes.capable_model import relay_fields

EXAMPLES = int(os.environ.get("RELAY_PROPERTY_EXAMPLES", "60"))
"""Examples per property in CI; RELAY_PROPERTY_EXAMPLES=5000 for a longer search."""
BOUNDED = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
MARK = "sk-mark-5e1d90c7"
"""Inside every generated header value: a refusal must not show it."""

# characters a header value or URL may be made of: visible ASCII and what must not pass
TRICKY = st.sampled_from(
    [*"\t \r\n\x00\x7f", *"\x85\x9b\xa0\xe9", *"\u2028\u2029\u200b\ufeff\u3000\U0001f600"]
)
VISIBLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
SOME_TEXT = st.text(st.one_of(VISIBLE, TRICKY), max_size=6)
HEADER_NAMES = st.one_of(
    st.from_regex(r"\Ax-[a-z0-9-]{1,12}\Z"),
    st.sampled_from(sorted(FRAMING_HEADERS)).map(str.title),
    st.sampled_from(sorted(FRAMING_HEADERS)),
)


def wire_headers(fields: dict[str, Any], headers: dict[str, str] | None = None) -> list[bytes]:
    """The header lines of the request the relay's HTTP client writes for an endpoint with
    `fields` (and a request's own `headers`), as a raw server reads them."""

    async def send() -> bytes:
        heads: list[bytes] = []

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(JSON_OK)
            await writer.drain()

        async with serving(handler) as origin:
            http = HttpClient(EndpointConfig(base_url=origin + "/v1", model="m", **fields))
            response = await http.request("POST", "/v1/completions", {}, headers)
            await response.close()
            await http.aclose()
        return heads[0]

    return asyncio.run(send()).split(b"\r\n")[1:-2]


def received(lines: list[bytes], name: str) -> bytes | None:
    """The value a server reads for the header `name` (RFC 9110: leading and trailing spaces
    and tabs are not part of it)."""
    for line in lines:
        field, _, value = line.partition(b":")
        if field.decode("latin-1").lower() == name.lower():
            return value.strip(b" \t")
    return None


@pytest.mark.parametrize("where", ["extra_headers", "a request's headers"])
@BOUNDED
@given(name=HEADER_NAMES, before=SOME_TEXT, after=SOME_TEXT)
@example(name="x-c1", before="", after="\x85").via("a C1 control went out raw")
@example(name="x-nel", before="a", after="\u2028").via("a line separator went out raw")
@example(name="x-latin", before="\xe9", after="").via("obs-text went out as UTF-8")
@example(name="x-padded", before=" ", after="").via("a leading space was stripped")
@example(name="content-length", before="", after="").via("content-length cut the body")
@example(name="Transfer-Encoding", before="", after="").via("chunked hung the server")
@example(name="host", before="", after="").via("host sent it to another site")
def test_a_header_goes_out_as_given_or_is_refused_naming_it_and_not_its_value(
    where: str, name: str, before: str, after: str
) -> None:
    value = before + MARK + after
    try:
        if where == "extra_headers":
            lines = wire_headers({"extra_headers": {name: value}})
        else:
            request = CompletionRequest("Hi", max_tokens=1, headers={name: value})
            lines = wire_headers({}, dict(request.headers))
    except ValueError as refused:
        assert isinstance(refused, ValidationError | RelayError), type(refused)
        assert f"[{name!r}]" in str(refused)
        assert MARK not in str(refused) and MARK not in repr(refused)
        return
    assert name.lower() not in FRAMING_HEADERS
    assert received(lines, name) == value.encode("ascii")


@pytest.mark.parametrize("name", sorted(FRAMING_HEADERS))
def test_framing_headers_are_refused_wherever_headers_are_given(name: str) -> None:
    """An endpoint's extra_headers, both adapters' default_headers, a request's own headers,
    and the session header's name."""
    refused = rf"(?i)\[{name!r}\].*says where the request goes or how it is framed"
    with pytest.raises(ValueError, match=refused):
        EndpointConfig(base_url="http://h:8000/v1", model="m", extra_headers={name: "5"})
    with pytest.raises(ValueError, match=refused):
        RelayChatModel(**relay_fields("http://h:8000/v1", default_headers={name.upper(): "5"}))
    with pytest.raises(InvalidHeaderError, match=refused):
        CompletionRequest("Hi", max_tokens=1, headers={name: "5"})
    endpoint = EndpointConfig(base_url="http://h:8000/v1", model="m")
    with pytest.raises(ValueError, match=r"session_header: .*how it is framed"):
        RelayConfig(large=endpoint, small=endpoint, session_header=name)


async def test_a_request_with_a_header_that_cannot_be_sent_fails_named_before_any_byte() -> None:
    """Not aiohttp's bare ValueError from inside the request, after a connection was made."""
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1

    async with serving(handler) as origin:
        endpoint = Endpoint(EndpointConfig(base_url=origin + "/v1", model="m"), "large")
        with pytest.raises(InvalidHeaderError, match=r"headers\['x-team'\]: .*line break"):
            request = CompletionRequest("Hi", max_tokens=1, headers={"x-team": "a\r\nb"})
            [piece async for piece in endpoint.stream_completion(request)]
        await endpoint.aclose()
    assert connections == 0


# --- URLs -------------------------------------------------------------------------------------

URL_SHAPES = ["http://127.0.0.1:8000/v1{}", "http://gpu{}.local:8000/v1", "{}http://gpu:8000/v1"]


@BOUNDED
@given(shape=st.sampled_from(URL_SHAPES), inserted=SOME_TEXT)
@example(shape=URL_SHAPES[0], inserted="\r\n").via("a CR LF was dropped by urlsplit")
@example(shape=URL_SHAPES[1], inserted="\t").via("a tab in the host was dropped")
@example(shape=URL_SHAPES[2], inserted=" ").via("a leading space was dropped")
@example(shape=URL_SHAPES[0], inserted="?key=1").via("a query the requests drop")
@example(shape=URL_SHAPES[0], inserted="\u2028").via("a line separator kept")
def test_a_base_url_is_requested_as_given_or_refused_naming_it(shape: str, inserted: str) -> None:
    url = shape.format(inserted)
    try:
        config = EndpointConfig(base_url=url, model="m")
    except ValueError as refused:
        assert "base_url" in str(refused)
        return
    parts = urllib.parse.urlsplit(config.base_url)  # as the relay splits it into its requests
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == url
    assert not any(char.isspace() or not char.isprintable() for char in url)


@pytest.mark.parametrize(
    "proxy",
    [
        pytest.param("http://proxy:3128\r\n", id="line break"),
        pytest.param("http://pro xy:3128", id="space"),
        pytest.param("http://relay:pw@", id="no host"),
        pytest.param("http://proxy:port", id="a port that is not a number"),
    ],
)
def test_a_proxy_url_the_client_would_not_read_as_given_is_refused(proxy: str) -> None:
    with pytest.raises(ValueError, match="proxy: ") as refused:
        EndpointConfig(base_url="http://h:8000/v1", model="m", proxy=proxy)
    assert ":pw@" not in str(refused.value)


# --- TLS files --------------------------------------------------------------------------------


async def test_verify_may_be_a_directory_of_ca_certificates(
    tls_files: dict[str, Path],  # noqa: F811  (the fixture)
    tmp_path: Path,
) -> None:
    """As ``SSL_CERT_DIR`` is: PEM files named by their subject hashes (openssl rehash)."""
    subject_hash = await asyncio.to_thread(
        subprocess.run,
        ["openssl", "x509", "-hash", "-noout", "-in", str(tls_files["ca"])],
        check=True,
        capture_output=True,
        text=True,
    )
    (tmp_path / f"{subject_hash.stdout.strip()}.0").write_bytes(tls_files["ca"].read_bytes())
    async with serving(stream_server, server_tls(tls_files)) as origin:
        trusted = client(origin, verify=str(tmp_path))
        assert (await events_of(trusted))[-1] == b"[DONE]"
        await trusted.aclose()


@pytest.fixture(scope="module")
def bad_tls_files(
    tls_files: dict[str, Path],  # noqa: F811  (the fixture)
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad-tls")
    not_a_key = folder / "not-a-key.pem"
    not_a_key.write_text(f"-----BEGIN PRIVATE KEY-----\n{MARK}\n-----END PRIVATE KEY-----\n")
    encrypted = folder / "encrypted-key.pem"
    subprocess.run(
        [
            *("openssl", "pkey", "-in", str(tls_files["client-key"]), "-aes256"),
            *("-passout", "pass:s3cret", "-out", str(encrypted)),
        ],
        check=True,
        capture_output=True,
    )
    return {"not-a-key": not_a_key, "encrypted": encrypted, **tls_files}


TLS_MISTAKES: dict[str, tuple[dict[str, str | tuple[str, str]], str, str]] = {
    # fields (file names from bad_tls_files), the file named, what the message says
    "certificate without its key": ({"cert": "client"}, "client", "no private key"),
    "key of another certificate": (
        {"cert": ("client", "server-key")},
        "server-key",
        "is not the key of the certificate",
    ),
    "not a key": ({"cert": ("client", "not-a-key")}, "not-a-key", "no private key in PEM"),
    "encrypted key": ({"cert": ("client", "encrypted")}, "encrypted", "is encrypted"),
    "key as the certificate": (
        {"cert": ("client-key", "client-key")},
        "client-key",
        "holds no certificate",
    ),
    "a CA file with no certificate": ({"verify": "not-a-key"}, "not-a-key", "no CA certificate"),
}


@pytest.mark.parametrize("case", TLS_MISTAKES)
def test_tls_files_that_cannot_be_used_are_refused_when_configured_naming_the_file(
    case: str, bad_tls_files: dict[str, Path]
) -> None:
    """Not an ssl.SSLError (or an IsADirectoryError, or a passphrase prompt on the terminal)
    at the first request; never what a key file holds."""
    fields, named, says = TLS_MISTAKES[case]
    files = {
        key: str(bad_tls_files[value])
        if isinstance(value, str)
        else tuple(str(bad_tls_files[v]) for v in value)
        for key, value in fields.items()
    }
    with pytest.raises(ValueError, match=says) as refused:
        EndpointConfig(base_url="https://h:8000/v1", model="m", **files)
    assert str(bad_tls_files[named]) in str(refused.value)
    key_lines = bad_tls_files["client-key"].read_text().splitlines()[1:-1]
    for shown in (str(refused.value), repr(refused.value)):
        assert MARK not in shown and not any(line in shown for line in key_lines)


# --- bodies -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """A JSON body of 2 * MAX_BODY_BYTES, gzip-compressed to a few hundred KiB."""
    text = b'{"data": "' + b"a" * (2 * MAX_BODY_BYTES) + b'"}'
    return gzip.compress(text, compresslevel=6)


def compressed(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
        b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )


async def test_a_body_that_decompresses_past_the_limit_is_refused_unread(gzip_bomb: bytes) -> None:
    assert len(gzip_bomb) < 2**20
    async with serving(answering(compressed(b"200 OK", gzip_bomb))) as origin:
        http = client(origin)
        response = await http.request("GET", "/v1/models")
        with pytest.raises(
            openai.APIResponseValidationError,
            match=r"a body of more than 32 MiB once decompressed \(gzip\)",
        ):
            await response.json()
        await response.close()
        await http.aclose()


async def test_an_error_body_is_kept_only_up_to_the_limit(gzip_bomb: bytes) -> None:
    async with serving(answering(compressed(b"500 Internal Server Error", gzip_bomb))) as origin:
        http = client(origin)
        with pytest.raises(openai.InternalServerError) as failed:
            await http.request("GET", "/v1/models")
        assert len(failed.value.response.content) <= MAX_BODY_BYTES
        await http.aclose()
