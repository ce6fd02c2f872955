#!/usr/bin/env bash
# Decode latency of the mixture-of-experts shapes on one GPU: TPOT at batch 1 and 64 (1,024 input tokens, 128
# output) with the roofline's % of limit (a MoE step reads the experts its tokens chose: docs/benchmarks.md),
# bf16, dummy weights, TRITON_ATTN and FLASH_ATTN. Shapes: Qwen3-30B-A3B, Mixtral-style and gpt-oss-20b where
# its model class is registered (benchmarks/shapes/). Usage, from the checkout's root:
#   bash benchmarks/gpu/moe_latency.sh OUT_DIR [SHAPE...]
set -u
out=${1:-/tmp}; shift || true
shapes=${*:-qwen3-30b-a3b gpt-oss-20b}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for m in $shapes; do
  for backend in TRITON_ATTN FLASH_ATTN; do
    echo "== $m, $backend"
    python3 -m attnserve bench latency --model "benchmarks/shapes/$m" --load-format dummy --dtype bfloat16 --no-progress \
      --attention-backend "$backend" --batch-size 1 64 --input-len 1024 --output-len 128 --num-iters 3 \
      --max-model-len 4096 --max-num-batched-tokens 65536 --output-json "$out/moe-$m-$backend.json" 2>&1 \
      | grep -v -E "^(INFO|WARNING):|Writing|it/s" || echo "!! $m $backend failed"
  done
done
