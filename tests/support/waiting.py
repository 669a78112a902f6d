"""Polling with a deadline: the one way tests wait for something that happens elsewhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def file_tail(path: Path | None, lines: int = 40) -> str:
    """The last lines of a log file ('' when there is none yet)."""
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def wait_for(
    check: Callable[[], T],
    timeout: float = 30.0,
    what: str = "condition",
    *,
    interval: float = 0.2,
    tolerate: tuple[type[BaseException], ...] = (),
    log: Path | None = None,
    until: Callable[[T], object] = bool,
) -> T:
    """Call `check()` until `until` holds for what it returns (by default: it is truthy), and return that.

    Exceptions of the `tolerate` types count as "not yet". On timeout: an AssertionError naming `what`, the
    last value seen and the tail of `log`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except tolerate as e:
            last = e
        else:
            if until(last):
                return last
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    tail = file_tail(log)
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}\n{tail}".rstrip()
    )
