"""The line reader splits a chunk at once in C and hands lists of lines to the readers of
a whole log: the same lines as splitting the file at each newline, whatever the chunk size,
a line too long given as ``None`` once, a last line without its newline kept for later."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rayguard.events.lines import EventSource, LineReader


def expected(data: bytes, max_line: int) -> list[bytes | None]:
    *whole, last = data.split(b"\n")
    out: list[bytes | None] = [line if len(line) <= max_line else None for line in whole]
    if len(last) > max_line:
        out.append(None)
    elif last.strip():
        out.append(last)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.booleans(), st.sampled_from([1, 3, 7, 16, 64, 1 << 16]), st.sampled_from([5, 20, 100]),
       st.booleans())
def test_batches_give_the_lines_of_the_file(tmp_path_factory, lines, newline_at_end, chunk,
                                            max_line, batched):
    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    path = tmp_path_factory.mktemp("log") / "rayguard_events.jsonl"
    path.write_bytes(data)
    reader = LineReader(EventSource("run", str(path)), chunk_bytes=chunk,
                        max_line_bytes=max_line)
    got = ([line for batch in reader.read_batches() for line in batch] if batched
           else list(reader.read()))
    tail = reader.finish()
    assert got + ([tail] if tail is not None else []) == expected(data, max_line)


def test_a_part_of_a_file_is_read_up_to_its_end(tmp_path):
    path = tmp_path / "rayguard_events.jsonl"
    path.write_bytes(b"a\nbb\nccc\ndddd\n")
    reader = LineReader(EventSource("run", str(path)), chunk_bytes=2, start=2, end=9)
    assert list(reader.read()) == [b"bb", b"ccc"] and reader.finish() is None
