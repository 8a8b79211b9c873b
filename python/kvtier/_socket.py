"""Where kvtier's programs find kvtierd: ``$KVTIER_SOCKET`` names the socket for every one of
them (kvtierd, kvtierctl, kvtier-run and this package); /run/kvtier/kvtierd.sock is the host's
daemon."""

from __future__ import annotations

import os

SOCKET_ENV = "KVTIER_SOCKET"
DEFAULT_SOCKET = "/run/kvtier/kvtierd.sock"


def daemon_from_env() -> str | None:
    """``"unix:" + $KVTIER_SOCKET`` when that is set and not empty, else None (local pools)."""
    path = os.environ.get(SOCKET_ENV, "")
    if not path:
        return None
    return path if path.startswith("unix:") else "unix:" + path
