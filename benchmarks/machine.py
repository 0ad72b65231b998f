"""The machine a benchmark ran on, as every saved JSON records it (``machine``): the CPU's model
and flags, its instruction sets in a form one can compare (AVX2, FMA, AVX-512 and which of its
subsets, AMX), numba's code-generation target (LLVM's host CPU name and the ISA features it
enables), torch's CPU capability, and, in a peer's venv, FBGEMM's (``peer_isa``).

FBGEMM chooses its kernels at run time from the CPU (AVX-512 when avx512f/bw/dq/vl are all
there, else AVX2); it exposes no Python call that names its choice, so ``peer_isa`` records the
facts it decides from: fbgemm_gpu's version, torch's CPU capability in that venv (ATen's choice
by the same rule) and the ISA summary below.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

AVX512_SUBSETS = ("f", "cd", "bw", "dq", "vl", "ifma", "vbmi", "vbmi2", "vnni", "bitalg",
                  "vpopcntdq", "bf16", "fp16", "vp2intersect")
FBGEMM_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")  # (FBGEMM's AVX-512 test)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "?"


def cpu_model_and_flags() -> tuple[str, str]:
    """The first CPU's ``model name`` and ``flags`` from /proc/cpuinfo ("?" where absent)."""
    cpu, flags = "?", "?"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name") and cpu == "?":
            cpu = line.split(":", 1)[1].strip()
        elif line.startswith("flags") and flags == "?":
            flags = line.split(":", 1)[1].strip()
        if "?" not in (cpu, flags):
            break
    return cpu, flags


def cpu_isa(flags: str) -> dict[str, Any]:
    """The instruction sets in ``flags`` (a cpuinfo flags line): AVX2, FMA, the AVX-512
    subsets, AMX's parts, and a one-line ``summary`` (``AVX-512 (f, bw, ...)`` or ``AVX2``)."""
    have = set(flags.split())
    avx512 = [s for s in AVX512_SUBSETS if f"avx512{s}" in have or f"avx512_{s}" in have]
    amx = sorted(f.removeprefix("amx_") for f in have if f.startswith("amx"))
    if avx512:
        summary = f"AVX-512 ({', '.join(avx512)})"
    elif "avx2" in have:
        summary = "AVX2"
    else:
        summary = "no AVX2"
    if amx:
        summary += f", AMX ({', '.join(amx)})"
    return {"avx2": "avx2" in have, "fma": "fma" in have, "avx512": avx512, "amx": amx,
            "fbgemm_avx512_kernels": all(f in have for f in FBGEMM_AVX512),
            "summary": summary}


def numba_target() -> dict[str, Any]:
    """What numba compiles for: LLVM's host CPU name and the ISA features it enables (the
    vector ones: sse/avx/avx2/avx512*/amx*/fma/f16c), and numba's and llvmlite's versions."""
    try:
        import llvmlite
        import numba
        from llvmlite import binding
    except ImportError:
        return {"numba": None}
    features = binding.get_host_cpu_features()
    vector = sorted(name for name, on in features.items() if on and name.startswith(
        ("sse", "avx", "amx", "fma", "f16c")))
    return {"numba": numba.__version__, "llvmlite": llvmlite.__version__,
            "llvm_cpu": binding.get_host_cpu_name(), "llvm_vector_features": vector}


def torch_isa() -> dict[str, Any]:
    """torch's version and ATen's CPU capability (the vector kernels it dispatches to)."""
    try:
        import torch
    except ImportError:
        return {"torch": None}
    return {"torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def peer_isa() -> dict[str, Any]:
    """In a peer's venv: fbgemm_gpu's version (None when absent), torch's CPU capability there
    and whether the CPU has what FBGEMM's AVX-512 kernels need (see the module's docstring)."""
    try:
        from importlib.metadata import version

        fbgemm = version("fbgemm-gpu-cpu")
    except Exception:  # (not installed under that name, or no metadata)
        fbgemm = None
    return {"fbgemm_gpu": fbgemm, **torch_isa(),
            "fbgemm_avx512_kernels": cpu_isa(cpu_model_and_flags()[1])["fbgemm_avx512_kernels"]}


def machine_info() -> dict[str, Any]:
    """The machine: cores, CPU, its flags and ISA, numba's target, torch's capability, memory,
    load, transparent huge pages, Python and host name."""
    cpu, flags = cpu_model_and_flags()
    meminfo = _read("/proc/meminfo")
    mem = meminfo.splitlines()[0].split()[1] if meminfo != "?" else "0"
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu": cpu,
        "cpu_flags": flags,
        "isa": cpu_isa(flags),
        "numba_target": numba_target(),
        **torch_isa(),
        "mem_gib": round(int(mem) / 2**20, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "python": platform.python_version(),
        "host": platform.node(),
    }
