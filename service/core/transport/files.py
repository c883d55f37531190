"""Small local files qstate writes for its user: tokens, keys, certificates. A secret one is
mode 0600 from the moment it exists, never readable by others, not even for a moment."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_file"]


def write_file(path: Path, data: bytes, secret: bool) -> None:
    """``data`` to a file made anew (0600 when ``secret``, else 0644): an older file at
    ``path`` is removed first, so its looser mode is not kept."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
