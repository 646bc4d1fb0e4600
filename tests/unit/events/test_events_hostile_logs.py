"""Event logs that come from elsewhere (a shared run directory): crafted lines are skipped,
never a crash; what the CLIs print is inert; the report's data block cannot be broken out
of; reading and following are streamed in bounded memory. Real files, the real commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest

from rayguard.cli import main
from rayguard.events.read import follow, locate, read_log

GOOD = {"time": 100.0, "kind": "start", "rank": None, "node": None, "step": None, "attempt": 0,
        "detail": "fit() started"}
GOOD2 = {"time": 101.0, "kind": "finished", "rank": None, "node": None, "step": 3, "attempt": 0,
         "detail": "done"}

HOSTILE_LINES = [
    b'{"time": 1e999, "kind": "restart", "attempt": 0, "detail": "inf time"}',
    b'{"time": -1e999, "kind": "restart", "attempt": 0, "detail": "-inf time"}',
    b'{"time": NaN, "kind": "restart", "detail": "nan literal"}',
    b'{"time": ' + b"9" * 5000 + b', "kind": "restart", "detail": "huge int"}',
    b'{"time": ' + b"9" * 400 + b', "kind": "start", "detail": "int too large for a float"}',
    b'{"kind": "restart", "detail": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"kind": "restart", "x": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
    b'{"kind": ["not", "a", "string"], "detail": "unhashable kind"}',
    b"[1, 2, 3]",
    b'"just a string"',
    b"\xff\xfe\x00garbage\x80",
    b'{"time": 102, "kind": "worker_died", "detail": "lone \\ud800 surrogate"}',
]


def _write_log(directory, lines):
    with open(directory / "rayguard_events.jsonl", "wb") as f:
        f.write(json.dumps(GOOD).encode() + b"\n")
        for line in lines:
            f.write(line + b"\n")
        f.write(json.dumps(GOOD2).encode() + b"\n")


def test_crafted_lines_are_skipped_by_rayguard_events(tmp_path, run_cli):
    _write_log(tmp_path, HOSTILE_LINES)
    for extra in ((), ("--json",)):
        proc = run_cli(["events", tmp_path, *extra])  # printed to UTF-8, strict: no surrogate
        assert proc.rc == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        out = proc.stdout
        assert "fit() started" in out and "done" in out
        assert "lone" in out  # the surrogate is replaced, the event kept
    parsed = read_log(locate(str(tmp_path)))
    assert [e["kind"] for e in parsed.events] == ["start", "finished", "worker_died"]
    assert parsed.bad_lines == len(HOSTILE_LINES) - 1


def test_crafted_lines_are_skipped_by_rayguard_report(tmp_path, run_cli):
    _write_log(tmp_path, HOSTILE_LINES)
    out = tmp_path / "report.html"
    proc = run_cli(["report", tmp_path, "-o", out, "--json"])
    assert proc.rc == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    from rayguard.observe.report import embedded_data

    data = embedded_data(out.read_text(encoding="utf-8"))
    assert data["bad_lines"] == len(HOSTILE_LINES) - 1


ESCAPES = "\x1b[2J\x1b[H\x1b[32mOK everything verified\x1b[0m\r\x08\x9b31m\u202e"


def test_terminal_escapes_in_details_are_printed_inert(tmp_path, run_cli):
    event = {**GOOD2, "detail": ESCAPES, "node": "\x1b]0;title\x07", "kind": "finished\x1b[2K"}
    _write_log(tmp_path, [json.dumps(event).encode()])
    for extra in ((), ("--json",)):
        proc = run_cli(["events", tmp_path, *extra])
        assert proc.rc == 0
        out = proc.stdout
        assert not any(c in out for c in "\x1b\r\x08\x07\x9b\u202e"), repr(out)
    assert "\\x1b[2J" in run_cli(["events", tmp_path]).stdout


def test_report_data_block_escapes_every_angle_bracket(tmp_path):
    pytest.importorskip("plotly")
    detail = "<!--<script>alert(1)</script> & </script><b>x</b>"
    events = [GOOD, {**GOOD2, "kind": "worker_died", "rank": 1, "detail": detail,
                     "failure": "<!--<script>"},
              {**GOOD2, "kind": "restart", "cause": "<!--<script>"}, GOOD2]
    with open(tmp_path / "rayguard_events.jsonl", "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    start = page.index('id="rayguard-report-data">') + len('id="rayguard-report-data">')
    block = page[start:page.index("</script>", start)]
    assert "<" not in block and ">" not in block and "&" not in block
    assert "<!--<script>" not in page
    from rayguard.observe.report import embedded_data

    data = embedded_data(page)
    assert data["faults"][0]["detail"].startswith("<!--<script>alert(1)")
    assert data["restarts"][0]["cause"] == "<!--<script>"


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


LOG_BYTES = 24 << 20
BOUND_BYTES = 6 << 20  # a few lines and read chunks, far below the log's size


def test_rayguard_events_streams_a_large_log(tmp_path, capsys):
    line = (json.dumps({**GOOD, "detail": "x" * 900}) + "\n").encode()
    with open(tmp_path / "rayguard_events.jsonl", "wb") as f:
        for _ in range(LOG_BYTES // len(line)):
            f.write(line)
    peak = _peak_bytes(lambda: main(["events", str(tmp_path), "--kind", "no-such-kind"]))
    capsys.readouterr()
    assert peak < BOUND_BYTES, f"peak {peak} bytes for a {LOG_BYTES}-byte log"


def test_follow_does_not_buffer_a_line_without_newline(tmp_path):
    path = tmp_path / "rayguard_events.jsonl"
    with open(path, "wb") as f:
        f.write(json.dumps(GOOD).encode() + b"\n" + b"x" * LOG_BYTES)  # never ends
    polls = {"n": 0}

    def stop():
        polls["n"] += 1
        if polls["n"] == 1:  # the endless line ends at last; a good event follows
            with open(path, "ab") as f:
                f.write(b"\n" + json.dumps(GOOD2).encode() + b"\n")
        return polls["n"] >= 2

    kinds: list[str] = []
    peak = _peak_bytes(lambda: kinds.extend(
        e["kind"] for e in follow(locate(str(tmp_path)), poll_s=0.0, stop=stop)))
    assert kinds == ["start", "finished"]
    assert peak < BOUND_BYTES, f"peak {peak} bytes following a {LOG_BYTES}-byte line"


def test_follow_cli_survives_crafted_lines_appended_live(tmp_path):
    path = tmp_path / "rayguard_events.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "rayguard", "events", str(tmp_path), "-f",
                             "--poll-s", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert b"fit() started" in proc.stdout.readline() + proc.stdout.readline()
        with open(path, "ab") as f:
            f.write(b"\n".join(HOSTILE_LINES) + b"\n" + json.dumps(GOOD2).encode() + b"\n")
        lines: list[bytes] = []
        reader = threading.Thread(target=lambda: lines.extend(
            iter(lambda: proc.stdout.readline(), b"")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        deadline = time.monotonic() + 120
        while not any(b"done" in ln for ln in lines) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        assert any(b"done" in ln for ln in lines)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("line", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_each_crafted_line_alone_is_skipped_by_events_and_report(tmp_path, capsys, line):
    pytest.importorskip("plotly")
    _write_log(tmp_path, [line])
    assert main(["events", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 0
    capsys.readouterr()


def test_a_nan_literal_from_an_older_writer_reads_as_the_string_written_today(tmp_path):
    from rayguard.events import read

    (tmp_path / "rayguard_events.jsonl").write_bytes(
        b'{"kind": "nan_detected", "time": 1.0, "value": NaN, "detail": "x"}\n'
        b'{"kind": "steps", "time": 2.0, "mean": Infinity, "detail": "y"}\n')
    events = read(tmp_path)
    assert [(e["kind"], e.get("value", e.get("mean"))) for e in events] == [
        ("nan_detected", "nan"), ("steps", "inf")]


def test_a_link_planted_at_the_event_log_is_never_written_through(tmp_path):
    from rayguard.events import EventLog, make_event

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "rayguard_events.jsonl").symlink_to(victim)
    EventLog(run / "rayguard_events.jsonl").append(make_event("start", "fit() started"))
    assert victim.read_text() == "precious\n"
    fifo = tmp_path / "run2" / "rayguard_events.jsonl"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    EventLog(fifo).append(make_event("start", "fit() started"))  # refused, does not block
