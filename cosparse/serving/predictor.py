"""The predictor of an export: the model's dense part rebuilt from the export's ``dense`` entry
(``cosparse.serving.dense``) over an embedding collection whose rows are the export's tables.

``predict(batch)`` gives each task's predictions ``{task: Tensor[B]}`` (a model of one label:
``{"label": ...}``): a binary task's probability (the sigmoid of its logit), a regression's
value, what the trainer's evaluation records (``cosparse.train.objective.task_predictions``),
computed by the same code on the same rows, so on CPU the two agree bit for bit. An ID a table
has no row for reads the table's initial row (a pure function of the table's seed and the ID,
the trainer's init for a new row, ``cosparse.store.resident.initial_rows``), as evaluation reads
it, and is counted in ``unknown_ids[table]`` (each unknown ID once per batch it appears in).

The model is built on the first batch (its number of dense inputs is the batch's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cosparse.batch import SparseBatch
from cosparse.config import Config, TableConfig, config_from_mapping
from cosparse.config.objective import ObjectiveConfig, objective_of
from cosparse.nn.embedding import EmbeddingCollection
from cosparse.nn.model_batch import Batch
from cosparse.serving.format import ServingError, read_manifest, sha256_file
from cosparse.serving.item_index import ItemIndex
from cosparse.serving.load import LookupTable, load_tables
from cosparse.serving.program import ProgramModel
from cosparse.store.resident import initial_rows
from cosparse.train.objective import task_predictions


class Predictor(dict[str, LookupTable]):
    """The export's tables by name (as ``load`` returns them) and the model that serves them."""

    def __init__(self, tables: dict[str, LookupTable], dense: dict[str, Any] | None,
                 root: Path, use_program: bool = True,
                 retrieval: dict[str, Any] | None = None) -> None:
        super().__init__(tables)
        self.dense = dense
        self.retrieval = retrieval  # (the manifest's entry of a retrieval model's item index)
        self._indexes: dict[str, ItemIndex] = {}
        self.use_program = use_program
        self.root = root
        self.unknown_ids: dict[str, int] = {name: 0 for name in tables}
        self._model: nn.Module | None = None
        self._ec: EmbeddingCollection | None = None
        self.objective: ObjectiveConfig | None = None  # the tasks predicted, once built
        self.form: str | None = None  # what predicts, once built: "program" or "state_dict"

    def _tables_config(self) -> list[TableConfig]:
        """The tables of the config the model was trained under."""
        return config_from_mapping(self._dense_entry()["config"]).tables

    def _dense_entry(self) -> dict[str, Any]:
        dense = self.dense
        if not dense or dense.get("form") != "state_dict" or not dense.get("model"):
            why = (dense or {}).get("why", "the export was written without its dense model")
            raise ServingError(f"{self.root}: no model to predict with ({why})")
        return dense

    def _build(self, num_dense: int) -> None:
        dense = self._dense_entry()
        path = self.root / dense["file"]["path"]
        if sha256_file(path) != dense["file"]["sha256"]:
            raise ServingError(f"{path}: checksum mismatch (export again)")
        cfg = config_from_mapping(dense["config"])
        self.objective = objective_of(cfg.objective)
        program = dense.get("program")
        if program and self.use_program:  # the torch.export program of the dense part, the lookup outside it
            ppath = self.root / program["path"]
            if sha256_file(ppath) != program["sha256"]:
                raise ServingError(f"{ppath}: checksum mismatch (export again)")
            ec = EmbeddingCollection(cfg.tables, device=torch.device("cpu"))
            model: nn.Module = ProgramModel(torch.export.load(ppath).module(), ec,
                                            dense["inputs"])
            self.form = "program"
        else:
            model, ec = _build_model(cfg, dense["model"], num_dense)
            model.load_state_dict(torch.load(path, weights_only=True))
            self.form = "state_dict"
        rows = {}
        for name, t in ec.tables.items():
            table = self[name]
            full = initial_rows(t.cfg, t.width, table.ids)  # (the state columns: unused)
            full[:, : t.cfg.dim] = table.rows
            rows[name] = {"ids": table.ids, "rows": full}
        ec.load_rows(rows, max(t.step for t in self.values()) if self else 0)
        model.eval()
        self._model, self._ec = model, ec

    @torch.no_grad()
    def predict(self, batch: SparseBatch) -> dict[str, torch.Tensor]:
        """Each task's predictions on ``batch``: ``{task: Tensor[B]}``, a binary task's
        probability, a regression's value."""
        if self._model is None:
            self._build(int(batch.dense.shape[1]))
        assert self._model is not None and self._ec is not None and self.objective is not None
        prepared = self._ec.prepare(batch)
        for name, tids in prepared.tables.items():
            _, found = self[name].find(tids.unique)
            self.unknown_ids[name] += int(np.count_nonzero(~found))
        return task_predictions(self.objective, self._model(prepared))


    @torch.no_grad()
    def encode_users(self, batch: SparseBatch) -> np.ndarray:
        """A retrieval model's user embeddings of ``batch`` [B, D] (its user tower)."""
        return self._towers(batch).encode_users(self._model_batch(batch)).numpy()

    @torch.no_grad()
    def encode_items(self, batch: SparseBatch) -> np.ndarray:
        """A retrieval model's item embeddings of ``batch`` [B, D] (its item tower)."""
        return self._towers(batch).encode_items(self._model_batch(batch)).numpy()

    def top_k(self, batch: SparseBatch, k: int = 10, index: str = "flat",
              exclude: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` corpus items of highest score for each user of ``batch``: item IDs
        [B, k] and their scores, searched in the export's ``flat`` (exact) or ``ivf`` index.
        ``exclude``: a feature of the batch (``hist_item``, say) whose IDs are left out of each
        user's top-k (the items the user has seen)."""
        if index not in self._indexes:
            self._indexes[index] = ItemIndex(self.root, self.retrieval or {}, index)
        search = self._indexes[index].search
        users = self.encode_users(batch)
        if exclude is None:
            return search(users, k)
        if exclude not in batch.keys:
            raise ServingError(f"top_k: exclude '{exclude}' is not a feature of the batch "
                               f"({batch.keys})")
        seen, lengths = (t.numpy() for t in batch.feature(exclude))
        width = int(lengths.max()) if lengths.shape[0] else 0
        ids, scores = search(users, k + width)
        rows = np.repeat(np.arange(lengths.shape[0]), lengths)
        cols = np.arange(seen.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        padded = np.full((lengths.shape[0], max(width, 1)), -1, dtype=np.int64)
        padded[rows, cols] = seen
        dropped = (ids[:, :, None] == padded[:, None, :]).any(axis=2)
        keep = np.argsort(dropped, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(ids, keep, 1), np.take_along_axis(scores, keep, 1)

    def _towers(self, batch: SparseBatch) -> Any:
        if self._model is None:
            self.use_program = False  # (a retrieval model's towers: the state_dict's model)
            self._build(int(batch.dense.shape[1]))
        towers = getattr(self._model, "model", None)
        if not hasattr(towers, "encode_users") or not hasattr(towers, "encode_items"):
            raise ServingError(f"{self.root}: the model has no towers (encode_users, "
                               "encode_items): not a retrieval model")
        return towers

    def _model_batch(self, batch: SparseBatch) -> Batch:
        assert self._ec is not None
        return Batch(self._ec.prepare(batch), torch.device("cpu"))


def load(path: str | Path, deltas: Sequence[str | Path] = (), check: bool = True,
         use_program: bool = True) -> Predictor:
    """The predictor of the full export at ``path`` with ``deltas`` applied in order (see
    ``cosparse.serving.load.load_tables``): its tables by name, and ``predict`` with the dense
    model of the last export given: its ``torch.export`` program where it has one (and
    ``use_program``), else the model rebuilt from its reference and ``state_dict``."""
    last = Path(deltas[-1]) if deltas else Path(path)
    tables = load_tables(path, deltas, check)
    manifest = read_manifest(last)
    return Predictor(tables, manifest.get("dense"), last, use_program, manifest.get("retrieval"))


def _build_model(cfg: Config, reference: dict[str, Any], num_dense: int
                 ) -> tuple[nn.Module, EmbeddingCollection]:
    """The model ``reference`` names on CPU, with its embedding collection (all resident)."""
    cpu = torch.device("cpu")
    if "factory" in reference:
        from cosparse.api.factory import build_factory_model
        from cosparse.nn.engine_model import EngineModel

        user = build_factory_model(cfg, num_dense)
        objective = objective_of(cfg.objective)
        model = EngineModel(user, None if objective.default else list(objective.tasks),
                            cfg.train.seed)
        ec = EmbeddingCollection(cfg.tables, device=cpu)
        model.ec = ec
        return model, ec
    from cosparse.models.builtin import build_model

    built = build_model(cfg, num_dense, cpu)
    return built, built.ec
