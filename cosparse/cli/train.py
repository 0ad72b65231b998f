"""``cosparse train``: one model, several models from one feature extraction, or one rank of
a torchrun world; the final metrics as one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import os

from cosparse.config import ConfigError, load_config


def _train(args: argparse.Namespace) -> int:
    from cosparse.api.factory import add_model_paths, make_trainer
    from cosparse.exits import report_now

    overrides = {}
    if args.steps is not None:
        overrides["train.steps"] = args.steps
    if args.metrics_json:
        overrides["train.metrics_json"] = args.metrics_json
    if args.data:
        overrides["data.path"] = args.data
    if args.no_progress:
        overrides["train.progress"] = False
    add_model_paths(args.model_path)  # (before the config: model.factory's module is there)
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
        trainer = make_trainer(cfg, on_interval=agent)  # (model.factory's model, or built in)
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


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    """The ``train`` command."""
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
    t.add_argument("--model-path", action="append", default=[], metavar="DIR",
                   help="a folder to import model.factory's module from (repeatable; also "
                        "PYTHONPATH); the processes the run starts find it there too")
    t.add_argument("--no-progress", action="store_true", help="plain log lines, no progress bar")
    t.set_defaults(func=_train)
