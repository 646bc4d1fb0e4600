"""A mistyped command gets the closest one; `checkpoint verify` on a run directory points to
`checkpoint ls`. In-process, no Ray."""

from __future__ import annotations

import pytest

from rayguard.checkpoint.reported import hash_directory, seal
from rayguard.cli import main


@pytest.mark.parametrize(("argv", "meant"), [(["evnets"], "events"),
                                             (["checkpoint", "verfy", "x"], "verify"),
                                             (["quarantine", "lsit", "x"], "list")])
def test_a_mistyped_subcommand_suggests_the_closest(argv, meant, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"did you mean {meant!r}" in capsys.readouterr().err


def test_nothing_close_is_argparses_plain_error(capsys):
    with pytest.raises(SystemExit):
        main(["zzz"])
    assert "did you mean" not in capsys.readouterr().err


def test_verify_on_a_run_directory_points_to_ls(tmp_path, capsys):
    ckpt = tmp_path / "checkpoint_000001"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"m")
    seal(ckpt, [hash_directory(ckpt, 0)], world_size=1, step=1)
    assert main(["checkpoint", "verify", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "NOT A RAYGUARD CHECKPOINT" in out and f"rayguard checkpoint ls {tmp_path}" in out
    assert main(["checkpoint", "verify", str(ckpt)]) == 0
