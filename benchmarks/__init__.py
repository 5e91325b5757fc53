"""Serving benchmark (python -m benchmarks) and engine micro-benchmarks (python -m benchmarks.engine_bench)."""
