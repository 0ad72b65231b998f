"""Command line: ``cosparse train``, ``cosparse compare``, ``cosparse plan``, ``cosparse ps
serve|keygen``, ``cosparse features lineage|diff|fit|materialize`` and ``cosparse export``."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from cosparse.config import ColumnsConfig, ConfigError, config_from_mapping, load_config
from cosparse.ps.command import add_ps_parser


def _train(args: argparse.Namespace) -> int:
    from cosparse.exits import report_now
    from cosparse.train.trainer import Trainer

    overrides = {}
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.metrics_json:
        overrides["train.metrics_json"] = args.metrics_json
    if args.data:
        overrides["data.path"] = args.data
    if args.no_progress:
        overrides["train.progress"] = False
    cfg = load_config(args.config, overrides)
    if os.environ.get("RANK", "0") == "0":  # (under torchrun rank 0 alone writes metrics)
        from tqdm import tqdm

        from cosparse.train.metrics_path import choose_metrics_path

        cfg.train.metrics_json = choose_metrics_path(cfg, args.config, args.resume, args.append)
        tqdm.write(f"metrics: {cfg.train.metrics_json}")
    if args.fresh:  # before any shard starts: they would restore what is discarded here
        from tqdm import tqdm

        from cosparse.config import model_config
        from cosparse.train.leftovers import discard_earlier_run

        for c in [model_config(cfg, i) for i in range(len(cfg.models))] if cfg.models else [cfg]:
            discard_earlier_run(c, tqdm.write)
    agent = None
    if cfg.train.autotune.knobs:
        if cfg.models or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("train.autotune: the live agent tunes one model on one process "
                              "(not models: or torchrun; tune those offline with cosparse tune)")
        from tqdm import tqdm

        from cosparse.autotune.live import LiveAgent, journal_path

        agent = LiveAgent(cfg, journal_path(cfg), log=tqdm.write)
        tqdm.write(f"autotune: live agent on {', '.join(cfg.train.autotune.knobs)}, every "
                   f"{cfg.train.autotune.every} steps; audit journal {journal_path(cfg)}")
    if cfg.models:  # several models from one feature extraction
        from cosparse.train.multi import MultiTrainer

        trainer = MultiTrainer(cfg)
    else:
        trainer = Trainer(cfg, on_interval=agent)
    try:
        if args.resume:
            trainer.resume(args.resume)
        final = trainer.run()
    except BaseException as e:
        report_now(e)  # the failure's line first, then the cleanup (issue 32, item 11)
        raise
    finally:
        trainer.close()
    from cosparse.strict_json import dumps_metrics

    if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 speaks for the run
        print(dumps_metrics({"final": final}, sort_keys=True))  # an undefined metric is null
    return 1 if final.get("failed_models") else 0  # a model failed alone (train.isolate_models)


def _capacities(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as comma-separated numbers") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("capacities must be positive numbers")
    return values


def _plan(args: argparse.Namespace) -> int:
    if args.sharding:
        return _plan_sharding(args)
    if args.tiers:
        return _plan_tiers(args)
    if args.steps is None:
        raise ConfigError("cosparse plan: --steps is required (batches of the trace to replay)")
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.run import run_plan

    def body() -> int:
        inputs = model_inputs(load_config(args.config,
                                          {"data.path": args.data} if args.data else {}))
        run_plan(inputs.cfg, args.steps, args.out or "runs/plan", args.capacities,
                 args.lookahead, args.decay, progress=not args.no_progress,
                 config_path=str(args.config), reader=inputs.train)
        return 0

    return body()


def _plan_tiers(args: argparse.Namespace) -> int:
    """Device and host sizes, PS shards and traffic under budgets, and their drift."""
    from cosparse.config.sizes import parse_bytes
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.tiers import describe, drift, plan_tiers
    from cosparse.tune.trace import build_traces

    if args.steps is None:
        raise ConfigError("cosparse plan --tiers: --steps is required (batches to replay)")
    if "device" not in args.budget:
        raise ConfigError("cosparse plan --tiers: --budget device=SIZE is required")
    device = parse_bytes(args.budget["device"], "--budget device")
    host = parse_bytes(args.budget["host"], "--budget host") if "host" in args.budget else None
    shard = parse_bytes(args.ps_shard_memory, "--ps-shard-memory")
    policies = tuple(args.policies.split(",")) if args.policies else None

    def recommend(path: str) -> Any:
        inputs = model_inputs(load_config(path, {"data.path": args.data} if args.data else {}))
        traces = build_traces(inputs.cfg, args.steps, progress=not args.no_progress,
                              reader=inputs.train)
        return plan_tiers(inputs.cfg, traces, device, host, shard, policies)

    rep = recommend(args.config)
    print(describe(rep))
    doc: dict[str, Any] = {"config": str(args.config), "steps": args.steps, **rep.to_dict()}
    if args.drift:
        later = recommend(args.drift)
        doc["drift"] = {"config": str(args.drift), **drift(rep, later)}
        print(f"\ndrift to {args.drift}:")
        print(describe(later))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tiers.json").write_text(json.dumps(doc, indent=1))
        print(f"wrote {out / 'tiers.json'}")
    return 0


def _plan_sharding(args: argparse.Namespace) -> int:
    """The sharding planner on paper: statistics from the config's reader, the world given."""
    import itertools

    from cosparse.parallel.engine import make_plan
    from cosparse.train.inputs import model_inputs
    from cosparse.tune.hotness import table_hotness

    overrides: dict[str, object] = {"data.path": args.data} if args.data else {}
    if args.link_gbps is not None:
        overrides["parallel.link_gbps"] = args.link_gbps
    cfg = load_config(args.config, overrides)
    per_node = args.ranks_per_node or cfg.parallel.ranks_per_node or min(args.ranks, 8)
    if args.ranks < 1 or args.ranks % per_node:
        raise ConfigError(f"--ranks {args.ranks}: not a whole number of nodes of {per_node} ranks")
    inputs = model_inputs(cfg)
    cfg, reader = inputs.cfg, inputs.train
    tasks = reader.tasks()
    probe = [reader.build(t) for t in itertools.islice(tasks, args.steps or 50)]
    if hasattr(tasks, "close"):
        tasks.close()
    plan = make_plan(cfg, probe, args.ranks, per_node, table_hotness(cfg))
    print(f"from {len(probe)} batches of {cfg.data.batch_size} samples")
    print(plan.describe())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cost = plan.cost
        doc = {"world_size": plan.world_size, "ranks_per_node": plan.ranks_per_node,
               "tables": {n: {"kind": s.kind, "owners": list(s.owners),
                              "chosen_by": plan.chosen_by.get(n)} for n, s in plan.tables.items()},
               "predicted": None if cost is None else {
                   "link_bytes_per_step": cost.link_bytes, "sent_bytes_per_rank": cost.sent_bytes,
                   "held_bytes_per_rank": cost.held_bytes, "ps_bytes_per_rank": cost.ps_bytes,
                   "busiest_rank_s": cost.seconds,
                   "link_gbps": cost.link_gbps}}
        (out / "sharding.json").write_text(json.dumps(doc, indent=1))
        print(f"wrote {out / 'sharding.json'}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from cosparse.report.compare_file import read_compare
    from cosparse.report.html import write_report

    doc = read_compare(args.compare, lambda m: print(m, file=sys.stderr))
    out = write_report(doc, args.out or Path(args.compare).with_name("report.html"))
    print(f"wrote {out}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from cosparse.report.explain import explain

    e = explain(Path(args.run), args.threshold_ms, args.steps, args.top)
    print(e.text())
    if args.json:
        Path(args.json).write_text(json.dumps(e.to_json(), indent=1))
        print(f"wrote {args.json}")
    return 0


def _step_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FROM-TO, e.g. 100-120") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 <= FROM <= TO")
    return a, b


def _compare(args: argparse.Namespace) -> int:
    from cosparse.report.compare import compare

    def body() -> int:
        result = compare(args.config, args.a, args.b, args.steps, args.out, warmup=args.warmup,
                         link_mbps=args.link_mbps, link_latency_ms=args.link_latency_ms,
                         data=args.data, config_b=args.config_b)
        a, b = result["runs"]["a"], result["runs"]["b"]
        print(json.dumps({
            "loss_identical": result["loss_identical"],
            "samples_per_s": {"a": a["samples_per_s"], "b": b["samples_per_s"]},
            "bytes_per_step": {"a": a["bytes_per_step"], "b": b["bytes_per_step"]},
            "out": args.out,
        }, sort_keys=True))
        return 0

    return body()


def _features_lineage(args: argparse.Namespace) -> int:
    from cosparse.features import format_lineage, lineage, load_spec

    def body() -> int:
        fs = load_spec(args.spec, check_pins=False)
        print(json.dumps(lineage(fs), indent=1) if args.json else format_lineage(fs))
        return 0

    return body()


def _features_diff(args: argparse.Namespace) -> int:
    from cosparse.features import diff, format_diff, load_spec

    def body() -> int:
        a, b = load_spec(args.a, check_pins=False), load_spec(args.b, check_pins=False)
        print(json.dumps(diff(a, b), indent=1) if args.json else format_diff(a, b))
        return 0

    return body()


def _features_materialize(args: argparse.Namespace) -> int:
    from cosparse.features import load_spec, materialize, open_source, require_fitted

    def body() -> int:
        fs = load_spec(args.spec)
        feats = [f for f in args.features.split(",") if f.strip()] if args.features else None
        src = open_source(args.data, args.batch_size, "train", 0.0, args.on_bad_record, args.source)
        require_fitted(fs, args.spec, feats)
        manifest = materialize(src, fs, args.out, feats, progress_every=args.progress_every)
        print(json.dumps({"out": args.out, "rows": manifest["rows"],
                          "bad_records": manifest["bad_records"],
                          "features": {n: f["version"] for n, f in manifest["features"].items()}},
                         sort_keys=True))
        return 0

    return body()


def _features_fit(args: argparse.Namespace) -> int:
    from cosparse.features import fit_spec_file

    def body() -> int:
        fitted = fit_spec_file(args.spec, args.data, args.out, args.rows, args.eval_fraction,
                               args.on_bad_record, args.source)
        print(json.dumps({"out": args.out, "fitted": fitted}, sort_keys=True))
        return 0

    return body()


def _add_features(sub: argparse._SubParsersAction) -> None:
    fp = sub.add_parser("features", help="feature platform: lineage, diff, fit, materialize")
    fps = fp.add_subparsers(dest="features_command", required=True)
    li = fps.add_parser("lineage", help="print the feature DAG with versions and consuming models")
    li.add_argument("--spec", required=True, help="YAML feature spec")
    li.add_argument("--json", action="store_true", help="print the structure as JSON")
    li.set_defaults(func=_features_lineage)
    d = fps.add_parser("diff", help="added / removed / changed features and the models affected")
    d.add_argument("a", help="old YAML feature spec")
    d.add_argument("b", help="new YAML feature spec")
    d.add_argument("--json", action="store_true", help="print the structure as JSON")
    d.set_defaults(func=_features_diff)
    m = fps.add_parser("materialize", help="extract features once and write them to Parquet, "
                                            "keyed by feature version")
    _add_spec_and_data(m)
    m.add_argument("--out", required=True, help="output directory (manifest.json + one file per feature)")
    m.add_argument("--features", default=None, help="comma-separated features (default: all)")
    m.add_argument("--batch-size", type=int, default=65536, help="rows per batch / row group")
    m.add_argument("--progress-every", type=int, default=10, help="a progress line per N batches")
    m.set_defaults(func=_features_materialize)
    f = fps.add_parser("fit", help="fit the spec's quantile buckets on a sample and write the "
                                   "fitted spec (its boundaries are part of the versions)")
    _add_spec_and_data(f)
    f.add_argument("--out", required=True, help="the fitted spec to write (YAML)")
    f.add_argument("--rows", type=int, default=100000,
                   help="fit on the first ROWS rows of the training split")
    f.add_argument("--eval-fraction", type=float, default=0.2,
                   help="the held-out tail the sample must not touch (as data.eval_fraction)")
    f.set_defaults(func=_features_fit)


def _add_spec_and_data(p: argparse.ArgumentParser) -> None:
    """The spec and the raw data a features command reads."""
    p.add_argument("--spec", required=True, help="YAML feature spec")
    p.add_argument("--data", required=True, help="Criteo TSV (.txt, .gz) or Parquet (.parquet) file")
    p.add_argument("--source", choices=["criteo", "parquet"], default=None,
                   help="source format (default: by extension)")
    p.add_argument("--on-bad-record", choices=["fail", "skip"], default="fail")


def _data_describe(args: argparse.Namespace) -> int:
    """``cosparse data describe``: see ``cosparse.features.describe``."""
    from cosparse.features.csv_columns import NAME_OF_KIND
    from cosparse.features.describe import run_describe
    from cosparse.train.inputs import raw_source

    if args.config:
        data = load_config(args.config, {"data.path": args.path}).data
        label = data.columns.label if data.columns else "label"
    else:
        from cosparse.config import DataConfig

        parquet = args.path.endswith((".parquet", ".pq"))
        data = DataConfig(reader="parquet" if parquet else "csv", path=args.path)
        label = None
    data = dataclasses.replace(data, batch_size=args.batch_size, eval_fraction=0.0,
                               columns=dataclasses.replace(
                                   data.columns or ColumnsConfig(), label=None, drop=[]))
    source = raw_source(data, "train")
    types = getattr(source, "types", {c: NAME_OF_KIND[k] for c, k in source.columns.items()})
    print(run_describe(source, types, args.path, label, args.rows, not args.no_progress))
    return 0


def _data_baseline(args: argparse.Namespace) -> int:
    """``cosparse data baseline``: the AUC a model must beat on the config's own split."""
    from cosparse.train.baseline import logistic_regression, popularity
    from cosparse.train.inputs import model_inputs

    inputs = model_inputs(load_config(args.config, {"data.path": args.data} if args.data else {}))
    for note in inputs.notes:
        print(note, file=sys.stderr)
    if args.kind == "auto":
        args.kind = "popularity" if "item" in inputs.train.keys else "logistic"
    if args.kind == "popularity":
        result = popularity(inputs.train, inputs.eval)
    else:
        result = logistic_regression(inputs.train, inputs.eval, epochs=args.epochs, lr=args.lr)
    print(json.dumps({"baseline": args.kind, "auc": result.auc, "auc_se": result.auc_se,
                      "eval_samples": result.eval_samples}))
    return 0


def _add_data(sub: argparse._SubParsersAction) -> None:
    dp = sub.add_parser("data", help="look at a data file before writing a config")
    dps = dp.add_subparsers(dest="data_command", required=True)
    d = dps.add_parser("describe", help="each column's type, distinct values, nulls and range, "
                                        "the label's balance and a data.columns block")
    d.add_argument("path", help="a CSV/TSV file (plain or .gz), a directory, a glob, or Parquet")
    d.add_argument("--config", default=None, help="read it as this config's data section does "
                                                  "(reader, csv options, schema, label)")
    d.add_argument("--rows", type=int, default=None, help="only the first N rows (default: all)")
    d.add_argument("--batch-size", type=int, default=65536, help="rows read at a time")
    d.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    d.set_defaults(func=_data_describe)
    b = dps.add_parser("baseline", help="the eval AUC of a simple baseline on the config's own "
                                        "features and split: item popularity or logistic "
                                        "regression over the hashed IDs")
    b.add_argument("--config", required=True)
    b.add_argument("--data", default=None, help="override data.path")
    b.add_argument("--kind", choices=["auto", "popularity", "logistic"], default="auto",
                   help="auto: popularity when the samples have an 'item' feature")
    b.add_argument("--epochs", type=int, default=3, help="logistic: passes over the train split")
    b.add_argument("--lr", type=float, default=0.05, help="logistic: Adagrad's learning rate")
    b.set_defaults(func=_data_baseline)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cosparse", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a model from a YAML config")
    t.add_argument("--config", required=True)
    t.add_argument("--steps", type=int, default=None, help="override train.steps")
    t.add_argument("--metrics-json", default=None,
                   help="write metrics as JSON lines here (default train.metrics_json, else a "
                        "new runs/<time>-<config>/metrics.jsonl)")
    t.add_argument("--append", action="store_true",
                   help="a fresh run may add its metrics to a metrics file that already holds "
                        "an earlier run's (refused otherwise; --resume always appends)")
    start = t.add_mutually_exclusive_group()
    start.add_argument("--resume", default=None, help="checkpoint dir (or root with LATEST) to resume")
    start.add_argument("--fresh", action="store_true",
                       help="start at step 0 even though store.remote.data_dir holds an earlier "
                            "run's PS snapshots: discard them, and the checkpoints that name them "
                            "(external shards: drop this run's namespace's tables there)")
    t.add_argument("--data", default=None, help="override data.path")
    t.add_argument("--no-progress", action="store_true", help="plain log lines, no progress bar")
    t.set_defaults(func=_train)
    pl = sub.add_parser("plan", help="replay the ID trace and simulate device-cache hit rates")
    pl.add_argument("--config", required=True)
    pl.add_argument("--data", default=None, help="override data.path")
    pl.add_argument("--steps", type=int, default=None,
                    help="batches of the trace to replay (--sharding: the statistics' batches, "
                         "default 50)")
    pl.add_argument("--out", default=None,
                    help="directory for plan.json and plan.png (default runs/plan), or, with "
                         "--sharding, sharding.json (default: print only)")
    pl.add_argument("--sharding", action="store_true",
                    help="plan the tables' sharding over --ranks instead of the cache")
    pl.add_argument("--tiers", action="store_true",
                    help="recommend device and host sizes and PS shards under --budget, with "
                         "the hit rate of each tier and the PS bytes per step they predict")
    pl.add_argument("--budget", type=_budgets, default={},
                    help="--tiers: device=SIZE[,host=SIZE] (no host budget: every row fits)")
    pl.add_argument("--ps-shard-memory", default="16GiB",
                    help="--tiers: the memory of one PS shard, for the shard count")
    pl.add_argument("--policies", default=None,
                    help="--tiers: eviction policies to choose from (default lru,lfu,hotness)")
    pl.add_argument("--drift", default=None, metavar="CONFIG",
                    help="--tiers: a second workload (this week's): how the sizes change")
    pl.add_argument("--ranks", type=int, default=2, help="--sharding: the world size")
    pl.add_argument("--ranks-per-node", type=int, default=None,
                    help="--sharding: ranks per node (default parallel.ranks_per_node, or 8)")
    pl.add_argument("--link-gbps", type=float, default=None,
                    help="--sharding: rank-to-rank link bandwidth (default parallel.link_gbps)")
    pl.add_argument("--capacities", type=_capacities, default=[0.01, 0.02, 0.05, 0.1, 0.2, 0.5],
                    help="fractions of each table's distinct IDs (values > 1: rows)")
    pl.add_argument("--lookahead", type=int, default=4, help="window of lookahead-k (0: off)")
    pl.add_argument("--decay", type=float, default=0.99, help="hotness decay per batch")
    pl.add_argument("--no-progress", action="store_true", help="no progress bars")
    pl.set_defaults(func=_plan)
    c = sub.add_parser("compare", help="train two variants (A and B) on the same data and "
                                        "write compare.json and report.html")
    c.add_argument("--config", required=True)
    c.add_argument("--config-b", default=None,
                   help="variant b's own config file (default: --config), e.g. the same model "
                        "fed by the feature platform")
    c.add_argument("--a", default="arch-a", help="PRESET[,key=value...] (default arch-a)")
    c.add_argument("--b", default="arch-b", help="PRESET[,key=value...] (default arch-b)")
    c.add_argument("--steps", type=int, required=True, help="steps of each run")
    c.add_argument("--warmup", type=int, default=None,
                   help="steps before measuring (default: a fifth of --steps, at most 50)")
    c.add_argument("--link-mbps", type=float, default=None,
                   help="shape every simulated link to this bandwidth (one bucket per link)")
    c.add_argument("--link-latency-ms", type=float, default=0.0, help="one-way latency per message")
    c.add_argument("--data", default=None, help="override data.path")
    c.add_argument("--out", default="runs/compare", help="directory for compare.json and report.html")
    c.set_defaults(func=_compare)
    r = sub.add_parser("report", help="render report.html again from a saved compare.json")
    r.add_argument("compare", help="a compare.json of `cosparse compare`")
    r.add_argument("--out", default=None, help="the HTML file (default: report.html beside it)")
    r.set_defaults(func=_report)
    ex = sub.add_parser("explain", help="attribute a run's slow steps: the stage that grew and "
                                        "the likely cause, from its step records")
    ex.add_argument("run", help="a run directory (with steps.jsonl) or a steps file")
    ex.add_argument("--threshold-ms", type=float, default=None,
                    help="steps slower than this are slow (default: at or above the run's p99)")
    ex.add_argument("--steps", type=_step_range, default=None,
                    help="explain these steps, FROM-TO, slow or not")
    ex.add_argument("--top", type=int, default=20, help="at most this many steps, the slowest")
    ex.add_argument("--json", default=None, help="also write the attribution as JSON here")
    ex.set_defaults(func=_explain)
    _add_tune(sub)
    add_ps_parser(sub)
    _add_features(sub)
    _add_data(sub)
    _add_export(sub)
    return p


def _add_export(sub: Any) -> None:
    e = sub.add_parser("export", help="a checkpoint's embedding rows for serving, without "
                                      "optimizer state (all of them, or those changed since a step)")
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
    e.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from cosparse.serving.export import export

    m = export(args.checkpoint, args.out, args.since, args.fp16, args.file_format,
               args.ps_root, args.shard_rows)
    print(json.dumps({"out": args.out, "kind": m["kind"], "step_range": m["step_range"],
                      "tables": {n: {k: t[k] for k in ("rows", "removed", "method")}
                                 for n, t in m["tables"].items()}}, sort_keys=True))
    return 0


def _budgets(text: str) -> dict[str, str]:
    """``device=2GiB,host=16GiB,ps_bytes_per_step=50MB`` as a mapping."""
    out = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in ("device", "host", "ps_bytes_per_step"):
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected device=SIZE, host=SIZE or ps_bytes_per_step=SIZE")
        out[key] = value
    return out


def _add_tune(sub: Any) -> None:
    tu = sub.add_parser("tune", help="search the config's exact knobs with short real runs "
                                     "(Optuna), within budgets, and write the best config")
    tu.add_argument("--config", default=None, help="the start configuration (YAML)")
    tu.add_argument("--trials", type=int, default=20, help="candidates to run")
    tu.add_argument("--minutes", type=float, default=None, help="stop starting trials after this")
    tu.add_argument("--budget", type=_budgets, default={},
                    help="device=SIZE,host=SIZE,ps_bytes_per_step=SIZE: Optuna constraints")
    tu.add_argument("--warmup", type=int, default=4, help="steps before the measured windows")
    tu.add_argument("--windows", type=int, default=6, help="measured windows per trial")
    tu.add_argument("--window-steps", type=int, default=4, help="steps per measured window")
    tu.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    tu.add_argument("--out", default="runs/tune", help="journal, best.yaml, diff.txt, report")
    tu.add_argument("--allow", choices=["semantic"], default=None,
                    help="semantic: apply a semantic knob (batch size, learning rates, admission, "
                         "TTL) that passes the AUC gate; without it they are suggestions only")
    tu.add_argument("--auc-gate", type=float, default=0.0,
                    help="the held-out AUC a semantic change may lose (default 0)")
    tu.add_argument("--ranks", type=int, default=1,
                    help="also try world sizes up to this (torchrun trials on this host) and "
                         "every table's sharding: reordering knobs, kept within the "
                         "parallelism tolerance of the start (default 1: none)")
    tu.add_argument("--no-semantic", action="store_true",
                    help="skip measuring the semantic knobs (no suggestions)")
    tu.add_argument("--replay", default=None, metavar="LOG",
                    help="re-derive the decision from a journal, running nothing")
    tu.set_defaults(func=_tune)


def _tune(args: argparse.Namespace) -> int:
    """The offline agent (``cosparse.autotune``), or a replay of its journal."""
    from cosparse.autotune.agent import Window, load, replay, tune
    from cosparse.autotune.knobs import exact_knobs, reordering_knobs, semantic_knobs
    from cosparse.autotune.output import write_outputs
    from cosparse.autotune.types import Budgets
    from cosparse.config.load import read_config_mapping
    from cosparse.config.sizes import parse_bytes

    if args.replay:
        again, recorded = replay(Path(args.replay))
        same = recorded is not None and again["trial"] == recorded["trial"] and \
            again["params"] == recorded["params"] and \
            again.get("semantic") == recorded.get("semantic")
        print(json.dumps({"replayed": again, "recorded": recorded, "same": same}, indent=1))
        return 0 if same else 1
    if not args.config:
        raise ConfigError("cosparse tune: --config is needed (or --replay LOG)")
    raw = read_config_mapping(args.config)
    cfg = config_from_mapping(copy.deepcopy(raw))
    b = args.budget
    budgets = Budgets(
        device_bytes=parse_bytes(b["device"], "--budget device") if "device" in b else None,
        host_bytes=parse_bytes(b["host"], "--budget host") if "host" in b else None,
        ps_bytes_per_step=parse_bytes(b["ps_bytes_per_step"], "--budget ps_bytes_per_step")
        if "ps_bytes_per_step" in b else None)
    out = Path(args.out)
    window = Window(args.warmup, args.windows, args.window_steps)
    knobs = exact_knobs(cfg) + reordering_knobs(cfg, args.ranks)
    decision = tune(raw, knobs, budgets, out, args.trials, window, args.minutes,
                    seed=args.seed, semantic=None if args.no_semantic else semantic_knobs(cfg),
                    allow_semantic=args.allow == "semantic", auc_gate=args.auc_gate)
    paths = write_outputs(load(out / "journal.log"), decision, out)
    print(json.dumps({"decision": decision, **{k: str(v) for k, v in paths.items()}}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command. A failure ends in one line on stderr and a documented exit code
    (``cosparse.exits``); ``--debug``, anywhere on the line, prints the traceback too."""
    from cosparse.exits import run_reported

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    return run_reported(lambda: int(args.func(args)), debug)


if __name__ == "__main__":
    sys.exit(main())
