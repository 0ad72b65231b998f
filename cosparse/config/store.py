"""The ``store`` section: where rows live (device and host tiers, the parameter server), and its
rules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from cosparse.config.errors import ConfigError
from cosparse.config.sizes import parse_bytes

if TYPE_CHECKING:
    from cosparse.config.root import Config


@dataclass
class TierConfig:
    """A tier's capacity, as ``budget_bytes`` (split across tables) or ``rows`` (per table)."""

    budget_bytes: int | str | None = None
    rows: int | None = None
    policy: Literal["lru", "lfu", "hotness"] = "hotness"


@dataclass
class HostTierConfig(TierConfig):
    policy: Literal["lru", "lfu", "hotness"] = "lfu"
    spill: bool = False  # rows the host evicts go to the tier below: see spill_to
    # an in-process store, or the PS (store.remote; supply.path ps-tiered or collaborative)
    spill_to: Literal["memory", "remote"] = "memory"


DEFAULT_NAMESPACE = "default"  # a single model's PS namespace, and where old snapshots load
# a PS table, namespace or snapshot name (the shards check the same pattern on the wire)
PS_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"


@dataclass
class QuotaConfig:
    """What one namespace may hold on each PS shard (``store.remote.quota``)."""

    rows: int | None = None
    bytes: int | str | None = None  # rows' values and optimizer state: rows * width * 4


@dataclass
class RemoteConfig:
    """The parameter server: embedded shard processes, or running ones at ``endpoints``."""

    embedded: bool = True
    num_shards: int = 2
    endpoints: list[str] = field(default_factory=list)  # host:port per shard, in shard order
    # tcpstore: read the endpoints that shards announced (`ps serve --announce`) from the
    # TCPStore at `tcpstore`, or at torchrun's MASTER_ADDR:MASTER_PORT
    discovery: Literal["config", "tcpstore"] = "config"
    tcpstore: str | None = None
    data_dir: str | None = None  # embedded shards' snapshots (default: a temporary directory)
    timeout_s: float = 30.0  # a request not answered in this time fails, naming the shard
    heartbeat_s: float = 1.0
    # HMAC shared-secret file (from `cosparse ps keygen`); with `ps serve --namespaces`, the key
    # of this run's namespace
    auth_key: str | None = None
    max_rows: int | None = None  # embedded shards: each one's row budget (ps serve --max-rows)
    max_bytes: int | None = None  # and byte budget (ps serve --max-bytes; default: half the RAM)
    # the PS snapshots kept, of the newest saves (default train.checkpoint.keep): how far back
    # `cosparse export --since` reaches; each kept checkpoint's snapshots stay regardless
    snapshot_keep: int | None = None
    # the PS namespace of this run's tables (default: "default"; in a multi-model run each
    # model's name): tables of two namespaces never share rows, unless tables[i].shared_as says so
    namespace: str | None = None
    # this namespace's rows / bytes on each shard (at most), sent with REGISTER: for embedded
    # shards, or external ones without `ps serve --namespaces` (one trust domain); a shard with
    # a namespaces file refuses it (its operator sets quotas there)
    quota: QuotaConfig | None = None

    @property
    def namespace_name(self) -> str:
        """The namespace this run's tables live in on the PS."""
        return self.namespace or DEFAULT_NAMESPACE


@dataclass
class StoreConfig:
    """Where rows live. No device capacity: every row resident on the device (the reference)."""

    device: TierConfig = field(default_factory=TierConfig)
    host: HostTierConfig = field(default_factory=HostTierConfig)
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    decay: float = 0.99  # per-batch decay of the hotness counts
    probe_batches: int = 4  # first batches read at start-up to size and check the tiers
    # Not exact by design, so off by default (and outside the exactness matrix):
    admit_after: int = 0  # an ID gets its own row after this many sightings (0/1: at once)
    ttl_steps: int = 0  # rows untouched this many batches are dropped from every tier (0: off)

    @property
    def tiered(self) -> bool:
        return self.device.rows is not None or self.device.budget_bytes is not None


def validate_store(cfg: Config) -> None:
    """Each tier sized one way (``budget_bytes`` read as bytes), a host tier only over a bounded
    device tier, the TTL only where it reaches, and declared table sizes only where they count."""
    store = cfg.store
    for tier_name in ("device", "host"):
        tier = getattr(store, tier_name)
        key = f"store.{tier_name}"
        if tier.budget_bytes is not None and tier.rows is not None:
            raise ConfigError(f"{key}: give budget_bytes or rows, not both")
        if tier.budget_bytes is not None:
            tier.budget_bytes = parse_bytes(tier.budget_bytes, f"{key}.budget_bytes")
            if tier.budget_bytes <= 0:
                raise ConfigError(f"{key}.budget_bytes: must be positive")
    host = store.host
    if not store.tiered and (host.rows is not None or host.budget_bytes is not None or host.spill):
        raise ConfigError("store.host: a host tier needs a bounded device tier "
                          "(store.device.rows or store.device.budget_bytes)")
    if host.spill and host.spill_to == "remote" and store.ttl_steps:
        raise ConfigError("store.ttl_steps: the TTL does not reach rows on the PS "
                          "(store.host.spill_to: remote)")
    if store.ttl_steps and not store.tiered:
        raise ConfigError("store.ttl_steps: the TTL works on tiers; set store.device.rows or "
                          "store.device.budget_bytes")
    _validate_declared_sizes(cfg)


def _validate_declared_sizes(cfg: Config) -> None:
    """``tables[i].num_embeddings`` sizes all-resident tables only: tiers size themselves from
    the store's capacity (a device budget is split by the rows the first batches use, not by
    declared sizes), and the PS grows its tables itself."""
    store = cfg.store
    if store.device.budget_bytes is not None:
        why = ("store.device.budget_bytes is split across the tables by the rows their first "
               "batches use, not by declared sizes")
    elif store.device.rows is not None:
        why = "store.device.rows sizes every table's device tier"
    elif cfg.supply.path == "ps-direct":
        why = "supply.path 'ps-direct' keeps the rows on the PS, which sizes its tables itself"
    else:
        return
    for i, t in enumerate(cfg.tables):
        if t.num_embeddings is not None:
            raise ConfigError(f"tables[{i}].num_embeddings: only all-resident tables use it; "
                              f"{why}, so it would be ignored (remove it)")


def validate_remote(cfg: Config) -> None:
    """Where the PS is, for the supply paths that use one (every path but ``resident``), and
    how many of its snapshots are kept."""
    remote = cfg.store.remote
    keep = cfg.train.checkpoint.keep
    if remote.snapshot_keep is not None and remote.snapshot_keep < keep:
        raise ConfigError(f"store.remote.snapshot_keep: {remote.snapshot_keep} is fewer than "
                          f"train.checkpoint.keep ({keep}), whose checkpoints each need their "
                          f"snapshots; set it to at least {keep} (or leave it out)")
    if cfg.supply.path == "resident":
        return
    _validate_namespace(remote)
    if not remote.embedded and remote.discovery == "config" and not remote.endpoints:
        raise ConfigError("store.remote.endpoints: needed when store.remote.embedded is false "
                          "(or set store.remote.discovery: tcpstore)")
    if remote.discovery == "tcpstore" and remote.embedded:
        raise ConfigError("store.remote.discovery: tcpstore finds external shards; set "
                          "store.remote.embedded: false")


def _validate_namespace(remote: RemoteConfig) -> None:
    """A namespace name the shards accept, and a quota of positive rows and/or bytes within the
    embedded shards' row budget."""
    if remote.namespace is not None and not re.match(PS_NAME_PATTERN, remote.namespace):
        raise ConfigError(f"store.remote.namespace: {remote.namespace!r} is not a valid namespace "
                          "(1 to 128 letters, digits, '_', '.', '-')")
    q = remote.quota
    if q is None:
        return
    if q.rows is None and q.bytes is None:
        raise ConfigError("store.remote.quota: give rows, bytes or both (or leave quota out)")
    if q.bytes is not None:
        q.bytes = parse_bytes(q.bytes, "store.remote.quota.bytes")
        if q.bytes <= 0:
            raise ConfigError("store.remote.quota.bytes: must be positive")
    if q.rows is not None and q.rows <= 0:
        raise ConfigError("store.remote.quota.rows: must be positive")
    if q.rows is not None and remote.max_rows is not None and q.rows > remote.max_rows:
        raise ConfigError(f"store.remote.quota.rows: {q.rows} is over each shard's row budget "
                          f"store.remote.max_rows ({remote.max_rows}); a quota lives inside it")
