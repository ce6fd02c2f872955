#!/usr/bin/env bash
# On the H200 machine, after the vLLM kit (../shared/gpu/vllm-kit, calls 1-2) and the fa3 part of .stage are
# installed into /tmp/site: attnserve with its default flags beside vLLM 0.26.0 in one process tree
# (`--baseline vllm`: vLLM runs in a subprocess after attnserve's engine has exited). Results under $OUT.
# Stage `fia xg` (stage.sh) after the kit: the kit's xgrammar 0.2.3 brings apache-tvm-ffi 0.1.10, which leaves a
# mixed tvm_ffi in /tmp/site that vLLM's import of xgrammar fails on (undefined symbol).
# Usage: bash benchmarks/gpu/vs_vllm.sh tp|lat-qwen|lat-llama|shared...
#   BASELINE= (empty): attnserve alone (vLLM then from the kit's run_vllm_bench.sh in a call of its own);
#   TOK=DIR: the tokenizer (default: the kit's SmolLM2 one; `stage.sh tok` puts the same at /tmp/tok);
#   ARGS="...": more attnserve flags (e.g. "--attention-backend FLASH_ATTN"); TAG: a suffix for the JSON names.
# shared: the prefix-caching workload (2,048 shared + 128 own tokens, 128 out, 256 requests), no baseline.
set -e
export PYTHONPATH=$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1 VLLM_CACHE_ROOT=/tmp/vllm_cache
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOK=${TOK:-/tmp/vllm_models/tokenizer-smollm2}   # the default model's tokenizer, converted by the kit
BASELINE=${BASELINE-vllm}
read -r -a extra <<< "${ARGS:-}"
common=(--load-format dummy --dtype bfloat16 --tokenizer "$TOK" --seed 0 --no-progress "${extra[@]}")
bl=(); [ -n "$BASELINE" ] && bl=(--baseline "$BASELINE")
for job in "$@"; do
  case "$job" in
    tp) python3 -m attnserve bench throughput --model benchmarks/shapes/qwen3-0.6b "${common[@]}" "${bl[@]}" --max-model-len \
          2304 --max-num-seqs 256 --num-prompts 256 --input-len 562 --output-len 562 --range-ratio 0.822 \
          --output-json "$OUT/vs_vllm_tp_qwen${TAG:-}.json" ;;
    lat-qwen|lat-llama)
        shape=qwen3-0.6b; [ "$job" = lat-llama ] && shape=llama-3.1-8b
        python3 -m attnserve bench latency --model benchmarks/shapes/$shape "${common[@]}" "${bl[@]}" --max-model-len 2304 \
          --max-num-seqs 256 --batch-size 1 64 --input-len 1024 --output-len 128 --num-iters 5 --num-iters-warmup 2 \
          --output-json "$OUT/vs_vllm_$job${TAG:-}.json" ;;
    shared) python3 -m attnserve bench throughput --model benchmarks/shapes/qwen3-0.6b "${common[@]}" \
          --num-prompts 256 --prefix-len 2048 --input-len 128 --output-len 128 --max-model-len 4096 \
          --output-json "$OUT/shared${TAG:-}.json" ;;
    *) echo "usage: $0 tp|lat-qwen|lat-llama|shared..." >&2; exit 2 ;;
  esac
done
