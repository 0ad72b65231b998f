"""Architecture B, the collaborative supply: data workers bring the cold rows over their own PS
links, with the samples, and the trainer fills its misses from them.

- ``resident_filter``: the trainer's resident set as a blocked Bloom filter per table, published
  through shared memory.
- ``shared_batch``: batch arrays and delivered rows packed into one shared-memory file.
- ``worker``: what runs in each data worker (build, filter, pull, pack).
- ``writeback_log``: the shard write counter of each row's last write-back (stale detection).
- ``supply``: the trainer side (delivered-row sources, filter publisher, counters).
"""

from cosparse.supply.collaborative.supply import CollaborativeSupply, SupplyFailure
from cosparse.supply.collaborative.worker import CollaborativeCodec, DeliveryError

__all__ = ["CollaborativeCodec", "CollaborativeSupply", "DeliveryError", "SupplyFailure"]
