"""Free TCP ports on 127.0.0.1, the only address the tests listen on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS's pick for an ephemeral bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
