"""The transforms of a feature spec: their parameters, static type rules and vectorised kernels.

Each transform is a ``TransformDef``: ``params`` (name -> Param), ``check`` (input types -> output
type, or ``Mismatch``), ``prepare`` (params -> per-process state, once) and ``apply`` (columns ->
column, for a whole batch: numpy, pyarrow compute or numba; never a per-row Python loop).

``TRANSFORMS`` (this module) names them all; they live by what they make: ``ids`` (hash,
bucketize, cross, vocab), ``numeric`` (log1p, clip, fill_missing), ``sequence`` (truncate,
history), ``time`` (datetime); ``base`` holds the contract and the helpers they share.
"""

from __future__ import annotations

from cosparse.features.transforms.base import BadParam, Mismatch, Param, TransformDef
from cosparse.features.transforms.ids import BUCKETIZE, CROSS, HASH, VOCAB, fit_quantiles
from cosparse.features.transforms.numeric import CLIP, FILL_MISSING, LOG1P
from cosparse.features.transforms.sequence import HISTORY, TRUNCATE
from cosparse.features.transforms.time import DATETIME
from cosparse.features.types import list_of

# (in this order: error messages list the known transforms so)
TRANSFORMS: dict[str, TransformDef] = {
    t.name: t for t in (HASH, BUCKETIZE, LOG1P, CLIP, FILL_MISSING, CROSS, VOCAB, TRUNCATE, HISTORY,
                        DATETIME)
}

__all__ = ["TRANSFORMS", "BadParam", "Mismatch", "Param", "TransformDef", "fit_quantiles", "list_of"]
