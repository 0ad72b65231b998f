"""What every benchmark's JSON says of its machine (issue 35, item 1): the CPU's instruction
sets from its flags (AVX2, FMA, the AVX-512 subsets, AMX), numba's target (LLVM's host CPU and
its vector features), torch's CPU capability, and in a peer's venv FBGEMM's version."""

from __future__ import annotations

from benchmarks.machine import cpu_isa, machine_info, peer_isa

EPYC_GENOA = ("fpu sse2 avx avx2 fma avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl "
              "avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq")


def test_the_isa_is_read_from_the_flags():
    genoa = cpu_isa(EPYC_GENOA)
    assert genoa["avx2"] and genoa["fma"] and genoa["fbgemm_avx512_kernels"]
    assert genoa["avx512"] == ["f", "cd", "bw", "dq", "vl", "ifma", "vbmi", "vbmi2", "vnni",
                               "bitalg", "vpopcntdq", "bf16"]
    assert genoa["summary"].startswith("AVX-512 (f, cd, bw") and not genoa["amx"]
    sapphire = cpu_isa(EPYC_GENOA + " amx_bf16 amx_tile amx_int8 avx512_fp16")
    assert sapphire["amx"] == ["bf16", "int8", "tile"] and "fp16" in sapphire["avx512"]
    assert sapphire["summary"].endswith("AMX (bf16, int8, tile)")
    zen3 = cpu_isa("fpu sse2 avx avx2 fma")
    assert zen3 == {"avx2": True, "fma": True, "avx512": [], "amx": [],
                    "fbgemm_avx512_kernels": False, "summary": "AVX2"}
    # FBGEMM's AVX-512 kernels need all four of f, bw, dq and vl
    assert not cpu_isa("avx2 avx512f avx512bw avx512dq")["fbgemm_avx512_kernels"]


def test_machine_info_records_this_machines_targets():
    m = machine_info()
    assert m["isa"] == cpu_isa(m["cpu_flags"])
    target = m["numba_target"]
    assert target["numba"] and target["llvm_cpu"] and "sse2" in target["llvm_vector_features"]
    if m["isa"]["avx2"]:  # what the CPU has, LLVM targets (unless a VM hides it from both)
        assert "avx2" in target["llvm_vector_features"]
    assert m["torch"] and m["cpu_capability"] in ("DEFAULT", "AVX2", "AVX512", "ZVECTOR",
                                                  "NO AVX", "SVE256", "SVE")
    peer = peer_isa()  # (this venv has no fbgemm_gpu)
    assert peer["fbgemm_gpu"] is None and peer["cpu_capability"] == m["cpu_capability"]
