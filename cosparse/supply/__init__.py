"""Supply paths: how rows reach the trainer, behind one interface (``types.SupplyPath``).

- ``paths``: the factory, ``make_supply_path``, from ``supply.path``;
- ``local``: ``LocalPath``, every row in this process (all resident, or tiered);
- ``ps_paths``: ``PSDirectPath`` (architecture A) and ``RemoteTierPath`` (tiers over the PS);
- ``collaborative``: architecture B, the data workers bring the cold rows (``CollaborativePath``);
- ``ps_connection``: the PS shards a path uses (start or reach, snapshots, restore, counters);
- ``placements``: which table class holds each table's rows; ``ps_direct``: A's two tables;
- ``leftovers``, ``shared_memory``: what runs leave behind, and where shared memory goes;
- ``versions``: A's stale-read check (``train.check_versions``).
"""
