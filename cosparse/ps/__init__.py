"""Parameter server: shard server processes, the sharded client, the wire protocol, snapshots.

* ``protocol``: fixed binary header + raw numpy frames (no pickle), ``shard_of`` ownership;
* ``shard``: a shard's store (Tier + optimizer + versions) and its snapshots;
* ``server``: the ``cosparse ps serve`` process (ZeroMQ ROUTER), ``keygen``;
* ``client``: ``PSClient`` (one DEALER per shard, batched pull/push, timeouts, heartbeats);
* ``embedded``: ``EmbeddedShards``, local shard subprocesses for the embedded default.
"""

from cosparse.ps.client import PSAuthError, PSClient, PSError, PSUnavailable, PullResult
from cosparse.ps.embedded import EmbeddedShards
from cosparse.ps.protocol import shard_of

__all__ = ["EmbeddedShards", "PSAuthError", "PSClient", "PSError", "PSUnavailable", "PullResult",
           "shard_of"]
