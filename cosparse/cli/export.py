"""``cosparse export``: a checkpoint's embedding rows for serving.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_export_parser(sub: Any) -> None:
    e = sub.add_parser("export", help="a checkpoint's embedding rows for serving, without "
                                      "optimizer state (all of them, or those changed since a "
                                      "step), and its dense model beside them")
    e.add_argument("--checkpoint", required=True, help="checkpoint dir (or root with LATEST)")
    e.add_argument("--out", required=True, help="a new directory for the export")
    e.add_argument("--since", type=int, default=None, metavar="STEP",
                   help="only the rows changed since this saved step (a delta)")
    e.add_argument("--fp16", action="store_true", help="rows as float16 (default float32)")
    e.add_argument("--format", choices=["parquet", "npy"], default="parquet", dest="file_format")
    e.add_argument("--ps-root", action="append", default=None,
                   help="an external PS shard's --data-dir, once per shard in shard order "
                        "(default: the embedded shards' store.remote.data_dir)")
    e.add_argument("--shard-rows", type=int, default=1_000_000, help="rows per file")
    e.add_argument("--model-path", action="append", default=[], metavar="DIR",
                   help="a folder where model.factory's module is found, to export the model's "
                        "torch.export program (repeatable; without it the model is served from "
                        "its state_dict, and the manifest says why)")
    e.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from cosparse.api.factory import add_model_paths
    from cosparse.serving.export import export

    add_model_paths(args.model_path)
    m = export(args.checkpoint, args.out, args.since, args.fp16, args.file_format,
               args.ps_root, args.shard_rows)
    print(json.dumps({"out": args.out, "kind": m["kind"], "step_range": m["step_range"],
                      "tables": {n: {k: t[k] for k in ("rows", "removed", "method")}
                                 for n, t in m["tables"].items()}}, sort_keys=True))
    return 0
