"""Authenticated checkpoints: a manifest digest keyed with a secret kept outside storage.

A manifest's digests prove integrity only: whoever can write the checkpoint storage can
change a file, hash it again and rewrite (reseal) the manifest, and every check passes.
With a key (``CheckpointConfig(key_file=...)`` in the workers, or the file named by
``RAYGUARD_CHECKPOINT_KEY_FILE`` in any process: the workers, ``rayguard checkpoint
verify``), every manifest written carries an ``auth`` entry: a keyed digest over the whole
manifest document (every file's size and digest, the step, the world size, the metadata),
computed with the manifest's own function: BLAKE3's keyed mode for ``blake3`` manifests,
HMAC-SHA256 for ``sha256`` ones. A process with the key refuses a manifest without the
entry, with another key's, or whose document no longer matches it; a process without a
key checks integrity only, as before.

The key file is read as bytes (surrounding whitespace stripped, so ``openssl rand -hex 32
> key`` works) and must hold at least :data:`MIN_KEY_BYTES`. Only a short id derived from
it (never the key) is written into manifests and messages.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass, field
from typing import Any

from rayguard import runtime
from rayguard.checkpoint.fsio import NotRegularFileError, read_bounded
from rayguard.checkpoint.schemes import BLAKE3, SHA256
from rayguard.constants import CHECKPOINT_KEY_FILE_ENV_VAR
from rayguard.exceptions import CheckpointCorruptError, ConfigError

KEY_FILE_ENV_VAR = CHECKPOINT_KEY_FILE_ENV_VAR
"""The key file of processes given no ``CheckpointConfig(key_file=...)``."""
AUTH_KEY = "auth"
"""The manifest entry holding the keyed digest."""
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096
MACS = {SHA256: "hmac-sha256", BLAKE3: "blake3-keyed"}
"""The keyed function of each digest scheme, by the name the ``auth`` entry records."""
_CONTEXT = "rayguard 2026 checkpoint manifest key"


@dataclass(frozen=True)
class Key:
    """A checkpoint key (its bytes never appear in ``repr`` or messages)."""

    secret: bytes = field(repr=False)
    source: str = ""
    """Where it was read from (for messages)."""

    @property
    def key_id(self) -> str:
        """16 hex characters that name the key without revealing it."""
        return hmac.new(self.secret, b"rayguard key id", hashlib.sha256).hexdigest()[:16]

    def mac(self, mac_name: str, data: bytes) -> str:
        if mac_name == MACS[SHA256]:
            return hmac.new(self.secret, data, hashlib.sha256).hexdigest()
        import blake3  # a dependency; only blake3 manifests need it

        derived = blake3.blake3(self.secret, derive_key_context=_CONTEXT).digest()
        return str(blake3.blake3(data, key=derived).hexdigest())


def load_key(path: str | os.PathLike[str], field_name: str = "CheckpointConfig.key_file") -> Key:
    """The key in the file at ``path``; a ConfigError naming ``field_name`` when it cannot
    be one (missing, not a regular file, too short or too long)."""
    where = os.fspath(path)
    try:  # links followed (secrets are mounted through them), never a FIFO waited on
        data = read_bounded(where, MAX_KEY_BYTES + 64, follow=True).strip()
    except NotRegularFileError:
        raise ConfigError(f"{field_name}={where!r}: not a regular file. Fix: point it at "
                          "the file that holds the key") from None
    except OSError as exc:
        raise ConfigError(f"{field_name}={where!r}: cannot open the checkpoint key file "
                          f"({exc.strerror}). Fix: create it on every node (e.g. `openssl rand "
                          f"-hex 32 > {where}; chmod 600 {where}`), outside the checkpoint "
                          "storage") from None
    if not MIN_KEY_BYTES <= len(data) <= MAX_KEY_BYTES:
        raise ConfigError(f"{field_name}={where!r}: the key is {len(data)} bytes; it must hold "
                          f"{MIN_KEY_BYTES} to {MAX_KEY_BYTES}. Fix: `openssl rand -hex 32 > "
                          f"{where}`")
    return Key(data, where)


def use(key: Key | None) -> None:
    """Make ``key`` this worker's checkpoint key (its :mod:`rayguard.runtime`'s; ``None``:
    the environment's, if any)."""
    runtime.current().auth_key = key


def active() -> Key | None:
    """This worker's key: the one :func:`use` set, else the file named by
    :data:`KEY_FILE_ENV_VAR` (a ConfigError when it names a bad file), else ``None``."""
    key: Key | None = runtime.current().auth_key
    if key is not None:
        return key
    path = os.environ.get(KEY_FILE_ENV_VAR)
    return load_key(path, KEY_FILE_ENV_VAR) if path else None


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a manifest's keyed digest covers: the document without its ``auth``
    entry, with sorted keys and no spaces (the same bytes after a JSON round trip)."""
    body = {k: v for k, v in doc.items() if k != AUTH_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True).encode("ascii")


def sign(doc: dict[str, Any], scheme: str, key: Key) -> dict[str, str]:
    """The ``auth`` entry of the manifest document ``doc`` (its files hashed with ``scheme``)."""
    mac_name = MACS[scheme]
    return {"mac": mac_name, "key_id": key.key_id, "digest": key.mac(mac_name, canonical(doc))}


def check(doc: dict[str, Any], where: str, key: Key) -> None:
    """Raise CheckpointCorruptError unless the manifest document ``doc`` carries a keyed
    digest made with ``key`` that matches it."""
    entry = doc.get(AUTH_KEY)
    fix = ("it was written without the key, or resealed by someone who does not hold it; "
           "resume from a checkpoint written with the key, or verify without the key to "
           "check integrity only")
    if entry is None:
        raise CheckpointCorruptError(f"{where}: not authenticated: the manifest carries no "
                                     f"keyed digest and a checkpoint key is set ({key.source}); "
                                     + fix)
    if not isinstance(entry, dict) or entry.get("mac") not in MACS.values() or not isinstance(
            entry.get("digest"), str):
        raise CheckpointCorruptError(f"{where}: not authenticated: its auth entry is malformed; "
                                     + fix)
    if entry.get("key_id") != key.key_id:
        raise CheckpointCorruptError(
            f"{where}: not authenticated: signed with key id {str(entry.get('key_id'))[:16]!r}, "
            f"the key set here ({key.source}) is {key.key_id}; " + fix)
    if not hmac.compare_digest(key.mac(entry["mac"], canonical(doc)), entry["digest"]):
        raise CheckpointCorruptError(f"{where}: not authenticated: the keyed digest does not "
                                     "match the manifest (changed after it was signed); " + fix)


__all__ = ["AUTH_KEY", "KEY_FILE_ENV_VAR", "Key", "MACS", "MIN_KEY_BYTES", "active",
           "canonical", "check", "load_key", "sign", "use"]
