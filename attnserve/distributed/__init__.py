"""Tensor parallelism's shared pieces: the process group record layers call, and how dimensions split."""
