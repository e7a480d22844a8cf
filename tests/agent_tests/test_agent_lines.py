"""Line framing: whatever the chunking, the lines written come out, whole and once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.lines import LineSplitter

line_text = st.text(st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=40)


@st.composite
def written(draw):
    """(lines, bytes): each line ends with LF or CRLF; the last may have no end at all."""
    lines = draw(st.lists(line_text, max_size=30))
    ends = draw(st.lists(st.sampled_from(["\n", "\r\n"]), min_size=len(lines), max_size=len(lines)))
    data = "".join(line + end for line, end in zip(lines, ends))
    last = draw(st.one_of(st.just(""), line_text))
    if last:
        lines = lines + [last]
        data += last
    return lines, data.encode()


def chunks_of(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=300)
@given(written(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_splitter_yields_written_lines_whatever_the_chunking(case, cuts):
    lines, data = case
    splitter = LineSplitter()
    out = []
    for chunk in chunks_of(data, cuts):
        out += splitter.feed(chunk)
    out += splitter.finish()
    assert out == lines
    assert splitter.consumed == len(data)


def test_splitter_holds_partial_line_until_newline():
    splitter = LineSplitter()
    assert splitter.feed(b"CUDA error: out of") == []
    assert splitter.pending_bytes == len(b"CUDA error: out of")
    assert splitter.feed(b" memory\r\nnext") == ["CUDA error: out of memory"]
    assert splitter.finish() == ["next"]


def test_splitter_replaces_bytes_that_are_not_utf8():
    assert LineSplitter().feed(b"gpu \xff\xfe temp 81\xc2\xb0C\n") == ["gpu \ufffd\ufffd temp 81\u00b0C"]


def test_splitter_cuts_an_endless_line_on_a_character_boundary():
    splitter = LineSplitter(max_line_bytes=8)
    out = splitter.feed("ééééé".encode() + b"abc")  # 10 bytes of é, then 3
    out += splitter.feed(b"\n")
    assert all(len(piece.encode()) <= 8 for piece in out)
    assert "".join(out) == "éééééabc"
    assert "\ufffd" not in "".join(out)
