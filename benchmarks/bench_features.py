"""Feature-extraction throughput: the feature platform over a Criteo spec vs the plain Criteo reader.

Workload: ../shared/data/criteo/train_head10k.txt (10k lines), batch 4096 (--batch), all lines.
  features   FeatureReader over configs/features/criteo.yaml, extracting the union of its two
             consumers (dlrm_v1, deepfm_v1): 13 dense (fill_missing, clip, log1p), 26 hashed C
             columns, 3 bucketized I columns, 4 crosses; one extraction per batch builds both
             consumers' SparseBatches (parse + extract + two to_sparse_batch calls).
  plain      CriteoTSVReader.build: parse + the built-in log1p dense / raw-ID bags (no hashing).
Both read the same pre-cut tasks (raw bytes in memory), alternating each round, in one process;
reported: median rows/s over rounds and the ratio features / plain (1.0 = free extraction).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, SHARED_DATA, machine_info, median, write_json
from cosparse.data import CriteoTSVReader
from cosparse.features import CriteoRawSource, FeatureExtractor, load_spec

DATA = SHARED_DATA / "criteo" / "train_head10k.txt"
SPEC = REPO / "configs" / "features" / "criteo.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few rounds (< 60 s)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5, --quick 3)")
    ap.add_argument("--passes", type=int, default=None, help="passes over the file per round "
                                                             "(default 10, --quick 3)")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    passes = args.passes or (3 if args.quick else 10)
    if not Path(args.data).is_file():
        print(f"bench_features: {args.data} not found", file=sys.stderr)
        return 2

    fs = load_spec(args.spec)
    models = list(fs.consumers)
    keys = {m: fs.consumer_keys(m) for m in models}
    union = list(dict.fromkeys(n for m in models for part in keys[m] for n in part))
    src = CriteoRawSource(args.data, args.batch, "train", 0.0)
    fs.check_source(src.columns)
    ex = FeatureExtractor(fs, union)
    plain = CriteoTSVReader(args.data, args.batch, "train", 0.0)
    tasks = list(src.tasks())
    rows = sum(t.num_lines for t in tasks)

    def run_features() -> float:
        t0 = time.perf_counter()
        for _ in range(passes):
            for t in tasks:
                fb = ex.extract(src.build_raw(t))
                for m in models:
                    fb.to_sparse_batch(*keys[m])
        return rows * passes / (time.perf_counter() - t0)

    def run_plain() -> float:
        t0 = time.perf_counter()
        for _ in range(passes):
            for t in tasks:
                plain.build(t)
        return rows * passes / (time.perf_counter() - t0)

    run_features()  # warm the numba caches
    run_plain()
    feat, base = [], []
    for r in range(rounds):
        order = [run_features, run_plain] if r % 2 == 0 else [run_plain, run_features]
        for fn in order:
            (feat if fn is run_features else base).append(fn())
    f_med, p_med = median(feat), median(base)
    res = {
        "features_rows_per_s": f_med,
        "plain_rows_per_s": p_med,
        "ratio": f_med / p_med,
        "features_computed_per_batch": len(ex.plan),
        "consumers": {m: {"sparse": len(keys[m][0]), "dense": len(keys[m][1])} for m in models},
        "rounds_features_rows_per_s": feat,
        "rounds_plain_rows_per_s": base,
        "config": {"data": args.data, "spec": args.spec, "batch": args.batch, "rows": rows,
                   "rounds": rounds, "passes": passes},
        "machine": machine_info(),
    }
    print(f"features: {f_med:,.0f} rows/s ({len(ex.plan)} features per batch, {len(models)} consumers)")
    print(f"plain CriteoTSVReader: {p_med:,.0f} rows/s")
    print(f"ratio = {res['ratio']:.3f}")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
