"""What every child process of the server does first: logging, signals, and dying with its parent."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import logging
import os
import signal
import threading
import time

PR_SET_NAME = 15


def name_process(name: str) -> None:
    """The OS-visible name (top, ps -o comm, /proc/PID/comm), at most 15 bytes; Linux only, else a no-op."""
    path = ctypes.util.find_library("c")
    if path is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(path, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def setup_child(name: str, log_level: str) -> None:
    name_process(f"skiff-{name}")
    logging.basicConfig(
        level=log_level.upper(), format=f"%(asctime)s {name} %(levelname)s %(message)s", force=True
    )
    # Ctrl-C reaches the whole process group: only the API process decides how to shut down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    parent = os.getppid()

    def watch_parent() -> None:  # an orphaned worker would hold its memory (and GPU) forever
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch_parent, name="parent-watch", daemon=True).start()
