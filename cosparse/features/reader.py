"""FeatureReader: a cosparse Reader that extracts features from a RawSource inside ``build``, so in
the data-worker processes. Picklable (the worker pool uses forkserver)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from cosparse.batch import SparseBatch
from cosparse.features.extract import FeatureBatch, FeatureExtractor
from cosparse.features.feature_set import FeatureSet
from cosparse.features.sources import RawSource
from cosparse.features.types import DENSE, FeatureSpecError


def check_keys(feature_set: FeatureSet, sparse: Sequence[str], dense: Sequence[str]) -> None:
    """Each ``sparse`` name is a sparse or sequence feature, each ``dense`` name a dense one."""
    for n in sparse:
        if feature_set[n].kind == DENSE:
            raise FeatureSpecError(f"feature '{n}' is dense but listed as sparse")
    for n in dense:
        if feature_set[n].kind != DENSE:
            raise FeatureSpecError(f"feature '{n}' is {feature_set[n].kind} but listed as dense")
    both = set(sparse) & set(dense)
    if both or len(set(sparse)) != len(sparse) or len(set(dense)) != len(dense):
        raise FeatureSpecError(f"a feature is listed twice: {sorted(both) or 'duplicates'}")


class FeatureReader:
    """Reader over ``source`` whose batches hold ``sparse`` (keys) and ``dense`` (dense columns).

    The spec is checked against the source's columns at construction (start-up).
    """

    def __init__(self, source: RawSource, feature_set: FeatureSet, sparse: Sequence[str],
                 dense: Sequence[str] = ()) -> None:
        feature_set.check_source(source.columns)
        check_keys(feature_set, sparse, dense)
        self.source = source
        self.feature_set = feature_set
        self.keys: list[str] = list(sparse)
        self.dense_keys: list[str] = list(dense)
        self.num_dense: int = len(self.dense_keys)
        self.extractor = FeatureExtractor(feature_set, self.keys + self.dense_keys)

    @classmethod
    def for_model(cls, source: RawSource, feature_set: FeatureSet, model: str) -> FeatureReader:
        """The reader of a registry consumer's features (sparse then dense, in its order)."""
        sparse, dense = feature_set.consumer_keys(model)
        return cls(source, feature_set, sparse, dense)

    @property
    def num_batches(self) -> int:
        return self.source.num_batches

    def tasks(self, start_batch: int = 0) -> Iterator[Any]:
        return self.source.tasks(start_batch)

    def extract(self, task: Any) -> FeatureBatch:
        return self.extractor.extract(self.source.build_raw(task))

    def build(self, task: Any) -> SparseBatch:
        return self.extract(task).to_sparse_batch(self.keys, self.dense_keys)
