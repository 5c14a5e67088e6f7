"""bench/: benchmarks of dmq's layers, runnable alone (`python -m bench.log_bench`).

Each benchmark exposes `run(args) -> dict` so that `dmq bench ...` can call it, prints its
setup before its figures, and measures a baseline in the same run so that its figures can be
read as a fraction of what the machine does without dmq. See bench/README.md.
"""
