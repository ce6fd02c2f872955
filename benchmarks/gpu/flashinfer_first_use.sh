#!/usr/bin/env bash
# FlashInfer's first use (issue 28): a cold first engine start (FLASHINFER, default model, bf16, one greedy token)
# with its kernels compiled ahead in the background (attention/backends/flashinfer_jit.py) and with FlashInfer's own
# lazy compile (ATTNSERVE_FLASHINFER_COMPILE_AHEAD=0), each with FLASHINFER_WORKSPACE_BASE (its JIT cache) and
# TRITON_CACHE_DIR in a fresh empty folder. Prints both wall times as one JSON object; the compile-ahead run's
# FlashInfer log lines go to stderr.
# Usage, from the checkout's root: bash benchmarks/gpu/flashinfer_first_use.sh [OUT_DIR]   (~2 x 2 minutes)
set -u
out=${1:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

run() {  # $1: label, $2: ATTNSERVE_FLASHINFER_COMPILE_AHEAD; prints the wall seconds
  local fresh
  fresh=$(mktemp -d "$out/$1.XXXX")
  local t0 t1
  t0=$(date +%s.%N)
  FLASHINFER_WORKSPACE_BASE=$fresh TRITON_CACHE_DIR=$fresh/triton ATTNSERVE_FLASHINFER_COMPILE_AHEAD=$2 \
    python3 -c "
from attnserve import LLM, SamplingParams
llm = LLM(attention_backend='FLASHINFER', dtype='bfloat16')
print(llm.generate(['The capital of France is'], SamplingParams(temperature=0, max_tokens=1))[0].outputs[0].text)
" >"$out/$1.log" 2>&1 || { echo "$1 failed: see $out/$1.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  grep -E "FlashInfer|flashinfer" "$out/$1.log" >&2
  python3 -c "print(round($t1 - $t0, 1))"
}

ahead=$(run ahead 1)
lazy=$(run lazy 0)
python3 -c "import json; print(json.dumps({'model': 'default (SmolLM2-135M-Instruct)', 'backend': 'FLASHINFER', \
'compile_ahead_s': $ahead, 'lazy_compile_s': $lazy, 'logs': '$out'}))"
