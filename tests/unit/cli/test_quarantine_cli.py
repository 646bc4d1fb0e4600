"""``rayguard quarantine list|lift`` over a run directory's quarantine file, hostile files
included."""

from __future__ import annotations

import json

import pytest

from rayguard.cli import main
from rayguard.health import quarantine_file
from rayguard.health.quarantine import NodeFailure, Quarantined

A, B = "ab12cd" + "0" * 50, "ab12ce" + "1" * 50


def quarantine(run_dir, *nodes: str) -> None:
    quarantine_file.add(quarantine_file.quarantine_path(run_dir), [
        Quarantined(n, "killed", (NodeFailure(n, 0, "killed", 1, "worker process died"),
                                  NodeFailure(n, 1, "killed", 0, "worker process died")))
        for n in nodes])


def test_list_shows_node_reason_and_attempts(tmp_path, capsys) -> None:
    assert main(["quarantine", "list", str(tmp_path)]) == 0
    assert "no node is quarantined" in capsys.readouterr().out
    quarantine(tmp_path, A)
    assert main(["quarantine", "list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert A in out and "killed" in out and "attempts 0, 1" in out and "worker process died" in out
    assert main(["quarantine", "list", str(tmp_path), "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert list(state["nodes"]) == [A] and state["nodes"][A]["failures"][1]["attempt"] == 1


def test_lift_by_full_id_prefix_or_all(tmp_path, capsys) -> None:
    quarantine(tmp_path, A, B)
    path = quarantine_file.quarantine_path(tmp_path)
    assert main(["quarantine", "lift", str(tmp_path), "ab12c"]) == 1  # too short: no match
    assert main(["quarantine", "lift", str(tmp_path), "ab12cd"]) == 0
    assert f"lifted {A}" in capsys.readouterr().out
    state = quarantine_file.read(path)
    assert list(state["nodes"]) == [B] and list(state["lifted"]) == [A]
    assert main(["quarantine", "lift", str(tmp_path), "--all"]) == 0
    assert quarantine_file.read(path)["nodes"] == {}
    assert main(["quarantine", "lift", str(tmp_path), "--all"]) == 0
    assert "no node was quarantined" in capsys.readouterr().out
    quarantine(tmp_path, A)  # quarantined again: no longer listed as lifted
    assert A not in quarantine_file.read(path)["lifted"]


def test_lift_errors_say_what_to_do(tmp_path, capsys) -> None:
    quarantine(tmp_path, A, B)
    assert main(["quarantine", "lift", str(tmp_path), "ab12c"]) == 1
    err = capsys.readouterr().err
    assert "'ab12c' is not quarantined" in err and "ab12cd000000" in err
    assert main(["quarantine", "lift", str(tmp_path), "ab12"]) == 1
    assert main(["quarantine", "lift", str(tmp_path)]) == 2
    assert "or pass --all" in capsys.readouterr().err
    assert main(["quarantine", "lift", str(tmp_path), A, "--all"]) == 2
    assert main(["quarantine", "list", str(tmp_path / "missing")]) == 2
    assert "no directory" in capsys.readouterr().err
    assert main(["quarantine", "list", "s3://bucket/run"]) == 2
    assert "remote" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b'{"nodes": [1]}',
                                     b'{"lifted": 3}', b"{" * 100 + b"}" * 100,
                                     b'{"nodes": {}, "x": "' + b"y" * (5 << 20) + b'"}'])
def test_a_hostile_file_is_refused_never_run(tmp_path, capsys, content) -> None:
    quarantine_file.quarantine_path(tmp_path).write_bytes(content)
    assert main(["quarantine", "list", str(tmp_path)]) == 2
    assert "rayguard quarantine:" in capsys.readouterr().err
    assert main(["quarantine", "lift", str(tmp_path), "--all"]) == 2


def test_terminal_escapes_in_a_node_id_are_made_inert(tmp_path, capsys) -> None:
    evil = "\x1b]0;pwned\x07" + "a" * 10
    quarantine(tmp_path, evil)
    assert main(["quarantine", "list", str(tmp_path)]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_lift_under_json(tmp_path, capsys) -> None:
    quarantine(tmp_path, A)
    assert main(["quarantine", "lift", str(tmp_path), "zzzzzzz", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    assert main(["quarantine", "lift", str(tmp_path), A, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "lifted": [A]}
    assert main(["quarantine", "list", str(tmp_path / "nope"), "--json"]) == 2
    assert "no directory" in json.loads(capsys.readouterr().out)["error"]


def test_an_entry_with_failures_7_is_dropped_and_the_list_prints(tmp_path, capsys) -> None:
    quarantine(tmp_path, A)
    path = quarantine_file.quarantine_path(tmp_path)
    state = json.loads(path.read_text())
    state["nodes"][B] = {"reason": "killed", "time": 1.0, "failures": 7}
    state["nodes"]["a"] = 1
    path.write_text(json.dumps(state))
    assert main(["quarantine", "list", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert A in captured.out and B not in captured.out
    assert main(["quarantine", "list", str(tmp_path), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["nodes"]) == [A]


def test_list_says_which_entries_this_run_recorded(tmp_path, capsys) -> None:
    from rayguard.constants import EVENTS_FILENAME
    from rayguard.events import make_event

    quarantine(tmp_path, A, B)  # B: only in the file (planted, or a run without a log)
    event = make_event("node_quarantined", "quarantined", node=A, reason="killed",
                       attempts=[0, 1])
    (tmp_path / EVENTS_FILENAME).write_text(json.dumps(event) + "\n")
    assert main(["quarantine", "list", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{A}  [this run]" in out and f"{B}  [file]" in out
    assert main(["quarantine", "list", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sources"] == {A: "this run", B: "file"}
