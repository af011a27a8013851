"""Decode a Kineto trace in batches of events, so that memory stays bounded whatever its size.

Decoding a whole trace at once holds its JSON text and every decoded event at the same time: for a
rank with 10^7 events that is gigabytes. Here the file is read (and gunzipped) in pieces; the
``traceEvents`` array is cut into batches of about ``BATCH_BYTES`` of JSON at the commas between
events, and each batch is decoded on its own (as ``[`` + its events + ``]``), then dropped.

A cut is found by looking back from the end of the text read so far for ``}`` followed by ``,``.
That comma may lie inside a string or a nested object; then the batch does not decode as a list
of complete events (the decoder reports truncated input, or an error at the cut) and the previous
candidate is tried. A batch that does decode ends exactly at an event boundary, because it starts
at one and JSON parses the same text the same way.

Anything unexpected (invalid JSON, odd field types, ``NaN``, no ``traceEvents``, a truncated or
corrupt gzip) raises :class:`StreamFallback`: the caller then decodes the
whole file with :func:`fsdpviz.trace.decode.decode_trace`, whose slow paths and error messages
handle every such case. The top-level keys around ``traceEvents`` (``distributedInfo``,
``baseTimeNanoseconds``, ``deviceProperties``; before or after the array) are decoded at the end
from the text outside the array.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import msgspec

from fsdpviz.trace.decode import GZIP_MAGIC, KinetoTrace, TraceEvent, decompressor

BATCH_BYTES: Final = 8 << 20  # JSON per decoded batch (~30k events): small next to the tables built
READ_BYTES: Final = 1 << 20  # compressed bytes read at a time
HEADER_LIMIT: Final = 64 << 20  # give up finding "traceEvents" after this much text
MAX_CUT_TRIES: Final = 8

_EVENTS_KEY_RE: Final = re.compile(rb'"traceEvents"\s*:\s*\[')
_BYTE_POS_RE: Final = re.compile(r"\(byte (\d+)\)")
_WHITESPACE: Final = b" \t\r\n"
_BATCH_DECODER: Final = msgspec.json.Decoder(list[TraceEvent])
_HEADER_DECODER: Final = msgspec.json.Decoder(KinetoTrace)


class StreamFallback(Exception):
    """The batch reader cannot go on: decode the whole file instead (reason in ``args[0]``)."""


def _json_pieces(path: Path) -> Iterator[bytes]:
    """The file's JSON text in pieces, gunzipped when it is gzip."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise StreamFallback(f"cannot open ({exc})") from None
    with fh:
        first = fh.read(READ_BYTES)
        if first[:2] != GZIP_MAGIC:
            while first:
                yield first
                first = fh.read(READ_BYTES)
            return
        inflate = decompressor()
        piece = first
        try:
            while piece:
                if inflate.eof:  # another gzip member follows (``cat a.gz b.gz`` is one gzip file)
                    if piece[:2] != GZIP_MAGIC:
                        raise StreamFallback("data after the gzip stream")
                    inflate = decompressor()
                out = inflate.decompress(piece)
                if out:
                    yield out
                piece = inflate.unused_data if inflate.eof and inflate.unused_data else fh.read(READ_BYTES)
            if not inflate.eof:
                raise StreamFallback("truncated gzip")
        except StreamFallback:
            raise
        except Exception as exc:  # noqa: BLE001 - zlib.error / isal's error: corrupt data
            raise StreamFallback(f"corrupt gzip ({exc})") from None


def _skip_ws_back(buf: bytearray, i: int) -> int:
    while i >= 0 and buf[i] in _WHITESPACE:
        i -= 1
    return i


def _last_cut(buf: bytearray, start: int, end: int) -> int:
    """Position of the last comma after a ``}`` in ``buf[start + 1:end]``, -1 if none."""
    i = end
    while True:
        i = buf.rfind(b",", start + 1, i)
        if i < 0 or buf[_skip_ws_back(buf, i - 1)] == ord("}"):
            return i


def _decode_span(buf: bytearray, open_at: int, close_at: int) -> list[TraceEvent]:
    """Decode ``buf[open_at:close_at + 1]`` as a list, with ``[`` / ``]`` written at both ends.

    The span is copied into its own ``bytes`` first (cheap next to decoding): the events'
    ``msgspec.Raw`` fields point into it, and the reader's buffer must stay free to grow.
    """
    buf[open_at] = ord("[")
    saved = buf[close_at]
    buf[close_at] = ord("]")
    try:
        with memoryview(buf) as view:
            text = view[open_at:close_at + 1].tobytes()
    finally:
        buf[close_at] = saved
    return _BATCH_DECODER.decode(text)


def _error_byte(exc: msgspec.DecodeError) -> int | None:
    match = _BYTE_POS_RE.search(str(exc))
    return int(match.group(1)) if match else None


def _decode_batch(buf: bytearray, open_at: int, end: int) -> tuple[list[TraceEvent], int] | None:
    """The events from ``open_at`` up to the last cut before ``end``, and where the cut is."""
    for _ in range(MAX_CUT_TRIES):
        cut = _last_cut(buf, open_at, end)
        if cut < 0:
            return None
        try:
            return _decode_span(buf, open_at, cut), cut
        except msgspec.ValidationError as exc:
            raise StreamFallback(f"odd field types ({exc})") from None
        except msgspec.DecodeError as exc:
            text, pos = str(exc), _error_byte(exc)
            if "trailing characters" in text and pos is not None:
                end = open_at + pos  # the array ended before this cut: cut before its end
            elif "truncated" in text or (pos is not None and pos >= cut - open_at):
                end = cut  # the cut fell inside a string or a nested object: try an earlier one
            else:
                raise StreamFallback(f"invalid JSON ({exc})") from None
    return None


def iter_event_batches(path: Path, header_out: list[KinetoTrace]) -> Iterator[list[TraceEvent]]:
    """Yield the trace's events in batches, in file order; then put the top level (with an empty
    ``traceEvents``) into ``header_out``. Raises StreamFallback when the file needs the whole-file path.

    """
    buf = bytearray()
    pieces = _json_pieces(path)
    header = b""
    open_at = -1  # index in buf of the separator before the next batch ("[" or ",")
    for piece in pieces:
        buf += piece
        if open_at < 0:
            match = _EVENTS_KEY_RE.search(buf)
            if match is None:
                if len(buf) > HEADER_LIMIT:
                    raise StreamFallback("no traceEvents near the start")
                continue
            header = bytes(buf[:match.end() - 1])
            open_at = match.end() - 1
        while len(buf) - open_at > BATCH_BYTES:
            found = _decode_batch(buf, open_at, len(buf))
            if found is None:
                break  # no usable cut yet: read more
            events, open_at = found
            yield events
            del events
        if open_at > BATCH_BYTES:  # drop what was decoded; keep the partial event
            del buf[:open_at]
            open_at = 0
    if open_at < 0:
        raise StreamFallback("no traceEvents")
    yield from _last_batch(buf, open_at, header, header_out)


def _last_batch(buf: bytearray, open_at: int, header: bytes,
                header_out: list[KinetoTrace]) -> Iterator[list[TraceEvent]]:
    """The events before the array's closing ``]``, and the top level around the array."""
    end = len(buf)
    tries = 0
    while tries < MAX_CUT_TRIES:
        close_at = buf.rfind(b"]", open_at + 1, end)
        if close_at < 0:
            break
        end = close_at
        last = _skip_ws_back(buf, close_at - 1)
        if buf[last] != ord("}") and last != open_at:
            continue  # the array ends with an event ("}") or is empty; this "]" is text after it
        tries += 1
        try:
            top = _HEADER_DECODER.decode(header + b"[]" + bytes(buf[close_at + 1:]))
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # this "]" is inside the text after the array (or the top level is odd)
        if last == open_at:  # "[]": the whole-file path reports the empty trace
            raise StreamFallback("empty traceEvents")
        try:
            events = _decode_span(buf, open_at, close_at)
        except msgspec.ValidationError as exc:
            raise StreamFallback(f"odd field types ({exc})") from None
        except msgspec.DecodeError:
            continue  # "]" of a list after the array, with a valid-looking rest: try an earlier one
        header_out.append(top)
        yield events
        return
    raise StreamFallback("no end of traceEvents")
