"""The memory roofline of a decode step: how fast could it be if it only had to read its bytes once?

A decode step reads every weight once (the input embedding only for its B rows, unless it is tied to
the LM head) and the K/V of every cached token of every running request, in every layer:

    step_bytes(context_lens) = weight_bytes + sum(context_lens) * kv_bytes_per_token

A mixture-of-experts model's step reads only the experts its B tokens chose: of ``expert_bytes`` (every
expert of every MoE layer, part of ``weight_bytes``) the expected share ``1 - (1 - k/E)^B`` for routing
that is uniform and independent over tokens (exactly ``k/E`` at B = 1; a skewed routing reads fewer).
A whole run (``run_limit_s``) counts every expert in every step: its limit is an upper bound.
    kv_bytes_per_token       = 2 (K and V) * num_layers * num_kv_heads * head_size * kv element size
    limit_s                  = step_bytes / copy_bandwidth
    % of limit               = 100 * limit_s / measured step time (TPOT for latency rows)

``copy_bandwidth`` is measured in the same run: a large device-to-device ``copy_`` on GPU, a 256 MB
memcpy on CPU, counted as bytes read + bytes written per second (the convention of ``nvbandwidth`` and
of the ~4.3 TB/s figure in shared/gpu/README.md). A whole run (``bench throughput``) sums step_bytes over
its steps and compares with its elapsed time. Prefill steps are counted with the same formula: they are
compute-bound, so the roofline is a lower bound there and the percentage an upper bound.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Iterable

import torch

CPU_COPY_BYTES = 256 << 20  # 256 MB: well past the last-level cache
GPU_COPY_BYTES = 1 << 30  # 1 GiB


def measure_copy_bandwidth(device: torch.device | str, nbytes: int | None = None, repeats: int = 20) -> float:
    """Bytes per second of a large ``dst.copy_(src)`` on ``device`` (read + write counted): the fastest of
    ``repeats`` copies after one warm-up copy. CUDA events on GPU, perf_counter on CPU.

    The fastest, not the median: the roofline is a ceiling, and a slow copy (clocks ramping after a model
    load, another process) would lower it and flatter every "% of limit" (docs/benchmarks.md, Roofline).
    """
    device = torch.device(device)
    if nbytes is None:
        nbytes = GPU_COPY_BYTES if device.type == "cuda" else CPU_COPY_BYTES
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)  # not all zeros: no zero-page tricks
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page faults, allocator
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / min(times)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_size: int, dtype: torch.dtype) -> int:
    """K and V of one token in every layer, in bytes."""
    return 2 * num_layers * num_kv_heads * head_size * torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Roofline:
    """The bytes of a decode step over the measured copy bandwidth (see the module docstring)."""

    copy_bandwidth: float  # bytes/s, read + write counted
    weight_bytes: int  # weights read once per step
    kv_bytes_per_token: int  # K+V of one cached token, all layers
    expert_bytes: int = 0  # of weight_bytes: the routed experts' (MoE models; see the module docstring)
    num_experts: int = 0  # E
    experts_per_token: int = 0  # k

    def step_bytes(self, context_lens: Iterable[int]) -> int:
        """Bytes one step must read for running requests of these context lengths."""
        lens = list(context_lens)
        weights = self.weight_bytes
        if self.expert_bytes and lens:
            share = 1.0 - (1.0 - self.experts_per_token / self.num_experts) ** len(lens)
            weights = self.weight_bytes - self.expert_bytes + round(self.expert_bytes * share)
        return weights + sum(lens) * self.kv_bytes_per_token

    def step_limit_s(self, context_lens: Iterable[int]) -> float:
        """The fastest one step can be: its bytes at copy bandwidth."""
        return self.step_bytes(context_lens) / self.copy_bandwidth

    def run_limit_s(self, num_steps: int, kv_tokens_read: int) -> float:
        """The fastest a run of ``num_steps`` steps reading ``kv_tokens_read`` cached tokens in total can be."""
        return (num_steps * self.weight_bytes + kv_tokens_read * self.kv_bytes_per_token) / self.copy_bandwidth

    def row(self, limit_s: float, measured_s: float | None, step_bytes: float | None = None) -> "RooflineRow":
        """The roofline fields of one result row: limit, measured, % of limit."""
        pct = None if not measured_s else 100.0 * limit_s / measured_s
        return RooflineRow(
            step_bytes=step_bytes,
            limit_s=limit_s,
            measured_s=measured_s,
            pct_of_limit=pct,
            copy_bandwidth_GBps=self.copy_bandwidth / 1e9,
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "copy_bandwidth_GBps": self.copy_bandwidth / 1e9}


@dataclass(frozen=True)
class RooflineRow:
    """What every result row carries: the limit, what was measured, and limit / measured in percent."""

    step_bytes: float | None  # bytes of one (mean) decode step; None for a whole-run row
    limit_s: float  # bytes / copy bandwidth (per step for latency rows, per run for throughput rows)
    measured_s: float | None  # the measured TPOT (latency) or elapsed time (throughput)
    pct_of_limit: float | None  # 100 * limit_s / measured_s
    copy_bandwidth_GBps: float


def mean_decode_context(input_len: int, output_len: int) -> float:
    """Mean context length over the decode steps of one request: the step producing token j (j = 2..out)
    reads input_len + j - 1 cached tokens."""
    if output_len <= 1:
        return float(input_len)
    return input_len + output_len / 2
