"""Shard discovery through torch.distributed's TCPStore (the store torchrun starts).

A shard started with ``--announce HOST:PORT`` writes its endpoint under
``cosparse/ps/<num_shards>/<shard>``; a trainer launched by torchrun reads them back from the
store at ``MASTER_ADDR:MASTER_PORT`` (or ``store.remote.tcpstore``), waiting up to a timeout and
naming the shards that never announced themselves.
"""

from __future__ import annotations

import os
from datetime import timedelta


def _key(num_shards: int, shard: int) -> str:
    return f"cosparse/ps/{num_shards}/{shard}"


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TCPStore address {address!r}: expected HOST:PORT")
    return host, int(port)


def _client(address: str, timeout_s: float):  # noqa: ANN202 - torch type
    from torch.distributed import TCPStore

    host, port = _split(address)
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def store_address_from_env() -> str | None:
    """``MASTER_ADDR:MASTER_PORT`` when launched by torchrun, else None."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    return f"{addr}:{port}" if addr and port else None


def announce(address: str, num_shards: int, shard: int, endpoint: str, timeout_s: float = 30.0
             ) -> None:
    """Publish one shard's endpoint in the TCPStore at ``address``."""
    _client(address, timeout_s).set(_key(num_shards, shard), endpoint)


def discover(address: str, num_shards: int, timeout_s: float = 60.0) -> list[str]:
    """The endpoints of shards 0..num_shards-1, waiting up to ``timeout_s`` for them."""
    store = _client(address, timeout_s)
    keys = [_key(num_shards, i) for i in range(num_shards)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception as e:  # torch raises a generic error on timeout
        missing = [i for i, k in enumerate(keys) if not store.check([k])]
        raise TimeoutError(
            f"PS discovery through the TCPStore at {address}: shards {missing} of {num_shards} "
            f"did not announce themselves within {timeout_s:g} s ({e})"
        ) from None
    return [store.get(k).decode() for k in keys]
