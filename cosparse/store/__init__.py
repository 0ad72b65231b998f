"""One table's rows: the ID->slot map, dedup, slabs and (later) tiers, hotness and eviction."""
