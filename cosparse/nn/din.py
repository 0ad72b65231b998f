"""DIN (Deep Interest Network, Zhou et al. 2018): target attention over a behaviour sequence.

The query of sample ``s`` is the concatenation of its target embeddings (``model.din.pairs[i][0]``),
each history element's key the concatenation of its history embeddings (``pairs[i][1]``, unpooled
tables, one Jagged value each, all of the same lengths). The attention unit scores every element
with an MLP over ``[q, k, q - k, q * k]``; the first layer is applied in the equivalent factored form
``(W_q + W_d) q + (W_k - W_d) k + W_p (q * k)``, so the per-sample part is computed once per sample,
not once per element. Weights are unnormalised as in the paper (``normalize: none``) or a softmax
over each sample's sequence (``normalize: softmax``). The attended history, the targets and every
other feature (sum-pooled when unpooled) and the dense features feed the output MLP, the model's
dense tower (with ``model.dropout`` after its hidden activations; the attention unit has none).

Everything runs on the jagged layout with segment ops (``embedding_bag`` with per-sample weights,
``repeat_interleave``, ``index_select``): no Python loop over samples or elements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cosparse.config import ConfigError, DINConfig, TableConfig
from cosparse.nn.dropout import TowerDropout
from cosparse.nn.towers import mlp
from cosparse.nn.types import Jagged


def segment_sum(
    values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, dim] sums of the segments ``values[offsets[s]:offsets[s+1]]`` (optionally weighted per
    row), in row order; differentiable in ``values`` and ``weights``."""
    n = values.shape[0]
    idx = torch.arange(n, device=values.device)
    return F.embedding_bag(idx, values, offsets, mode="sum", per_sample_weights=weights,
                           include_last_offset=True)


def segment_softmax(scores: torch.Tensor, seg: torch.Tensor, offsets: torch.Tensor,
                    batch_size: int) -> torch.Tensor:
    """Softmax of ``scores`` [n] within each segment (``seg`` [n] the segment of each row)."""
    with torch.no_grad():  # the shift does not change the softmax: no gradient through it
        top = torch.full((batch_size,), float("-inf"), device=scores.device, dtype=scores.dtype)
        top = top.scatter_reduce(0, seg, scores, reduce="amax", include_self=True)
    e = torch.exp(scores - top.index_select(0, seg))
    total = segment_sum(e.unsqueeze(1), offsets).squeeze(1)
    return e / total.index_select(0, seg)


def pool(value: torch.Tensor | Jagged) -> torch.Tensor:
    """[B, dim]: a pooled feature as is, an unpooled one sum-pooled."""
    if isinstance(value, Jagged):
        return segment_sum(value.values, value.offsets)
    return value


class TargetAttention(nn.Module):
    """Attention unit: MLP over [q, k, q - k, q * k] per history element, one score each."""

    def __init__(self, dim: int, hidden: list[int], normalize: str = "none") -> None:
        super().__init__()
        self.q = nn.Linear(dim, hidden[0])  # (W_q + W_d), with the layer's bias
        self.k = nn.Linear(dim, hidden[0], bias=False)  # (W_k - W_d)
        self.p = nn.Linear(dim, hidden[0], bias=False)  # W_p on q * k
        layers: list[nn.Module] = [nn.ReLU()]
        sizes = [*hidden, 1]
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.rest = nn.Sequential(*layers)
        self.normalize = normalize

    def forward(self, q: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
        """q [B, d], keys [n, d] (jagged by ``offsets``) -> attended history [B, d]."""
        b = q.shape[0]
        seg = torch.repeat_interleave(torch.arange(b, device=q.device), lengths,
                                      output_size=keys.shape[0])
        q_rows = q.index_select(0, seg)
        h = self.q(q).index_select(0, seg) + self.k(keys) + self.p(q_rows * keys)
        scores = self.rest(h).squeeze(-1)
        if self.normalize == "softmax":
            scores = segment_softmax(scores, seg, offsets, b)
        return segment_sum(keys, offsets, scores)


class DINHead(nn.Module):
    """DIN's dense layers over the tables that serve its features (``build_head``) and its
    logits from their lookups and the dense inputs (``din_logits``): shared by the built-in
    ``DIN`` and ``cosparse.models.din`` on the public API."""

    def build_head(self, tables: list[TableConfig], num_dense: int, cfg: DINConfig,
                   dropout: TowerDropout | None, key: str = "model.din") -> None:
        """The layers over ``tables``; ``key``: where the config gives ``cfg`` (errors name
        ``<key>.pairs``)."""
        table_of = {f: t for t in tables for f in t.features}
        if not cfg.pairs:
            raise ConfigError(f"{key}.pairs: DIN needs at least one [target, history] pair")
        for j, pair in enumerate(cfg.pairs):
            if len(pair) != 2:
                raise ConfigError(f"{key}.pairs[{j}]: expected [target, history], got {pair}")
            for f in pair:
                if f not in table_of:
                    raise ConfigError(f"{key}.pairs[{j}]: feature '{f}' is not served by any "
                                      f"table (tables serve {', '.join(table_of)})")
            if table_of[pair[1]].pooling != "none":
                raise ConfigError(f"{key}.pairs[{j}]: history '{pair[1]}' needs an unpooled "
                                  "table (pooling: none)")
            if table_of[pair[0]].dim != table_of[pair[1]].dim:
                raise ConfigError(f"{key}.pairs[{j}]: '{pair[0]}' and '{pair[1]}' need one dim")
        self.targets = [p[0] for p in cfg.pairs]
        self.histories = [p[1] for p in cfg.pairs]
        in_pairs = set(self.targets) | set(self.histories)
        self.others = [f for f in table_of if f not in in_pairs]
        d = sum(table_of[f].dim for f in self.targets)
        self.attention = TargetAttention(d, cfg.attention, cfg.normalize)
        width = num_dense + sum(table_of[f].dim for f in self.others) + 2 * d
        self.mlp = mlp([width, *cfg.mlp, 1], last_activation=False, dropout=dropout)

    def din_logits(self, emb: dict[str, torch.Tensor | Jagged], dense: torch.Tensor
                   ) -> torch.Tensor:
        """The logits [B] from every feature's lookup ``emb`` and the dense inputs."""
        hist = [emb[f] for f in self.histories]
        first = hist[0]
        assert isinstance(first, Jagged)
        for f, h in zip(self.histories[1:], hist[1:], strict=True):
            assert isinstance(h, Jagged)
            if torch.compiler.is_exporting():  # (a traced program cannot look at the values)
                continue
            if not torch.equal(h.lengths, first.lengths):
                raise ValueError(f"DIN: history '{f}' and '{self.histories[0]}' have different "
                                 "lengths; the histories of model.din.pairs must be one sequence")
        q = torch.cat([pool(emb[f]) for f in self.targets], dim=1)
        keys = torch.cat([h.values for h in hist], dim=1)  # type: ignore[union-attr]
        attended = self.attention(q, keys, first.lengths, first.offsets)
        x = torch.cat([dense, *[pool(emb[f]) for f in self.others], q, attended], dim=1)
        return self.mlp(x).squeeze(-1)
