"""Parameter server: shard server processes, the sharded client, the wire protocol, snapshots.

* ``protocol``: fixed binary header + raw numpy frames (no pickle), ``shard_of`` ownership;
* ``shard``: a shard's store and its requests; ``shard_table``: one table's rows (Tier +
  optimizer + versions); ``limits``: ``ShardLimits`` and ``ShardError``; ``table_config``: table
  configs from the wire; ``namespaces``: tables keyed by (namespace, table), quotas and request
  accounting per namespace; ``snapshot_format``: a shard's snapshots on disk;
* ``server``: the ``cosparse ps serve`` process (ZeroMQ ROUTER); ``keys``: key files, ``keygen``;
* ``client``: ``PSClient`` (batched pull/push split by shard and into chunks); ``connections``:
  one DEALER per shard plus a heartbeat one, and the shards' health; ``call``: one round of
  requests (HMAC sessions, timeouts); ``errors``: what the client raises;
* ``embedded``: ``EmbeddedShards``, local shard subprocesses for the embedded default;
* ``snapshots``: snapshots outside a shard (pruning, leftovers); ``discovery``: shard endpoints
  published in a TCPStore.
"""

from cosparse.ps.client import PSClient, PullResult
from cosparse.ps.embedded import EmbeddedShards
from cosparse.ps.errors import PSAccessDenied, PSAuthError, PSError, PSFull, PSNonFinite, PSUnavailable
from cosparse.ps.protocol import shard_of

__all__ = ["EmbeddedShards", "PSAccessDenied", "PSAuthError", "PSClient", "PSError", "PSFull", "PSNonFinite",
           "PSUnavailable", "PullResult", "shard_of"]
