"""Cached numba builds of one Python function with different compile flags (serial, parallel).

numba's on-disk cache names a build by the function's code object (name and first line) and its
signature, not by flags such as ``parallel``. Two cached builds of one function therefore load
each other's machine code: a serial kernel ran the parallel build (a parallel region per call,
on numba's thread pool), or a parallel kernel ran serially. ``variant`` compiles a copy of the
function whose code object carries a name of its own, so each build has its own cache entry.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numba


def variant(fn: Callable[..., Any], name: str, **flags: Any) -> Any:
    """``numba.njit(cache=True, **flags)`` of a copy of ``fn`` named ``name`` (a dispatcher)."""
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    copy = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = name
    return numba.njit(cache=True, **flags)(copy)
