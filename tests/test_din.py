"""Behaviour sequences and DIN: the event-log reader, the unpooled (jagged) lookup, DIN's config
checks, DIN beating a popularity baseline on the Taobao sample, and tiered exactness with DIN."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from cosparse.config import (
    ConfigError,
    DataConfig,
    EventsConfig,
    SequenceSyntheticConfig,
    TableConfig,
    config_from_mapping,
)
from cosparse.data import DataError, make_reader
from cosparse.data.events import TaobaoEventsReader
from cosparse.data.synthetic_sequences import SyntheticSequenceReader
from cosparse.nn.din import segment_softmax, segment_sum
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.types import Jagged
from cosparse.train.evaluate import roc_auc
from cosparse.train.trainer import Trainer

TAOBAO = Path(__file__).resolve().parents[2] / "shared/data/taobao-userbehavior/UserBehavior_head84k.csv"
needs_taobao = pytest.mark.skipif(not TAOBAO.exists(), reason="../shared/data/taobao is not present")

# user 7: not time-sorted in the file; two events share t=300 (lines 3 and 5)
TINY = """7,70,700,pv,500
7,71,701,pv,100
7,72,702,cart,300
7,73,703,buy,400
7,74,704,fav,300
7,75,705,buy,200
9,90,900,pv,150
9,91,901,buy,250
"""


def _reader(tmp_path, text=TINY, split="train", eval_fraction=0.0, **events):
    p = tmp_path / "events.csv"
    p.write_text(text)
    ev = EventsConfig(shuffle=False, **events)
    return TaobaoEventsReader(p, 64, split, eval_fraction, events=ev)


def _samples(reader):
    """target item -> (label, history items) of every sample, via build()."""
    out = {}
    for task in reader.tasks():
        b = reader.build(task)
        items, _ = b.feature("target_item")
        hist, lens = b.feature("hist_item")
        cates, clens = b.feature("hist_cate")
        btags, _ = b.feature("hist_btag")
        assert torch.equal(lens, clens) and b.dense.shape == (b.batch_size, 0)
        assert torch.equal(cates, hist // 10 * 100 + hist % 10)  # categories travel with items
        off = np.concatenate([[0], np.cumsum(lens.numpy())])
        for s in range(b.batch_size):
            h = hist[off[s] : off[s + 1]].tolist()
            out[int(items[s])] = (float(b.labels[s]), h, btags[off[s] : off[s + 1]].tolist())
    return out


def test_history_is_strictly_preceding_most_recent_first(tmp_path):
    s = _samples(_reader(tmp_path))
    # 71 (t=100) has no history: min_history 1 drops it; so does user 9's first event
    assert set(s) == {75, 72, 74, 73, 70, 91}
    assert s[75] == (1.0, [71], [0])
    # the two t=300 events see only t<=200, not each other
    assert s[72][1] == [75, 71] and s[74][1] == [75, 71]
    # at t=400: both t=300 events, the later file line first among equal timestamps
    assert s[73] == (1.0, [74, 72, 75, 71], [2, 1, 3, 0])
    assert s[70] == (0.0, [73, 74, 72, 75, 71], [3, 2, 1, 3, 0])
    assert s[91] == (1.0, [90], [0])  # no leakage across users


def test_max_len_keeps_the_most_recent_and_min_history(tmp_path):
    s = _samples(_reader(tmp_path, max_len=2))
    assert s[70][1] == [73, 74] and s[73][1] == [74, 72] and s[75][1] == [71]
    s0 = _samples(_reader(tmp_path, min_history=0))
    assert s0[71][1] == [] and s0[90][1] == []
    s3 = _samples(_reader(tmp_path, min_history=3))
    assert set(s3) == {73, 70}


def test_positive_behaviours_and_time_split(tmp_path):
    s = _samples(_reader(tmp_path, positive=["cart", "fav"]))
    assert s[72][0] == 1.0 and s[74][0] == 1.0 and s[73][0] == 0.0
    # 8 events by time: 100 150 200 250 300 300 400 500; eval is the last quarter (t >= 400)
    train = _samples(_reader(tmp_path, split="train", eval_fraction=0.25))
    ev = _samples(_reader(tmp_path, split="eval", eval_fraction=0.25))
    assert set(ev) == {73, 70} and set(train) == {75, 72, 74, 91}
    assert ev[70][1] == [73, 74, 72, 75, 71]  # eval histories reach back into the train period


def test_bad_line_names_file_line_and_column(tmp_path):
    text = TINY.replace("7,73,703,buy,400", "7,73,7x3,buy,400")
    with pytest.raises(DataError, match=r"events\.csv:4: non-numeric integer field category_id"):
        _reader(tmp_path, text)
    with pytest.raises(DataError, match=r"events\.csv:2: bad behavior_type 'click'"):
        _reader(tmp_path, TINY.replace("7,71,701,pv", "7,71,701,click"))
    with pytest.raises(DataError, match=r"events\.csv:8: wrong column count: expected 5 got 4"):
        _reader(tmp_path, TINY.replace("9,91,901,buy,250", "9,91,buy,250"))
    p = tmp_path / "events.csv"
    p.write_text(text)
    r = TaobaoEventsReader(p, 64, "train", 0.0, "skip", EventsConfig(shuffle=False))
    first = r.build(next(r.tasks()))
    assert first.bad_records == 1 and 73 not in _samples(r)


def test_synthetic_sequences_fixed_length_and_deterministic():
    cfg = SequenceSyntheticConfig(seq_len=1000, vocab_size=5000, num_batches=3)
    r = SyntheticSequenceReader(cfg, 8)
    a, b = r.build(1), r.build(1)
    assert torch.equal(a.values, b.values) and torch.equal(a.labels, b.labels)
    _, lens = a.feature("hist_item")
    assert lens.tolist() == [1000] * 8 and a.dense.shape == (8, 0)
    d = DataConfig(reader="synthetic_sequences", batch_size=4,
                   events=EventsConfig(synthetic=SequenceSyntheticConfig(seq_len=10_000)))
    _, lens = make_reader(d).build(0).feature("hist_cate")
    assert lens.tolist() == [10_000] * 4


# --- unpooled lookup -----------------------------------------------------------------------------
def test_unpooled_lookup_matches_torch_reference_and_gradient():
    ec = EmbeddingCollection(
        [TableConfig(name="item", dim=4, features=["target_item", "hist_item"], pooling="none"),
         TableConfig(name="btag", dim=3, features=["hist_btag"], pooling="sum")], device="cpu")
    r = SyntheticSequenceReader(SequenceSyntheticConfig(seq_len=7, vocab_size=50), 5)
    batch = r.build(0)
    ec.train()
    out = ec(ec.prepare_and_stage(batch))
    hist, target = out["hist_item"], out["target_item"]
    assert isinstance(hist, Jagged) and hist.values.shape == (35, 4)
    assert hist.lengths.tolist() == [7] * 5 and hist.offsets.tolist() == list(range(0, 36, 7))
    assert isinstance(target, Jagged) and target.values.shape == (5, 4)
    assert out["hist_btag"].shape == (5, 3)  # pooled tables as before
    pend = ec._pending[0]
    unique = ec.prepare(batch).tables["item"].unique
    ids = torch.cat([batch.feature("target_item")[0], batch.feature("hist_item")[0]])
    inv = torch.from_numpy(np.searchsorted(unique, ids.numpy(), sorter=np.argsort(unique)))
    inv = torch.from_numpy(np.argsort(unique))[inv]
    ref_w = pend.weights.detach().clone().requires_grad_(True)
    ref = torch.nn.functional.embedding(inv, ref_w)
    assert torch.equal(torch.cat([target.values, hist.values]), ref)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))
    (torch.cat([target.values, hist.values]) * g).sum().backward()
    (ref * g).sum().backward()
    torch.testing.assert_close(pend.weights.grad, ref_w.grad, rtol=1e-6, atol=1e-6)
    ec.apply_gradients()


def test_segment_ops_match_a_loop_reference():
    x = torch.randn(9, 3)
    lengths = torch.tensor([2, 0, 4, 3])
    off = torch.tensor([0, 2, 2, 6, 9])
    w = torch.randn(9)
    seg = torch.repeat_interleave(torch.arange(4), lengths)
    ref = torch.stack([(x[a:b] * w[a:b, None]).sum(0) for a, b in zip(off[:-1], off[1:], strict=True)])
    torch.testing.assert_close(segment_sum(x, off, w), ref)
    sm = segment_softmax(w, seg, off, 4)
    ref_sm = torch.cat([torch.softmax(w[a:b], 0) for a, b in zip(off[:-1], off[1:], strict=True)])
    torch.testing.assert_close(sm, ref_sm)


# --- config ------------------------------------------------------------------------------------
def din_mapping(path: Path | str = TAOBAO, **over) -> dict:
    raw = {
        "data": {"reader": "taobao_events", "path": str(path), "batch_size": 256,
                 "eval_fraction": 0.2, "events": {"max_len": 50}},
        "model": {"kind": "din",
                  "din": {"pairs": [["target_item", "hist_item"], ["target_cate", "hist_cate"]],
                          "attention": [32, 16], "mlp": [64, 32]},
                  "dense_optimizer": {"kind": "adam", "lr": 0.005}},
        "tables": [
            {"name": "item", "dim": 16, "features": ["target_item", "hist_item"], "pooling": "none",
             "optimizer": {"kind": "rowwise_adagrad", "lr": 0.1}},
            {"name": "cate", "dim": 16, "features": ["target_cate", "hist_cate"], "pooling": "none",
             "optimizer": {"kind": "rowwise_adagrad", "lr": 0.1}},
            {"name": "user", "dim": 8, "features": ["user"],
             "optimizer": {"kind": "rowwise_adagrad", "lr": 0.1}},
            {"name": "btag", "dim": 4, "features": ["hist_btag"], "pooling": "mean",
             "optimizer": {"kind": "rowwise_adagrad", "lr": 0.1}},
        ],
        "train": {"steps": 100_000, "epochs": 1, "progress": False, "log_every": 1000, "threads": 2},
    }
    for k, v in over.items():
        node = raw
        *parts, last = k.split(".")
        for part in parts:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = v
    return raw


@pytest.mark.parametrize("key,value,match", [
    ("model.din.pairs", [], r"model\.din\.pairs: DIN needs at least one"),
    ("model.din.pairs", [["target_item"]], r"model\.din\.pairs\[0\]: expected \[target"),
    ("model.din.pairs", [["target_item", "hist_nope"]], r"pairs\[0\]: feature 'hist_nope' is not"),
    ("model.din.pairs", [["user", "hist_btag"]], r"tables\[3\]\.pooling: history feature 'hist_btag'"),
    ("model.din.attention", [], r"model\.din\.attention"),
    ("model.din.mlp", [0], r"model\.din\.mlp"),
    ("model.din.normalize", "sparsemax", r"model\.din\.normalize"),
    ("model.din.pairs", [["user", "hist_item"]], r"pairs\[0\]: target 'user' \(dim 8\)"),
    ("model.kind", "dcn", r"tables\[0\]\.pooling: 'none' .* needs a sequence model"),
    ("data.events.max_len", 20_000, r"data\.events\.max_len"),
    ("data.events.positive", ["click"], r"data\.events\.positive"),
    ("data.events.synthetic.seq_len", 0, r"data\.events\.synthetic\.seq_len"),
])
def test_din_config_errors_name_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        config_from_mapping(din_mapping(**{key: value}))


# --- training ----------------------------------------------------------------------------------
def popularity_auc(train, ev) -> tuple[float, str]:
    """The best popularity baseline fitted on the train split: per-item and per-category buy rates
    (smoothed towards the prior with m pseudo-samples) and frequencies, scored on eval."""
    def cols(r):
        s = r.samples()
        return ({"item": s["target_item"], "cate": s["target_cate"]},
                s["label"].astype(np.float64))

    tx, ty = cols(train)
    ex, ey = cols(ev)
    prior = ty.mean()
    best = (0.0, "")
    for name in ("item", "cate"):
        keys, inv = np.unique(tx[name], return_inverse=True)
        pos, cnt = np.bincount(inv, weights=ty), np.bincount(inv)
        j = np.minimum(np.searchsorted(keys, ex[name]), keys.shape[0] - 1)
        hit = keys[j] == ex[name]
        best = max(best, (roc_auc(ey, np.where(hit, cnt[j], 0).astype(np.float64)),
                          f"{name} frequency"))
        for m in (1, 5, 20, 50, 100):
            rate = (pos + m * prior) / (cnt + m)
            best = max(best, (roc_auc(ey, np.where(hit, rate[j], prior)),
                              f"{name} buy rate (m={m})"))
    return best


@needs_taobao
def test_din_beats_popularity_baseline_on_taobao():
    cfg = config_from_mapping(din_mapping())
    trainer = Trainer(cfg, log=lambda m: None)
    final = trainer.run()
    base, which = popularity_auc(trainer.train_reader, trainer.eval_reader)
    trainer.close()
    print(f"\nDIN eval AUC {final['auc']:.4f} ({final['eval_samples']} samples, "
          f"{trainer.state.step} steps) vs popularity baseline {base:.4f} ({which})")
    assert final["auc"] > base + 0.01


@needs_taobao
def test_din_tiered_is_bit_identical_to_resident():
    from exactness import first_difference, run, tiered, trace_stats

    # one epoch over the first 15% of the log by time: the run ends with the stream, so no
    # batch is staged (and no row created) beyond the last trained one
    raw = din_mapping(**{"data.batch_size": 32, "data.events.max_len": 20,
                         "data.eval_fraction": 0.85})
    for t in raw["tables"]:
        t["optimizer"] = {"kind": "adam", "lr": 0.01} if t["name"] == "cate" else t["optimizer"]
    cfg = config_from_mapping(raw)
    st = trace_stats(cfg, 2)
    touched = max(v[0] for v in st.values())
    window = max(v[1] for v in st.values())
    rows = max(touched // 10, window)
    ref = run(cfg)
    got = run(tiered(copy.deepcopy(cfg), rows, lookahead=2, workers=0, policy="hotness"))
    counters = got.trainer.ec.counters()
    assert sum(c.evictions_device for c in counters.values()) > 0, "the device tier never filled"
    item_rows = ref.rows["item"][0].shape[0]
    print(f"\nDIN tiered: device {rows} rows/table ({rows / item_rows:.0%} of the {item_rows} item "
          f"rows the run touched), host unbounded, lookahead 2, {len(ref.losses)} steps")
    assert first_difference(got, ref) is None, first_difference(got, ref)
