"""host_batch: the step's flat inputs on the host; capture_sizes: the CUDA-graph batch buckets."""

from __future__ import annotations

import numpy as np

from attnserve.engine.sampling_params import SamplingParams
from attnserve.engine.scheduler import ScheduledRequest, SchedulerOutput
from attnserve.model_executor.cuda_graph import capture_sizes
from attnserve.model_executor.forward_batch import host_batch

P = SamplingParams(temperature=0.0)


def test_mixed_step_positions_slots_and_tables():
    sched = SchedulerOutput(
        [
            ScheduledRequest("d", [7], 17, [3, 9], P, True),  # decode at position 17: block 9, offset 1
            ScheduledRequest("p", [1, 2, 3], 14, [5, 6], P, True),  # chunk at positions 14..16
        ]
    )
    h = host_batch(sched, block_size=16)
    assert h.input_ids.tolist() == [7, 1, 2, 3]
    assert h.positions.tolist() == [17, 14, 15, 16]
    assert h.slot_mapping.tolist() == [9 * 16 + 1, 5 * 16 + 14, 5 * 16 + 15, 6 * 16 + 0]
    assert h.query_start_loc.tolist() == [0, 1, 4]
    assert h.seq_lens.tolist() == [18, 17]
    assert h.block_table.tolist() == [[3, 9] + [0] * 14, [5, 6] + [0] * 14]  # width rounded up to 16
    assert h.logits_indices.tolist() == [0, 3]
    assert (h.num_decodes, h.max_query_len, h.max_seq_len, h.is_pure_decode) == (1, 3, 18, False)
    assert h.query_start_loc.dtype == np.int32 and h.slot_mapping.dtype == np.int64


def test_pure_decode_step_takes_the_one_token_path():
    sched = SchedulerOutput(
        [ScheduledRequest(f"r{i}", [100 + i], 30 + i, [i, 8 + i, 16 + i], P, True) for i in range(3)]
    )
    h = host_batch(sched, block_size=16)
    assert h.is_pure_decode
    assert h.input_ids.tolist() == [100, 101, 102]
    assert h.positions.tolist() == [30, 31, 32]
    assert h.slot_mapping.tolist() == [8 * 16 + 14, 9 * 16 + 15, 18 * 16 + 0]
    assert h.logits_indices.tolist() == [0, 1, 2]


def test_capture_sizes():
    assert capture_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(50) == [1, 2, 4, 8, 16, 32, 48, 50]
    assert capture_sizes(4096)[-1] == 512


def test_cpu_runner_has_no_graphs_and_release_frees_model_and_cache(tiny_model_dir):
    from attnserve import LLM

    llm = LLM(tiny_model_dir("llama"), dtype="float32", device="cpu", kv_cache_memory=1 << 20)
    runner = llm.engine.runner
    assert runner.cuda_graphs is None  # CUDA graphs never apply on CPU, enforce_eager or not
    assert runner.kv_caches and runner.model is not None
    runner.release()
    assert (runner.cuda_graphs, runner.model, runner.kv_caches) == (None, None, [])
