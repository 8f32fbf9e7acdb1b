"""Benchmarks that prove "compile once, then only compute": run ``python -m benchmarks.run``."""
