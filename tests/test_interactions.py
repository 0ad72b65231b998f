"""``reader: interactions``: any interaction log (a table, or one user per line) as behaviour
sequences; leave-last-out; sampled negatives that the user had not seen and that never enter a
history; DIN from config alone beating item popularity on a real sequence file."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from cosparse.config import ConfigError, config_from_mapping, load_config
from cosparse.data.errors import DataError
from cosparse.features import kernels as K
from cosparse.features.column_map import column_seed
from cosparse.train.baseline import popularity
from cosparse.train.inputs import model_inputs
from cosparse.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
BEAUTY = ROOT.parent / "shared/data/seqrec-s3rec/Beauty.txt"

RUN = {
    "data": {"reader": "interactions", "batch_size": 8,
             "events": {"layout": "user_items", "max_len": 3, "shuffle": False},
             "split": {"by": "last_per_user"}},
    "model": {"kind": "din", "bottom": [4], "top": [4, 1],
              "din": {"pairs": [["item", "hist_item"]], "attention": [4], "mlp": [4]}},
    "tables": [{"name": "user", "dim": 4, "features": ["user"]},
               {"name": "item", "dim": 4, "features": ["item", "hist_item"], "pooling": "none"}],
    "train": {"steps": 2, "progress": False},
}


def _inputs(tmp_path: Path, text: str, name: str = "seq.txt", **data):
    p = tmp_path / name
    p.write_text(text)
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(p), **data)
    return model_inputs(config_from_mapping(raw))


def _h(token: str, role: str) -> int:
    b = np.frombuffer(token.encode(), np.uint8)
    return int(K.hash_strings(b, np.array([0, len(b)], np.int64), column_seed(0, role), 0)[0])


def _samples(reader) -> list[tuple]:
    """(user, item, history (most recent first), label) of every sample, in order."""
    out = []
    for t in reader.tasks():
        b = reader.build(t)
        users, items = b.feature("user")[0].tolist(), b.feature("item")[0].tolist()
        hv, hl = (x.numpy() for x in b.feature("hist_item"))
        hs = np.split(hv, np.cumsum(hl)[:-1])
        out += [(u, i, h.tolist(), lab) for u, i, h, lab
                in zip(users, items, hs, b.labels.tolist(), strict=True)]
    return out


def test_a_user_items_file_is_read_as_events_in_line_order(tmp_path):
    inputs = _inputs(tmp_path, "1 10 11 12 13 14\n2 10 20\n3 30\n")
    i = {t: _h(t, "item") for t in ("10", "11", "12", "13", "14", "20")}
    u1, u2 = _h("1", "user"), _h("2", "user")
    train = sorted(_samples(inputs.train))
    want = [(u1, i["11"], [i["10"]], 1.0), (u1, i["12"], [i["11"], i["10"]], 1.0),
            (u1, i["13"], [i["12"], i["11"], i["10"]], 1.0)]  # max_len 3
    assert train == sorted(want)
    # leave-last-out: each user's last item evaluates (user 3 has no history: no sample)
    assert sorted(_samples(inputs.eval)) == sorted([
        (u1, i["14"], [i["13"], i["12"], i["11"]], 1.0), (u2, i["20"], [i["10"]], 1.0)])


def test_a_table_with_times_labels_and_item_features(tmp_path):
    text = ("uid,iid,ts,cat,label\n"
            "a,x,30,c1,1\n"   # rows out of time order: the time sorts them
            "a,y,10,c2,0\n"
            "b,x,5,c1,1\n"
            "a,z,20,c3,1\n"
            "b,y,7,c2,1\n")
    inputs = _inputs(tmp_path, text, "log.csv", events={"max_len": 5, "shuffle": False},
                     columns={"user": "uid", "item": "iid", "time": "ts",
                              "item_features": ["cat"]},
                     split={"by": "position", "eval_fraction": 0.2})
    r = inputs.train
    assert r.keys == ["user", "item", "cat", "hist_item", "hist_cat"]
    # events by time: b5 b7 a10 a20 a30; the last (a,x,30) evaluates
    b = r.build(next(iter(r.tasks())))
    assert b.labels.tolist() == [1.0, 1.0]  # (b,y,7) after b's x; (a,z,20) after a's y
    assert b.feature("hist_cat")[0].tolist() == [_h("c1", "cat"), _h("c2", "cat")]
    e = inputs.eval.build(next(iter(inputs.eval.tasks())))
    assert e.feature("hist_item")[0].tolist() == [_h("z", "item"), _h("y", "item")]
    with pytest.raises(DataError, match=r"row 1 \(0-based\)"):
        _inputs(tmp_path, text.replace("a,y,10", "a,,10"), "bad.csv", events={},
                columns={"user": "uid", "item": "iid", "time": "ts"})


def test_negatives_are_unseen_items_and_never_enter_histories(tmp_path):
    rng = np.random.default_rng(0)
    lines = [" ".join([str(u)] + [str(x) for x in rng.choice(60, 12, replace=False)])
             for u in range(40)]
    neg = {"per_positive": 3, "from": "popularity", "seed": 5}
    inputs = _inputs(tmp_path, "\n".join(lines) + "\n", negatives=neg)
    seqs = {_h(str(u), "user"): [_h(t, "item") for t in line.split()[1:]]
            for u, line in enumerate(lines)}
    train = _samples(inputs.train)
    pos = [s for s in train if s[3] == 1.0]
    negs = [s for s in train if s[3] == 0.0]
    assert len(negs) == 3 * len(pos)
    for user, item, hist, label in train:
        at = seqs[user].index(hist[0]) + 1  # the target's place: just after its history
        assert hist == seqs[user][max(0, at - 3):at][::-1]  # the user's own items, max_len 3
        if label == 1.0:
            assert item == seqs[user][at]
        else:  # not an item the user had by then, the target included
            assert item not in seqs[user][:at + 1]
    again = _samples(_inputs(tmp_path, "\n".join(lines) + "\n", negatives=neg).train)
    assert again == train  # seeded
    ev = _samples(inputs.eval)
    assert sum(s[3] == 0.0 for s in ev) == 3 * sum(s[3] == 1.0 for s in ev)


@pytest.mark.parametrize("data, message", [
    ({"columns": {"user": "u"}, "events": {"layout": "rows"}}, "data.columns.item"),
    ({"negatives": {"per_positive": 0}}, "data.negatives.per_positive"),
    ({"negatives": {"from": "random"}}, "data.negatives.from"),
    ({"split": {"by": "hash", "key": "u"}}, "data.split.by"),
    ({"reader": "csv", "negatives": {}}, "data.negatives: samples negatives"),
    ({"reader": "csv", "columns": {"user": "u"}}, "data.columns.user"),
    ({"reader": "csv"}, "data.events.layout"),  # (RUN's events say layout: user_items)
])
def test_bad_interaction_keys_are_config_errors_naming_the_key(data, message):
    raw = copy.deepcopy(RUN)
    raw["data"].update(path="x.txt", **data)
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(raw)


@pytest.mark.skipif(not BEAUTY.exists(), reason="../shared/data/seqrec-s3rec is not present")
def test_din_on_a_sequence_file_beats_item_popularity():
    cfg = load_config(ROOT / "configs/beauty_din.yaml", {"data.path": str(BEAUTY),
                                                         "train.progress": False})
    inputs = model_inputs(cfg)
    base = popularity(inputs.train, inputs.eval)
    t = Trainer(cfg, log=lambda m: None, inputs=inputs)
    try:
        final = t.run()
    finally:
        t.close()
    print(f"DIN eval AUC {final['auc']:.4f}; item popularity {base.auc:.4f} +- {base.auc_se:.4f}")
    assert final["auc"] > base.auc + 2 * base.auc_se


def test_the_baseline_command_scores_popularity_on_the_configs_split(tmp_path, capsys):
    import json

    import yaml

    from cosparse.cli import main

    rng = np.random.default_rng(1)
    lines = [" ".join([str(u)] + [str(x) for x in rng.zipf(1.5, 10) % 50]) for u in range(60)]
    (tmp_path / "seq.txt").write_text("\n".join(lines) + "\n")
    raw = copy.deepcopy(RUN)
    raw["data"].update(path=str(tmp_path / "seq.txt"), negatives={"per_positive": 2})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert main(["data", "baseline", "--config", str(tmp_path / "c.yaml")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    inputs = model_inputs(config_from_mapping(raw))
    want = popularity(inputs.train, inputs.eval)
    assert out == {"baseline": "popularity", "auc": want.auc, "auc_se": want.auc_se,
                   "eval_samples": want.eval_samples}


@pytest.mark.parametrize("stamps, fmt", [
    (["2014-10-21T10:00:00", "2014-10-21T09:00:00", "2014-10-22 08:30:00"], None),
    ([14102110, 14102109, 14102208], "%y%m%d%H"),
])
def test_a_time_column_of_text_or_a_format_orders_the_events(tmp_path, stamps, fmt):
    text = "uid,iid,ts\n" + "".join(f"a,{i},{t}\n" for i, t in zip("xyz", stamps, strict=True))
    inputs = _inputs(tmp_path, text, "log.csv", events={"max_len": 5, "shuffle": False},
                     columns={"user": "uid", "item": "iid", "time": "ts", "time_format": fmt},
                     split={"by": "last_per_user"})
    # by time: y (09:00), x (10:00), z (next day): z evaluates after x and y
    (sample,) = _samples(inputs.eval)
    assert sample[1] == _h("z", "item") and sample[2] == [_h("x", "item"), _h("y", "item")]
    with pytest.raises(DataError, match="data.columns.time.*time_format"):
        _inputs(tmp_path, text.replace(str(stamps[0]), "soon"), "bad.csv",
                events={"max_len": 5}, columns={"user": "uid", "item": "iid", "time": "ts",
                                                "time_format": fmt})


def test_a_time_format_without_a_time_column_is_a_config_error():
    raw = copy.deepcopy(RUN)
    raw["data"].update(path="x.csv", events={}, columns={"user": "u", "item": "i",
                                                         "time_format": "unix_s"})
    with pytest.raises(ConfigError, match="data.columns.time_format"):
        config_from_mapping(raw)
