"""Where numba keeps the engine's compiled kernels: one folder per version of cosparse's sources.

numba checks a cached build against the timestamp of the file that defines the kernel, not
against the files of the functions it inlines. ``init_row`` (``store/kernels/rows.py``) is
compiled into the parameter server's kernels (``ps/shard_kernels.py``): after a change to it,
numba's default cache (``__pycache__`` beside each file) loads the shard kernels' old machine
code, and a PS shard initialises new rows one way while the trainer does it another. The same
happens to an upgrade that leaves a file's size and timestamp alone.

So ``import cosparse`` points numba's cache at a folder named by a digest of every cosparse
source file (``$XDG_CACHE_HOME/cosparse/numba/<digest>``, default ``~/.cache``): any change to
any source compiles afresh, and two checkouts of different versions never share builds.
Child processes inherit the folder through ``NUMBA_CACHE_DIR``. Folders unused for a week are
removed at import. A ``NUMBA_CACHE_DIR`` that the environment sets is used as it is. Where the
folder cannot be made, numba falls back to its default cache.

It must run before any kernel module is imported: numba picks a kernel's cache folder when the
kernel is decorated.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

VARIABLE = "NUMBA_CACHE_DIR"
KEEP_UNUSED_S = 7 * 24 * 3600


def source_digest(package: Path) -> str:
    """A digest of every ``.py`` file under ``package`` (paths and contents)."""
    h = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cosparse" / "numba"


def _sweep(root: Path, keep: Path) -> None:
    """Remove the folders of other source versions that nothing used for a week."""
    cutoff = time.time() - KEEP_UNUSED_S
    for old in root.iterdir():
        try:
            if old != keep and old.is_dir() and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            continue


def configure() -> str | None:
    """Set numba's cache folder for this process and its children; returns the folder, or
    None when the environment chose one (or none could be made)."""
    if os.environ.get(VARIABLE):
        return None
    root = cache_root()
    folder = root / source_digest(Path(__file__).resolve().parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # in use: the sweep of other processes keeps it
        _sweep(root, folder)
    except OSError:
        return None
    os.environ[VARIABLE] = str(folder)
    if "numba" in sys.modules:  # imported before cosparse: its config has read the environment
        from numba.core import config

        config.CACHE_DIR = str(folder)
    return str(folder)


FOLDER = configure()
