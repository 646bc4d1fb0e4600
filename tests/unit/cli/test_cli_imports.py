"""The ``rayguard`` command does not import torch to parse its arguments (seconds on every
command: ``rayguard checkpoint`` used to import it through ``rayguard.checkpoint``)."""

from __future__ import annotations

import subprocess
import sys


def test_parsing_the_cli_does_not_import_torch():
    code = ("import sys; from rayguard.cli import build_parser; build_parser(); "
            "import rayguard.checkpoint.cli, rayguard.doctor.cli, rayguard.placement.cli; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_lazy_checkpoint_names_still_resolve():
    import rayguard.checkpoint as ckpt

    for name in ckpt.__all__:
        assert getattr(ckpt, name) is not None, name
