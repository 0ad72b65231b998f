"""Where a run's shared-memory files go, in directories named for the run's owner, so that the
leftovers of a run that died are found and swept by the next one (``cosparse.owner``)."""

from __future__ import annotations

import os
import tempfile

from cosparse.owner import owner_tag


def shared_base() -> str:
    """Where shared-memory files go: ``/dev/shm`` where there is one, else the temp dir."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def shared_dir(prefix: str = "cosparse-") -> str:
    """A new private directory in shared memory, named ``<prefix><owner tag>-<random>``: the
    trainer removes it when it closes, and if it dies first, the next run sweeps it
    (``cosparse.owner``)."""
    return tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=shared_base())
