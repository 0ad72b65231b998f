"""``cosparse compare`` (A against B on the same data), ``cosparse report`` (its HTML again)
and ``cosparse explain`` (a run's slow steps, attributed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cosparse.cli.arguments import step_range


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


def add_report_parsers(sub: argparse._SubParsersAction) -> None:
    """The ``compare``, ``report`` and ``explain`` commands."""
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
    ex.add_argument("--steps", type=step_range, default=None,
                    help="explain these steps, FROM-TO, slow or not")
    ex.add_argument("--top", type=int, default=20, help="at most this many steps, the slowest")
    ex.add_argument("--json", default=None, help="also write the attribution as JSON here")
    ex.set_defaults(func=_explain)
