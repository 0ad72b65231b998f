"""The benchmarks, a package so that they import ``benchmarks.common`` without touching sys.path.

Run one from the repository root as a module, e.g. ``.venv/bin/python -m benchmarks.bench_inmemory
--quick``. Nothing is imported here: ``peer_torchrec`` runs in .venv-peers, which has no cosparse.
"""
