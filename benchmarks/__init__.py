"""Benchmarks: runnable as ``python -m benchmarks.<name>``; each prints its figures next to a baseline
measured in the same run. Speed is measured here, not in timed tests."""
