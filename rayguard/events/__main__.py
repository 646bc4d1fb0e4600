"""``python -m rayguard.events RUN_DIR [--follow] [--kind K] ...``: the same as
``rayguard events`` (the command itself is :mod:`rayguard.observe.cli`'s)."""

import sys

from rayguard.observe.cli import events_main

if __name__ == "__main__":
    sys.exit(events_main())
