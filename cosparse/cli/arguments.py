"""Argument types shared by the commands: comma-separated capacities, budgets, step ranges.
"""

from __future__ import annotations

import argparse


def capacities(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as comma-separated numbers") from e
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("capacities must be positive numbers")
    return values


def budgets(text: str) -> dict[str, str]:
    """``device=2GiB,host=16GiB,ps_bytes_per_step=50MB`` as a mapping."""
    out = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key not in ("device", "host", "ps_bytes_per_step"):
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected device=SIZE, host=SIZE or ps_bytes_per_step=SIZE")
        out[key] = value
    return out


def step_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected FROM-TO, e.g. 100-120") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 <= FROM <= TO")
    return a, b
