"""Numba kernels for host-side ID work: hashing, the ID->slot map, dedup, the transposed bag index,
row gathers and deterministic row initialisation. They take arrays, never objects.

All kernels are compiled with ``cache=True`` and without fastmath; the row-parallel ones use
``prange`` and never reduce across rows, so results do not depend on the thread count.

Callers use ``from cosparse.store import kernels`` and ``kernels.<name>``; the kernels live in
one module per job:

* ``hashing``: ``mix64``, a key's bucket, backward-shift deletion (shared by every hash table);
* ``idmap``: the ID -> slot map (``map_*``);
* ``batch``: per-batch ``dedup`` and ``transpose_bags`` / ``transpose_counted``;
* ``rows``: ``gather_rows``, ``init_rows``, ``take_rows`` / ``put_rows`` / ``move_rows``;
* ``future``: the horizon, the latest batch beyond the pinned window that needs an ID
  (``future_enter`` / ``future_get`` / ``future_rehash``);
* ``eviction``: access statistics, pins and ``select_victims`` (``POLICY_*``);
* ``planning``: a device tier's hits of a plan (``plan_hits``) and the admission of its
  misses with the batch's access (``admit``);
* ``sketch``: admission by a count-min sketch (``cms_observe``);
* ``variants``: cached builds of one function with different flags (serial, parallel).

numba's cache notices a change to a kernel's own file only, not to the helpers inlined into it
(``hashing``, ``rows.init_row``): ``cosparse.numba_cache`` therefore keeps the builds in a
folder per version of the sources.
"""

from cosparse.store.kernels.batch import dedup, transpose_bags, transpose_counted
from cosparse.store.kernels.eviction import (
    POLICY_HOTNESS,
    POLICY_LFU,
    POLICY_LRU,
    add_pins,
    select_victims,
    touch,
)
from cosparse.store.kernels.future import future_enter, future_get, future_rehash
from cosparse.store.kernels.hashing import mix64
from cosparse.store.kernels.idmap import (
    map_erase,
    map_insert,
    map_lookup,
    map_lookup_or_insert,
    map_rehash,
)
from cosparse.store.kernels.planning import admit, plan_hits
from cosparse.store.kernels.rows import (
    gather_rows,
    init_rows,
    init_rows_serial,
    move_rows,
    put_rows,
    take_rows,
)
from cosparse.store.kernels.sketch import cms_observe

__all__ = [
    "POLICY_HOTNESS",
    "POLICY_LFU",
    "POLICY_LRU",
    "add_pins",
    "admit",
    "cms_observe",
    "dedup",
    "future_enter",
    "future_get",
    "future_rehash",
    "gather_rows",
    "init_rows",
    "init_rows_serial",
    "map_erase",
    "map_insert",
    "map_lookup",
    "map_lookup_or_insert",
    "map_rehash",
    "mix64",
    "move_rows",
    "plan_hits",
    "put_rows",
    "select_victims",
    "take_rows",
    "touch",
    "transpose_bags",
    "transpose_counted",
]
