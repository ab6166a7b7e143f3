"""Lines as they arrive: what has come is answered at once, and windows fill from what is waiting."""

from __future__ import annotations

import io
import os

import pytest

from xspec.base.errors import UserError
from xspec.runtime.line_stream import MAX_LINE_BYTES, LineStream


def test_a_pipe_gives_what_has_arrived_without_waiting_for_more():
    read, write = os.pipe()
    with os.fdopen(read, "rb", buffering=0) as source, os.fdopen(write, "wb", buffering=0) as sink:
        lines = LineStream(source, "<stdin>")
        sink.write(b"one\ntwo\nthr")
        assert lines.take(10) == ["one", "two"]  # "thr" has not ended: not waited for
        sink.write(b"ee\n")
        assert lines.take(10) == ["three"]
        sink.write(b"a\nb\nc\n")
        assert lines.take(2) == ["a", "b"] and lines.take(2) == ["c"]
        sink.close()
        assert lines.take(10) == []


def test_the_last_line_needs_no_newline_and_empty_lines_are_lines():
    lines = LineStream(io.BytesIO("x\n\nü".encode()), "in.txt")
    assert lines.take(10) == ["x", "", "ü"] and lines.take(10) == []


def test_invalid_utf8_is_reported_with_its_line():
    lines = LineStream(io.BytesIO(b"fine\nbad \xff here\n"), "in.txt")
    with pytest.raises(UserError, match=r"in.txt:2: invalid UTF-8 \(byte 0xff at column 5\)"):
        lines.take(10)


def test_a_line_without_end_is_refused_at_its_bound():
    lines = LineStream(io.BytesIO(b"ok\n" + b"0" * (MAX_LINE_BYTES + 2)), "<stdin>")
    with pytest.raises(UserError, match=r"<stdin>:2: a line longer than 1,048,576 bytes"):
        lines.take(10)
