"""The HTTP/1.1 + SSE response parser (trtkv.bench.transport.http1) fed directly: malformed framing and headers are refused
with a reason, buffers stay within their bounds, and a fuzz test over random and mutated streams always ends."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtkv.bench.transport import http1
from trtkv.bench.transport.http1 import Call, Connection, ProtocolError
from trtkv.bench.transport.openai import OpenAIEvents
from trtkv.contracts.bench_doc import ERROR, OK, RequestRecord


def _event(text: str) -> bytes:
    return b"data: " + json.dumps({"object": "text_completion", "choices": [{"index": 0, "text": text}]}).encode()


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
SSE_HEAD = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
EVENTS = [_event(t) + b"\n\n" for t in (" Paris", " is", " the")] + [b"data: [DONE]\n\n"]
# a chunk, then size -6: today the decoder steps back onto the same size line for ever
NEGATIVE_CHUNK = b"6\r\ndata: \r\n-6\r\nxx\r\n0\r\n\r\n"
CHUNKED = SSE_HEAD + _chunked(*EVENTS)
LENGTH = HEAD + b"Content-Length: %d\r\n\r\n" % len(b"".join(EVENTS)) + b"".join(EVENTS)
CLOSE = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(EVENTS)


def _call(limits: http1.Limits = http1.LIMITS) -> Call:
    rec = RequestRecord("r", "latency", "c", 0, 1, 4)
    return Call(Connection("h", 1), b"", rec, OpenAIEvents(rec, chat=False), 10.0, threading.Event(), limits)


def _feed_within(call: Call, pieces: list[bytes], seconds: float = 5.0) -> str:
    """Feed the pieces in a daemon thread (so a parser that loops forever fails the test instead of hanging it):
    'complete', 'pending' or the exception's type and message."""
    outcome: list[str] = []

    def work() -> None:
        try:
            for piece in pieces:
                if call.feed(piece, 1):
                    outcome.append("complete")
                    return
            outcome.append("pending")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome.append(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"the parser did not return within {seconds} s (an endless loop)"
    return outcome[0]


def test_valid_streams_in_every_framing() -> None:
    for whole in (CHUNKED, LENGTH):
        call = _call()
        assert _feed_within(call, [whole]) == "complete"
        call.end_of_body(1)
        call.events.decode()
        assert call.record.status == OK and call.record.text == " Paris is the", call.record.error
    call = _call()
    assert _feed_within(call, [CLOSE]) == "pending" and call.body_mode == "close"
    call.end_of_body(1)
    assert call.record.status == OK


def test_negative_chunk_size_is_refused_not_looped() -> None:
    """Today: int('-6', 16) is accepted and the decoder walks backwards for ever."""
    outcome = _feed_within(_call(), [SSE_HEAD + NEGATIVE_CHUNK])
    assert outcome.startswith("ProtocolError") and "bad chunk size" in outcome, outcome


@pytest.mark.parametrize("size", [b"+6", b" 6", b"6_0", b"0x6", b"6 6", b"", b"1" * 17, b"7fffffffffffffff",
                                  b"6;" + b"x" * 5000])
def test_chunk_sizes_python_would_accept_are_refused(size: bytes) -> None:
    """Only 1*HEXDIG (with an optional extension): no sign, space inside, underscore, 0x, overflow or huge chunk."""
    outcome = _feed_within(_call(), [SSE_HEAD + size + b"\r\ndata: x\r\n0\r\n\r\n"])
    assert outcome.startswith("ProtocolError") and "chunk" in outcome, outcome


def test_chunk_extensions_and_split_crlf_are_accepted() -> None:
    body = b"6 ;name=value\r\ndata: \r\n0\r\n\r\n"
    call = _call()
    whole = SSE_HEAD + body
    assert _feed_within(call, [whole[:len(SSE_HEAD) + 20], whole[len(SSE_HEAD) + 20:]]) == "complete"


def test_chunk_data_must_end_with_crlf() -> None:
    outcome = _feed_within(_call(), [SSE_HEAD + b"2\r\nabXY\r\n0\r\n\r\n"])
    assert outcome.startswith("ProtocolError") and "CRLF" in outcome, outcome


@pytest.mark.parametrize("value", [b"abc", b"-5", b"5x", b" ", b"1e3", b"99999999999999999999999"])
def test_non_numeric_or_negative_content_length_is_refused(value: bytes) -> None:
    """Today: int() raises ValueError inside the shared loop thread, which kills it."""
    outcome = _feed_within(_call(), [HEAD + b"Content-Length: " + value + b"\r\n\r\ndata: x\n"])
    assert outcome.startswith("ProtocolError") and "Content-Length" in outcome, outcome


@pytest.mark.parametrize(("headers", "words"), [
    (b"Content-Length: 5\r\nContent-Length: 6\r\n", "Content-Length"),
    (b"Content-Length: 5, 6\r\n", "Content-Length"),
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "both"),
    (b"Transfer-Encoding: gzip, chunked\r\n", "Transfer-Encoding"),
    (b"Transfer-Encoding: chunked, identity\r\n", "Transfer-Encoding"),
    (b"X-Folded: a\r\n  b\r\n", "folded"),
    (b"no colon here\r\n", "header line"),
    (b"Bad Name: x\r\n", "header line"),
])
def test_conflicting_or_malformed_headers_are_refused(headers: bytes, words: str) -> None:
    outcome = _feed_within(_call(), [HEAD + headers + b"\r\n0\r\n\r\n"])
    assert outcome.startswith("ProtocolError") and words in outcome, outcome


@pytest.mark.parametrize("status_line", [b"HTTP/1.1 2000 OK", b"HTTP/1.1 -200 OK", b"HTTP/1.1 20 OK", b"HTTP/9 200",
                                         b"SSH-2.0-OpenSSH_9.6"])
def test_bad_status_lines_are_refused(status_line: bytes) -> None:
    outcome = _feed_within(_call(), [status_line + b"\r\nContent-Length: 0\r\n\r\n"])
    assert outcome.startswith("ProtocolError") and "HTTP response" in outcome, outcome


def test_long_header_values_cost_linear_time() -> None:
    """A value of spaces between two letters (64 KiB): no regex backtracking (it took ~40 s with one)."""
    call = _call()
    t0 = time.perf_counter()
    assert _feed_within(call, [HEAD + b"X-Pad: a" + b" \t" * 32000 + b"b\r\nContent-Length: 0\r\n\r\n"]) == "complete"
    assert time.perf_counter() - t0 < 0.5


def test_an_interim_response_is_skipped_a_flood_of_them_refused() -> None:
    call = _call()
    assert _feed_within(call, [b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH]) == "complete" and call.status == 200
    outcome = _feed_within(_call(), [b"HTTP/1.1 103 Early Hints\r\n\r\n" * 3000 + LENGTH])
    assert outcome.startswith("ProtocolError") and "interim answer 103" in outcome, outcome
    outcome = _feed_within(_call(), [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"])
    assert outcome.startswith("ProtocolError") and "interim answer 101" in outcome, outcome


def test_an_unterminated_line_is_bounded() -> None:
    """An event-stream line with no newline: refused once it passes the line bound, never buffered beyond it, and
    without copying the whole buffer on every read (today: grows without bound, quadratic copying)."""
    limit = http1.LIMITS.line_bytes
    call = _call()
    pieces = [SSE_HEAD] + [b"1000\r\n" + b"x" * 4096 + b"\r\n"] * (2 * limit // 4096 + 2)
    t0 = time.perf_counter()
    outcome = _feed_within(call, pieces)
    assert outcome.startswith("ProtocolError") and "line" in outcome, outcome
    assert len(call.tail) <= limit
    assert time.perf_counter() - t0 < 2.0


def test_lines_and_bodies_are_bounded_by_the_limits() -> None:
    small = http1.Limits(header_bytes=256, line_bytes=64, chunk_line_bytes=32, body_bytes=2048)
    cases = {
        "header": [HEAD + b"X-Pad: " + b"p" * 300],  # no end of the headers
        "line": [SSE_HEAD + _chunked(b"data: " + b"x" * 100 + b"\n")[:-5]],
        "chunk-size line": [SSE_HEAD + b"1" + b";" * 40],
        "body": [SSE_HEAD] + [_chunked(b"data: x\n")[:-5]] * 400,
        "Content-Length": [HEAD + b"Content-Length: 2049\r\n\r\n"],
        "trailer": [SSE_HEAD + b"0\r\n" + b"X-T: t\r\n" * 60],
    }
    for words, pieces in cases.items():
        call = _call(small)
        outcome = _feed_within(call, pieces)
        assert outcome.startswith("ProtocolError") and words in outcome, (words, outcome)
        assert len(call.head) <= 256 + max(map(len, pieces)) and len(call.raw) <= 256 and len(call.tail) <= 64


# -- fuzz --------------------------------------------------------------------------------------------------------
SMALL = http1.Limits(header_bytes=512, line_bytes=128, chunk_line_bytes=32, body_bytes=4096)
NASTY = [b"-6", b"\r\n", b"\n", b"\r", b"0\r\n\r\n", b"ffffffff", b";", b" ", b"Content-Length: x\r\n", b"data: ",
         b"Transfer-Encoding: chunked\r\n", b"\x00", b"data: [DONE]\n\n", b"HTTP/1.1 200 OK\r\n", b"1_0"]
SIZES = [b"8", b"-6", b"+8", b"08", b"8;x=y", b"8 ", b" 8", b"0x8", b"8_0", b"f" * 17, b"-0"]  # 8: right for its data
mutation = st.tuples(st.sampled_from(["insert", "delete", "replace"]), st.integers(0, 10_000), st.integers(0, 40),
                     st.one_of(st.sampled_from(NASTY), st.binary(max_size=40)))


def _mutate(data: bytes, ops: list[tuple[str, int, int, bytes]]) -> bytes:
    for op, at, span, new in ops:
        at %= len(data) + 1
        if op == "insert":
            data = data[:at] + new + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + span:]
        else:
            data = data[:at] + new + data[at + len(new):]
    return data


streams = st.one_of(
    st.binary(max_size=2000),
    st.builds(_mutate, st.sampled_from([CHUNKED, LENGTH, CLOSE, CHUNKED * 3]), st.lists(mutation, max_size=6)),
    st.builds(lambda sizes: SSE_HEAD + b"".join(z + b"\r\ndata: x\n\r\n" for z in sizes) + b"0\r\n\r\n",
              st.lists(st.one_of(st.sampled_from(SIZES), st.binary(max_size=6)), max_size=5)),
    st.builds(lambda n, t: SSE_HEAD + _chunked(*[b"data: " + b"y" * n + b"\n"] * t), st.integers(0, 300),
              st.integers(0, 60)),
)


@settings(max_examples=500, deadline=timedelta(milliseconds=500), database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams, cuts=st.lists(st.integers(1, 3000), max_size=12))
def test_fuzz_the_parser_always_ends_within_its_bounds(stream: bytes, cuts: list[int]) -> None:
    """As the loop drives it: feed the pieces, a ProtocolError fails the request, the end of the bytes is the server
    closing. Whatever the bytes: nothing else is raised, the record gets a final status, the buffers stay bounded."""
    call = _call(SMALL)
    edges = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in zip(edges, edges[1:], strict=False)] or [b""]
    try:
        for piece in pieces:
            complete = call.feed(piece, 1)
            assert len(call.head) <= 512 and len(call.raw) <= 512 and len(call.tail) <= 128
            assert len(call.error_body) <= http1.ERROR_BODY_BYTES and call.body_bytes <= 4096
            if complete:
                call.end_of_body(1)
                break
            if call.finished:
                break
        else:
            if call.status and call.body_mode == "close":
                call.end_of_body(1)
    except ProtocolError as exc:
        call.fail(ERROR, f"bad HTTP response: {exc}", 1)
    call.fail(ERROR, "the response ended early", 1)  # what the loop books for a body cut short
    assert call.record.status in (OK, ERROR) and (call.record.status == OK or call.record.error)
