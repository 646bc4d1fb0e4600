"""A remote run's event log reaches its storage during the run, not only when ``fit()`` ends.

With remote storage (S3, GCS: ``RunConfig(storage_filesystem=...)`` or a URI), the run's
coordinator writes the log on the driver's node and :class:`LogUploader`, a thread of the
driver, copies it into the run directory every ``interval_s`` seconds when it has grown,
and once more when ``fit()`` ends (:meth:`LogUploader.stop`). A driver that dies mid-run
loses at most the last ``interval_s`` of its history; ``rayguard events`` and ``rayguard
report`` read the log from storage while the run goes on. Each upload copies the whole file
(object stores have no append); a long run's log of a few MB costs one small PUT every few
seconds.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from rayguard.constants import EVENTS_FILENAME

logger = logging.getLogger("rayguard")

UPLOAD_INTERVAL_S = 5.0
"""How often a remote run's event log is uploaded while it grows."""


class LogUploader:
    """Copies the local log ``events_file`` to ``run_dir`` on the pyarrow filesystem ``fs``
    whenever it has grown, every ``interval_s`` seconds, in a daemon thread."""

    def __init__(self, events_file: str, run_dir: str, fs: Any,
                 interval_s: float = UPLOAD_INTERVAL_S) -> None:
        self.events_file = events_file
        self.target = f"{run_dir.rstrip('/')}/{EVENTS_FILENAME}"
        self.run_dir = run_dir
        self.fs = fs
        self.interval_s = interval_s
        self.uploads = 0
        """How many uploads were made (each one the whole log)."""
        self._size = -1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._warned = False

    def start(self) -> LogUploader:
        self._thread = threading.Thread(target=self._run, name="rayguard-log-upload",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.upload()

    def upload(self) -> bool:
        """Upload the log if it grew since the last upload (True: it was uploaded)."""
        with self._lock:
            try:
                size = os.stat(self.events_file).st_size
            except OSError:
                return False
            if size == self._size:
                return False
            from pyarrow.fs import LocalFileSystem, copy_files

            try:
                self.fs.create_dir(self.run_dir, recursive=True)
                copy_files(self.events_file, self.target, source_filesystem=LocalFileSystem(),
                           destination_filesystem=self.fs)
            except OSError as exc:
                if not self._warned:  # once: the next uploads try again quietly
                    logger.warning("rayguard: could not upload the event log %s to %s: %s",
                                   self.events_file, self.run_dir, exc)
                    self._warned = True
                return False
            self._size = size
            self.uploads += 1
            return True

    def stop(self) -> None:
        """End the thread, then upload what the log holds now (the end of ``fit()``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.upload()


__all__ = ["UPLOAD_INTERVAL_S", "LogUploader"]
