"""Host heap policy for CPU engines: keep freed activation buffers instead of handing them back to the OS.

glibc serves blocks above its mmap threshold with fresh mappings and returns freed heap tops past its trim
threshold, so each forward step re-faults its activations page by page: ~140 k faults and over a third of
a 16 x 128 prefill's time on a 2-core VM (docs/performance.md). Raising both keeps the step's working
set mapped after the first step. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit; larger blocks are mapped regardless
_TRIM_THRESHOLD = (1 << 31) - 1


def retain_freed_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when glibc took them."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
    log.debug("glibc heap thresholds raised: %s", ok)
    return ok
