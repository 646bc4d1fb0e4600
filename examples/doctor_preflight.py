"""Preflight check of the distributed-training set-up before a long run.

    .venv/bin/python examples/doctor_preflight.py            # this machine, or the running cluster
    rayguard doctor --address auto --json                    # the same from the shell
"""

import sys

import rayguard.doctor

report = rayguard.doctor.run(address="auto")
print(report.format_table())
sys.exit(report.exit_code)
