"""Command line: ``cosparse train``, ``cosparse compare``, ``cosparse report``, ``cosparse explain``,
``cosparse plan``, ``cosparse check``, ``cosparse tune``, ``cosparse ps serve|keygen``, ``cosparse features
lineage|diff|fit|materialize``, ``cosparse data describe|baseline`` and ``cosparse export``.

Each command lives in a module of its own in this package; this one composes their parsers and
runs one command under the documented exit codes (``python -m cosparse.cli``: ``__main__``)."""

from __future__ import annotations

import argparse
import sys

from cosparse.cli.check import add_check_parser
from cosparse.cli.data import add_data_parser
from cosparse.cli.export import add_export_parser
from cosparse.cli.features import add_features_parser
from cosparse.cli.plan import add_plan_parser
from cosparse.cli.ps import add_ps_parser
from cosparse.cli.reports import add_report_parsers
from cosparse.cli.train import add_train_parser
from cosparse.cli.tune import add_tune_parser


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, under ``cosparse``."""
    p = argparse.ArgumentParser(prog="cosparse", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_plan_parser(sub)
    add_report_parsers(sub)
    add_check_parser(sub)
    add_tune_parser(sub)
    add_ps_parser(sub)
    add_features_parser(sub)
    add_data_parser(sub)
    add_export_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. A failure ends in one line on stderr and a documented exit code
    (``cosparse.exits``); ``--debug``, anywhere on the line, prints the traceback too."""
    from cosparse.exits import run_reported

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    return run_reported(lambda: int(args.func(args)), debug)
