"""``cosparse plan`` end to end: replay the config's data, simulate, print, write JSON and PNG."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosparse.config import Config
from cosparse.data import Reader
from cosparse.strict_json import dumps_metrics
from cosparse.tune.cache_sim import DEFAULT_DECAY
from cosparse.tune.plan import DEFAULT_CAPACITIES, plan_tables, plan_to_json
from cosparse.tune.report import format_plan, plot_plan
from cosparse.tune.trace import build_traces


def run_plan(
    cfg: Config,
    steps: int,
    out_dir: str | Path = "runs/plan",
    capacities: Sequence[float] = DEFAULT_CAPACITIES,
    lookahead: int = 4,
    decay: float = DEFAULT_DECAY,
    progress: bool = True,
    config_path: str | None = None,
    reader: Reader | None = None,
) -> dict[str, Any]:
    """Plan every table of ``cfg`` over ``steps`` batches; prints the tables to stdout and writes
    ``plan.json`` and ``plan.png`` in ``out_dir``. Returns the JSON document."""
    if lookahead < 0:
        raise ValueError("--lookahead: must be >= 0")
    traces = build_traces(cfg, steps, progress, reader)
    plans = plan_tables(traces, capacities, lookahead=lookahead, decay=decay, progress=progress)
    meta = {"config": config_path, "data": cfg.data.path, "reader": cfg.data.reader,
            "batch_size": cfg.data.batch_size, "steps": steps,
            "batches": traces[0].num_batches if traces else 0, "lookahead": lookahead,
            "decay": decay, "warmup_batches": (traces[0].num_batches // 10) if traces else 0}
    doc = plan_to_json(plans, meta)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(dumps_metrics(doc, indent=1, sort_keys=False))
    png = plot_plan(plans, out / "plan.png")
    print(format_plan(plans))
    print(f"\nwrote {out / 'plan.json'} and {png}", file=sys.stdout)
    return doc
