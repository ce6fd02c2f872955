#!/usr/bin/env bash
# TPOT of a batch of 64 with presence, frequency and repetition penalties on every request vs the same batch
# without (issue 27's budget: at most 5% more), Qwen3-0.6B and Llama-3.1-8B shapes, bf16, dummy weights, 1k context.
# Each pair runs twice: default flags, and TRITON_ATTN + --use-skinny-gemm (where a greedy batch without penalties
# takes the fused greedy LM head, which a batch with penalties cannot).
# Usage, from the checkout's root: bash benchmarks/gpu/penalties_tpot.sh OUT_DIR [MODELS] [VARIANTS]
#   e.g. bash benchmarks/gpu/penalties_tpot.sh /tmp/pen qwen3-0.6b skinny
set -u
out=${1:-/tmp}
models=${2:-"qwen3-0.6b llama-3.1-8b"}
variants=${3:-"default skinny"}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
LAT="--load-format dummy --dtype bfloat16 --no-progress --batch-size 64 --input-len 1024 --output-len 128 \
     --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536"
PEN="--presence-penalty 0.5 --frequency-penalty 0.5 --repetition-penalty 1.1"
bench() { python3 -m attnserve bench latency $LAT "$@" 2>&1 | grep -v -E "^(INFO|WARNING):|Writing|it/s"; }
tpot() { python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print(r['tpot_s']['p50'])" "$1"; }
for m in $models; do
  for variant in $variants; do
    extra=""
    [ "$variant" = skinny ] && extra="--attention-backend TRITON_ATTN --use-skinny-gemm"
    echo "== $m, $variant flags: without penalties"
    bench --model "benchmarks/shapes/$m" $extra --output-json "$out/pen-$m-$variant-off.json"
    echo "== $m, $variant flags: penalties on every request ($PEN)"
    bench --model "benchmarks/shapes/$m" $extra $PEN --output-json "$out/pen-$m-$variant-on.json"
    off=$(tpot "$out/pen-$m-$variant-off.json"); on=$(tpot "$out/pen-$m-$variant-on.json")
    python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'$m $variant: TPOT p50 {a*1e3:.3f} ms -> {b*1e3:.3f} ms with penalties ({(b/a-1)*100:+.1f}%)')" "$off" "$on"
  done
done
