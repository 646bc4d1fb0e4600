"""Targets for rayguard.connect.call_connected in tests: no Ray, just the protocol."""

from __future__ import annotations

import os
import sys
import time


def answer(notify, *, value):
    print("noise on stdout must not corrupt the protocol")
    notify("connecting", address="fake:1")
    notify("connected")
    return {"echo": value}


def raise_error(notify):
    raise ValueError("bad thing")


def die(notify):
    sys.stderr.write("dying now\n")
    sys.stderr.flush()
    os._exit(3)


def hang_connecting(notify):
    notify("connecting", address="fake:2")
    time.sleep(600)


def refused(notify):
    notify("connecting", address="fake:3")
    # What Ray 2.60's C++ client logs against a token-auth GCS without our token.
    sys.stderr.write("[2026-11-30 17:51:15,765 W 21859 21859] gcs_client.cc:210: Failed to get "
                     "cluster ID from GCS server: Unauthenticated: RPC error: InvalidAuthToken: "
                     "Authentication token is missing or incorrect\n")
    sys.stderr.flush()
    time.sleep(600)
