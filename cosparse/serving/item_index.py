"""The item side of a retrieval model's export (``retrieval/`` beside the tables, named by the
manifest's ``retrieval`` entry): every item of the training log's corpus encoded by the exported
model's item tower (``ids.npy``, ``embeddings.npy``), and FAISS indexes over the embeddings for
top-k by inner product: ``flat.faiss`` (exact) and ``ivf.faiss`` (an inverted file of ``nlist``
lists, searched ``nprobe`` at a time: approximate, faster on a large corpus).

FAISS (``faiss-cpu``, the ``retrieval`` extra) builds, writes and searches the indexes; nothing
here reimplements nearest-neighbour search. The corpus comes from the config's data, as the
trainer's evaluation ranks it (``cosparse.data.item_corpus``); without the data at export time,
the entry says why and no index is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from cosparse.serving.format import sha256_file

RETRIEVAL_DIR = "retrieval"
NPROBE = 8


def is_retrieval(config: dict[str, Any]) -> bool:
    """Whether the checkpoint's config trains a retrieval task."""
    tasks = ((config.get("objective") or {}).get("tasks") or {}).values()
    return (config.get("model") or {}).get("kind") == "two_tower" or any(
        (t or {}).get("kind") == "retrieval" for t in tasks)


def write_item_index(out: Path, config: dict[str, Any], predictor: Any) -> dict[str, Any]:
    """Encode the corpus with ``predictor``'s item tower and write ``out/retrieval/``; the
    manifest's ``retrieval`` entry."""
    import faiss

    from cosparse.config import config_from_mapping
    from cosparse.data.interactions import InteractionsReader
    from cosparse.data.item_corpus import item_corpus
    from cosparse.train.inputs import model_inputs

    cfg = config_from_mapping(config)
    try:
        reader = model_inputs(cfg).eval
    except (OSError, ValueError) as e:  # (the data is not where the config says, any more)
        return {"items": None, "why": f"the corpus could not be read from data.path "
                                      f"{cfg.data.path} ({type(e).__name__}: {e})"}
    if not isinstance(reader, InteractionsReader):
        return {"items": None, "why": f"data.reader '{cfg.data.reader}' has no item corpus"}
    ids, batches = item_corpus(reader, 4096)
    emb = np.ascontiguousarray(np.concatenate([predictor.encode_items(b) for b in batches]),
                               dtype=np.float32)
    d = out / RETRIEVAL_DIR
    d.mkdir()
    np.save(d / "ids.npy", ids)
    np.save(d / "embeddings.npy", emb)
    flat = faiss.IndexFlatIP(emb.shape[1])
    flat.add(emb)
    faiss.write_index(flat, str(d / "flat.faiss"))
    nlist = max(1, min(int(4 * math.sqrt(emb.shape[0])), emb.shape[0] // 39))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(emb.shape[1]), emb.shape[1], nlist,
                             faiss.METRIC_INNER_PRODUCT)
    ivf.train(emb)
    ivf.add(emb)
    faiss.write_index(ivf, str(d / "ivf.faiss"))
    files = {k: {"path": f"{RETRIEVAL_DIR}/{f}", "sha256": sha256_file(d / f)}
             for k, f in (("ids", "ids.npy"), ("embeddings", "embeddings.npy"),
                          ("flat", "flat.faiss"), ("ivf", "ivf.faiss"))}
    return {"items": int(ids.shape[0]), "dim": int(emb.shape[1]), "nlist": nlist,
            "nprobe": NPROBE, "files": files, "why": None}


class ItemIndex:
    """An export's item IDs and one of its FAISS indexes (``flat`` or ``ivf``)."""

    def __init__(self, root: Path, entry: dict[str, Any], kind: str) -> None:
        import faiss

        from cosparse.serving.format import ServingError

        if not entry or entry.get("items") is None:
            why = (entry or {}).get("why", "the export holds no retrieval entry")
            raise ServingError(f"{root}: no item index to search ({why})")
        if kind not in ("flat", "ivf"):
            raise ServingError(f"index: 'flat' or 'ivf', got {kind!r}")
        for key in ("ids", kind):
            f = entry["files"][key]
            if sha256_file(root / f["path"]) != f["sha256"]:
                raise ServingError(f"{root / f['path']}: checksum mismatch (export again)")
        self.ids = np.load(root / entry["files"]["ids"]["path"])
        self.index = faiss.read_index(str(root / entry["files"][kind]["path"]))
        if kind == "ivf":
            self.index.nprobe = int(entry["nprobe"])

    def search(self, users: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` items of highest inner product with each user: IDs [B, k], scores."""
        scores, at = self.index.search(np.ascontiguousarray(users, dtype=np.float32), k)
        return self.ids[np.maximum(at, 0)], scores
