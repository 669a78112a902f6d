"""API keys the server accepts: a fixed `--api-key` and/or a key file (`--api-key-file`) of one key per line.

The file is re-read when it changes (checked at most once per `recheck` seconds, on the request path), so a
Kubernetes Secret mounted as a volume rotates without a restart: during a rotation the Secret lists the new
and the previous key, and the server accepts both. A key file that cannot be read or holds no key accepts
nothing (fail closed); the last good keys are not kept, since the file is the source of truth.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("skiff.serve")
RECHECK_SECONDS = 1.0


def parse_keys(text: str) -> tuple[str, ...]:
    """One key per line; blank lines and lines starting with # are ignored, whitespace is stripped."""
    keys = (line.strip() for line in text.splitlines())
    return tuple(dict.fromkeys(k for k in keys if k and not k.startswith("#")))


def read_key_file(path: Path) -> tuple[str, ...]:
    """The keys in `path`; raises ValueError naming the file when it cannot be read or holds none."""
    try:
        keys = parse_keys(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"API key file {path} cannot be read: {e}") from e
    if not keys:
        raise ValueError(f"API key file {path} holds no key (one key per line)")
    return keys


@dataclass
class KeyRing:
    """The accepted keys. `required` is False only when neither a key nor a key file was configured."""

    fixed: tuple[str, ...] = ()
    path: Path | None = None
    recheck: float = RECHECK_SECONDS
    _file_keys: tuple[str, ...] = ()
    _stamp: tuple[int, int, int] | None = None
    _checked: float = field(default=-1e18)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def configured(cls, key: str | None, key_file: str | None) -> KeyRing:
        """The ring for `--api-key` / `--api-key-file`; raises ValueError if the file is unusable now."""
        ring = cls(fixed=(key,) if key else (), path=Path(key_file) if key_file else None)
        if ring.path is not None:
            ring._file_keys = read_key_file(ring.path)
            ring._stamp = ring._file_stamp()
            ring._checked = time.monotonic()
        return ring

    @property
    def required(self) -> bool:
        return bool(self.fixed) or self.path is not None

    def _file_stamp(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)  # follows the symlinks a Secret volume swaps on update
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def keys(self) -> tuple[str, ...]:
        """Every accepted key now, the key file re-read if it changed since the last check."""
        if self.path is not None:
            now = time.monotonic()
            with self._lock:
                if now - self._checked >= self.recheck:
                    self._checked = now
                    self._reload()
        return self.fixed + self._file_keys

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp is not None and stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._file_keys = read_key_file(self.path)  # type: ignore[arg-type]
        except ValueError as e:
            log.warning("%s: every request with a key is refused until it is fixed", e)
            self._file_keys = ()
            return
        log.info("API key file %s re-read: %d key(s)", self.path, len(self._file_keys))

    def accepts(self, token: str) -> bool:
        """Constant-time comparison against every key (no early exit on the first match)."""
        given = token.encode()
        matched = False
        for key in self.keys():
            matched |= hmac.compare_digest(given, key.encode())
        return matched and bool(token)
