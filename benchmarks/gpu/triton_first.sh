#!/usr/bin/env bash
# Whether TRITON_ATTN should lead compute capability 9.x's priority list (docs/benchmarks.md, "Beside vLLM 0.26.0",
# session 27: faster than FA3 on decode-bound runs; FA3 kept first for cascade attention, which TRITON_ATTN now has
# but has not run on a GPU). On the H200 machine after `bash benchmarks/gpu/stage.sh fa3 tok`, one device call:
#   1. tests/gpu/test_cascade_gpu.py on both backends (the cascade against the oracle; cascade graphs' greedy tokens)
#   2. the shared-prefix workload (2048 shared + 128 own, 128 out, 256 requests, Qwen3-0.6B), caching on, both backends
#   3. the nano-vllm workload, both backends, TRITON_ATTN under benchmarks/gpu/triton_compiles.py (compiles in the run)
#   4. where TRITON_ATTN's nano-vllm time goes (profile_throughput.py), and FA3's fp8 path against the oracle
# It decided the selector's order: TRITON_ATTN leads 9.x's list since session 32 (its cascade's split counts
# made the shared-prefix workload faster than FA3's); the `ab` part checks the default flags against FLASH_ATTN.
# Usage, from the checkout's root: bash benchmarks/gpu/triton_first.sh OUT_DIR [PART...]
# PARTs (default: all but ab, in this order): cascade shared nano profile prefixprof fp8 (ab: below); calls of ~300 s each fit the 600-s
# limit where one of all may not. prefixprof: where the shared-prefix workload's steps go on both backends.
set -u
out=${1:-/tmp}
shift || true
parts=" ${*:-cascade shared nano profile prefixprof fp8} "
want() { [[ $parts == *" $1 "* ]]; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 ATTNSERVE_TEST_TOKENIZER=${ATTNSERVE_TEST_TOKENIZER:-/tmp/tok}
tok=(--tokenizer "$ATTNSERVE_TEST_TOKENIZER")
want cascade && echo "== cascade tests" && timeout 200 python3 -m pytest tests/gpu/test_cascade_gpu.py -m gpu -q -p no:cacheprovider 2>&1 | tail -4
shared=(--model benchmarks/shapes/qwen3-0.6b --load-format dummy --dtype bfloat16 --no-progress "${tok[@]}"
        --num-prompts 256 --prefix-len 2048 --input-len 128 --output-len 128 --max-model-len 4096)
want shared && echo "== shared prefix, TRITON_ATTN (Triton compiles listed)" && timeout 150 python3 -m \
  benchmarks.gpu.triton_compiles --json "$out/compiles-shared.json" -- attnserve bench throughput "${shared[@]}" \
  --attention-backend TRITON_ATTN --output-json "$out/shared-TRITON_ATTN.json" 2>&1 | tail -25
want shared && echo "== shared prefix, FLASH_ATTN" && timeout 150 python3 -m attnserve bench throughput \
  "${shared[@]}" --attention-backend FLASH_ATTN --output-json "$out/shared-FLASH_ATTN.json" 2>&1 | tail -2
nano=(--model benchmarks/shapes/qwen3-0.6b --load-format dummy --dtype bfloat16 --no-progress "${tok[@]}" --seed 0
      --num-prompts 256 --input-len 562 --output-len 562 --range-ratio 0.822 --max-num-seqs 256 --max-model-len 2304)
want nano && echo "== nano-vllm, TRITON_ATTN (Triton compiles listed)" && timeout 150 python3 -m benchmarks.gpu.triton_compiles --json "$out/compiles.json" -- attnserve bench throughput \
  "${nano[@]}" --attention-backend TRITON_ATTN --output-json "$out/nano-TRITON_ATTN.json" 2>&1 | tail -25
want nano && echo "== nano-vllm, FLASH_ATTN" && timeout 120 python3 -m attnserve bench throughput "${nano[@]}" --attention-backend FLASH_ATTN \
  --output-json "$out/nano-FLASH_ATTN.json" 2>&1 | tail -2
want profile && echo "== nano-vllm step profile, TRITON_ATTN" && timeout 150 python3 -m benchmarks.gpu.profile_throughput "${tok[@]}" --attention-backend TRITON_ATTN \
  --json "$out/profile-TRITON_ATTN.json" 2>&1 | tail -30
# ab: the default flags (no --attention-backend: TRITON_ATTN first on 9.x) against FLASH_ATTN, alternated, $ROUNDS
# rounds of the shared-prefix workload and one of nano-vllm's; one JSON per run, the selector's line printed
if want ab; then
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for be in default FLASH_ATTN; do
      flag=(); [ "$be" = default ] || flag=(--attention-backend "$be")
      echo "== shared prefix, $be, round $r" && timeout 150 python3 -m attnserve bench throughput "${shared[@]}" \
        "${flag[@]}" --output-json "$out/ab-shared-$be-$r.json" 2>&1 | grep -E "attention backend|^attnserve " | tail -2
    done
  done
  for be in default FLASH_ATTN; do
    flag=(); [ "$be" = default ] || flag=(--attention-backend "$be")
    echo "== nano-vllm, $be" && timeout 150 python3 -m attnserve bench throughput "${nano[@]}" "${flag[@]}" \
      --output-json "$out/ab-nano-$be.json" 2>&1 | grep -E "attention backend|^attnserve " | tail -2
  done
fi
want prefixprof && for be in TRITON_ATTN FLASH_ATTN; do
  echo "== shared-prefix steps and kernels, $be" && timeout 150 python3 -m benchmarks.gpu.profile_prefix "${tok[@]}" \
    --json "$out/prefixprof-$be.json" attention_backend=$be 2>&1 | tail -30
done
want fp8 && echo "== FA3 fp8 KV against the oracle" && ATTNSERVE_GPU_BACKENDS=FLASH_ATTN/3 timeout 120 python3 -m pytest tests/gpu/test_fp8_kv_vs_reference.py -m gpu -q \
  -p no:cacheprovider 2>&1 | tail -4
