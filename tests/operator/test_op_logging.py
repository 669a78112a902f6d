"""The operator's log: every line once (one handler), kopf's per-object success chatter off at info."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import logging
from skiff_operator.main import configure_logging
configure_logging({level!r})
logging.getLogger("skiff_operator.handlers").info("reconciled models/a")
logging.getLogger("kopf.objects").info("Handler 'on_child' succeeded.")
logging.getLogger("kopf.objects").warning("Handler 'reconcile' failed temporarily")
"""


def _log(level: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", CODE.format(level=level)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def test_each_line_once_and_no_success_chatter_at_info():
    lines = _log("info")
    assert len(lines) == 2, lines
    assert "reconciled models/a" in lines[0] and "failed temporarily" in lines[1]


def test_debug_shows_kopf_handler_progress():
    lines = _log("debug")
    assert sum("on_child" in line for line in lines) == 1, lines


def test_warning_hides_info():
    assert ["failed temporarily" in line for line in _log("warning")] == [True]
