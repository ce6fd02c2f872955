"""CudaGraphRunner's input copies on their side stream (``input_stream``) never overwrite the static inputs while
an earlier replay still reads them, and each replay reads its own step's inputs.

Each captured step first spins ~1 ms on the GPU, then reads every static input (token ids, positions, slot
mapping, context lengths, block table) into its output. Six steps are queued back to back without waiting
(as async scheduling queues them): were a step's copies not to wait for the previous replay, they would land
during that replay's spin and the replay would return the next step's values. Run with the side stream and
in line (``input_stream = None``); both must give every step exactly its own inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 2_000_000  # torch.cuda._sleep: ~1 ms at the H200's ~2 GHz


@pytest.mark.parametrize("side_stream", [True, False], ids=["input_stream", "in_line"])
@torch.inference_mode()
def test_queued_replays_read_their_own_inputs(side_stream):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from attnserve.attention.backend import AttentionLayerSpec
    from attnserve.attention.backends.triton_attn import TritonAttentionBackend
    from attnserve.model_executor.cuda_graph import CudaGraphRunner
    from attnserve.model_executor.forward_batch import HostBatch, PinnedStaging

    dev, page, max_blocks, num_blocks = torch.device("cuda"), 16, 8, 64
    spec = AttentionLayerSpec(num_heads=4, head_size=64, scale=0.125, num_kv_heads=2)
    builder = TritonAttentionBackend.get_builder_cls()(spec, dev, torch.float32)
    cache = torch.zeros(TritonAttentionBackend.get_kv_cache_shape(num_blocks + 1, page, 2, 64), device=dev)
    runner: CudaGraphRunner

    def forward(input_ids, positions, batch):  # (n, 5 + max_blocks) float64: every input, after a spin
        n = input_ids.shape[0]
        torch.cuda._sleep(SPIN_CYCLES)
        cols = [input_ids, positions, runner.slot_mapping[:n], runner.seq_lens[:n]]
        return torch.cat([torch.stack(cols, 1).double(), runner.block_table[:n].double()], 1)

    runner = CudaGraphRunner(
        forward,
        builder,
        [cache],
        sizes=[1, 2, 4],
        device=dev,
        block_size=page,
        max_blocks=max_blocks,
        null_block=num_blocks,
        max_model_len=max_blocks * page,
    )
    if not side_stream:
        runner.input_stream = None
    runner.capture()
    staging, rng = PinnedStaging(dev), np.random.default_rng(0)
    steps, outs = [], []
    for step in range(6):
        n = 3
        ctx = rng.integers(1, max_blocks * page - 1, n)
        table = rng.integers(0, num_blocks, (n, max_blocks)).astype(np.int32)
        host = HostBatch(
            rng.integers(0, 1000, n),
            ctx.astype(np.int64),
            rng.integers(0, 1000, n),
            np.arange(n + 1, dtype=np.int32),
            (ctx + 1).astype(np.int32),
            table,
            n,
            1,
            int(ctx.max()) + 1,
        )
        steps.append(host)
        outs.append(runner.run(host, staging).clone())  # queued; the next step's copies follow at once
    torch.cuda.synchronize()
    for step, (host, out) in enumerate(zip(steps, outs)):
        want = np.concatenate(
            [np.stack([host.input_ids, host.positions, host.slot_mapping, host.seq_lens], 1), host.block_table], 1
        ).astype(np.float64)
        np.testing.assert_array_equal(out.cpu().numpy(), want, err_msg=f"step {step}")
