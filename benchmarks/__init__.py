"""Benchmark and run scripts kept beside the package (not installed): ``python -m benchmarks.gpu.X`` from the
checkout's root."""
