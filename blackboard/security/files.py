"""Writing secrets to disk: seeds, credentials, keys, passwords."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_private"]


def write_private(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only (mode 0600 from its creation),
    replacing the file at once (a crash leaves the old one or the new one). A missing parent
    directory is made with mode 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
