"""Serving export: a checkpoint's embedding rows without optimizer state, for serving.

* ``export``: ``cosparse export`` (a full export, or the rows changed since a step), from the
  rows wherever the checkpoint holds them (``rows``: the trainer's checkpoint, PS snapshots,
  a many-rank checkpoint);
* ``format``: the files and manifest of an export (numpy and pyarrow only);
* ``load``: a full export plus deltas, as lookup tables (``load_tables``);
* ``dense``: the dense model beside the rows (its state_dict and how to rebuild it);
* ``predictor``: ``load(dir)``, the tables and the model as a ``Predictor`` (``predict``).
"""

from cosparse.serving.format import ServingError
from cosparse.serving.load import LookupTable, load_tables
from cosparse.serving.predictor import Predictor, load

__all__ = ["LookupTable", "Predictor", "ServingError", "load", "load_tables"]
