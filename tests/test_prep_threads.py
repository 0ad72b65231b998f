"""A batch's ID work: the fused dedup + counted transpose gives the two-pass index exactly, and
spreading the tables over threads gives what one thread gives."""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cosparse.batch import SparseBatch
from cosparse.config import TableConfig
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.store import prep_threads
from cosparse.store.dedup import Deduper, with_bags


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(-(2**62), 2**62), max_size=300),
       mean=st.booleans(), cut=st.integers(1, 7))
def test_counted_transpose_is_the_two_pass_index(ids, mean, cut) -> None:
    ids = np.array(ids, dtype=np.int64)
    offsets = np.unique(np.concatenate([[0], np.arange(0, ids.shape[0], cut), [ids.shape[0]]]))
    d = Deduper()
    got = d.prepare(ids, offsets, mean)
    unique, inverse = d.unique(ids)
    ref = with_bags(unique, inverse, offsets, mean)
    for name in ("unique", "inverse", "offsets", "t_offsets", "t_bags", "t_weights"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    np.testing.assert_array_equal(got.unique[got.inverse], ids)
    _, first = np.unique(ids, return_index=True)
    np.testing.assert_array_equal(got.unique, ids[np.sort(first)])  # first-occurrence order


def test_map_tables_keeps_the_order_and_raises_a_share_s_error() -> None:
    names = []
    out = prep_threads.map_tables(lambda x: (x, names.append(threading.current_thread().name)),
                                  list(range(9)), sizes=[1, 9, 2, 8, 3, 7, 4, 6, 5], threads=2)
    assert [x for x, _ in out] == list(range(9))
    assert any(n.startswith("cosparse-prep") for n in names)  # a helper took a share

    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("table 3 is bad")
        return x

    with pytest.raises(ValueError, match="table 3 is bad"):
        prep_threads.map_tables(boom, list(range(6)), sizes=[1] * 6, threads=2)


def test_prepare_on_two_threads_is_prepare_on_one() -> None:
    rng = np.random.default_rng(4)
    tables = [TableConfig(name=f"t{i}", dim=4, features=[f"f{i}", f"g{i}"], hash_size=5000,
                          pooling="mean" if i % 2 else "sum") for i in range(5)]
    keys = [f for t in tables for f in t.features]
    b = 64
    lengths = rng.integers(0, 6, len(keys) * b)
    values = rng.integers(0, 1 << 40, int(lengths.sum()))
    batch = SparseBatch(keys=keys, values=torch.from_numpy(values),
                        lengths=torch.from_numpy(lengths), dense=torch.zeros(b, 1),
                        labels=torch.zeros(b))
    ec = EmbeddingCollection(tables, device="cpu")
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = ec.prepare(batch)
        numba.set_num_threads(2)
        two = ec.prepare(batch)
    finally:
        numba.set_num_threads(before)
    for name, ids in one.tables.items():
        for field in ("unique", "inverse", "offsets", "t_offsets", "t_bags", "t_weights"):
            np.testing.assert_array_equal(getattr(two.tables[name], field), getattr(ids, field))
