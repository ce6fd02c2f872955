#!/usr/bin/env bash
# Prefix caching on one GPU: the shared-prefix, nano-vllm and multi-turn workloads of docs/benchmarks.md, each
# run with caching on and then off on one engine (--compare-prefix-caching). bf16, dummy weights, default flags.
# Usage, from the checkout's root: bash benchmarks/gpu/prefix_caching.sh OUT_DIR
set -u
out=${1:-/tmp}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
bench() { python3 -m attnserve bench throughput --load-format dummy --dtype bfloat16 --no-progress \
            --compare-prefix-caching "$@" 2>&1 | grep -v -E "^(INFO|WARNING):|Writing|it/s"; }
for m in qwen3-0.6b llama-3.1-8b; do
  echo "== shared prefix 2048 + 128, 128 out, 256 requests: $m"
  bench --model "benchmarks/shapes/$m" --num-prompts 256 --prefix-len 2048 --input-len 128 --output-len 128 \
        --max-model-len 4096 --output-json "$out/shared-$m.json"
done
echo "== nano-vllm workload (no shared prefix): qwen3-0.6b"
bench --model benchmarks/shapes/qwen3-0.6b --num-prompts 256 --input-len 562 --output-len 562 --range-ratio 0.822 \
      --max-num-seqs 256 --max-num-batched-tokens 16384 --max-model-len 2304 --output-json "$out/nano-qwen3.json"
echo "== multi-turn chat, 64 conversations x 4 turns (512-token system prompt, 128-token messages and answers)"
bench --model benchmarks/shapes/qwen3-0.6b --num-prompts 64 --num-turns 4 --prefix-len 512 --input-len 128 \
      --output-len 128 --max-model-len 4096 --output-json "$out/multiturn-qwen3.json"
