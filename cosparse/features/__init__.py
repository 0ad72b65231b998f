"""Unified feature extraction: YAML specs -> a versioned feature DAG (``FeatureSet``), vectorised
transforms, raw sources, extract-once fan-out to several consumers, lineage/diff, and materialized
features keyed by version.

Typical use::

    fs = load_spec("configs/features/criteo.yaml")
    src = CriteoRawSource(path, 4096, "train", 0.2)
    reader = FeatureReader.for_model(src, fs, "dlrm_v1")    # a cosparse Reader
"""

from cosparse.features.diff import diff, format_diff
from cosparse.features.event_source import EventLogRawSource
from cosparse.features.extract import FeatureBatch, FeatureExtractor
from cosparse.features.feature_set import FeatureSet
from cosparse.features.feature_spec import FeatureSpec, TransformSpec
from cosparse.features.fit import fit_spec_file, require_fitted
from cosparse.features.lineage import format_lineage, lineage
from cosparse.features.materialize import MaterializedReader, materialize, read_manifest
from cosparse.features.reader import FeatureReader
from cosparse.features.registry import Consumer, FeatureRef
from cosparse.features.sources import CriteoRawSource, ParquetRawSource, RawSource, open_source
from cosparse.features.spec import load_spec, parse_spec
from cosparse.features.types import Column, ColumnKind, FeatureSpecError, RawBatch

__all__ = [
    "Column",
    "ColumnKind",
    "Consumer",
    "CriteoRawSource",
    "EventLogRawSource",
    "FeatureBatch",
    "FeatureExtractor",
    "FeatureReader",
    "FeatureRef",
    "FeatureSet",
    "FeatureSpec",
    "FeatureSpecError",
    "MaterializedReader",
    "ParquetRawSource",
    "RawBatch",
    "RawSource",
    "TransformSpec",
    "diff",
    "fit_spec_file",
    "format_diff",
    "format_lineage",
    "lineage",
    "load_spec",
    "materialize",
    "open_source",
    "parse_spec",
    "read_manifest",
    "require_fitted",
]
