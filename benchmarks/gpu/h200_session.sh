#!/usr/bin/env bash
# One device call on the H200 machine (2-GPU kind): after benchmarks/gpu/stage.sh has installed the parts,
# run the named jobs, results under $OUT (at most 8 files come back: logs + one results tarball).
#
#   bash benchmarks/gpu/h200_session.sh JOB...
#
# Jobs: tests   GPU correctness on GPU 1 (async scheduling, CUDA graphs, sampler, GEMV, models x FlashInfer)
#       bench   speed on GPU 0 (GEMV sweep; latency of the Qwen3-0.6B and Llama-3.1-8B shapes)
#       models  every architecture on FLASHINFER (GPU 1)     fiwarm  compile FlashInfer's Qwen3/Llama kernels (GPU 0)
#       next    what session 4 left unrun (FlashInfer graph tests after the file split, decode-step profiles,
#               TP=2 TTFT synchronous): run it first next time
#       bench2  throughput of the Qwen3-0.6B shape, FlashInfer latency of the Llama-3.1-8B shape (GPU 0)
#       attn    `bench attention` on GPU 0
#       tp      tensor parallelism on both GPUs (TP=2 vs TP=1 tests, Llama-3.1-8B TP latency)
#       check   session 4, first call: every architecture x backend (OPT post-LN's graph fix), FlashInfer's graph
#               path (GPU 1) beside decode-step kernel profiles and `bench attention` block sizes (GPU 0)
#       tpfast  session 4, second call: the symmetric-memory all-reduce (bench, test), TP tests, TP latency
# `tests` and `bench` run side by side (one GPU each); `tp` runs after them. On 2026-11-29 `tests bench`
# together overran one 600 s call (FlashInfer's JIT compiles): give each its own call, or narrow them.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0 MAX_JOBS=12
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; RES=/tmp/res; mkdir -p "$OUT" "$RES"
LIMIT=${LIMIT:-560}
START=$(date +%s)
left() { local l=$(( LIMIT - ($(date +%s) - START) )); echo $(( l > 1 ? l : 1 )); }  # never <= 0 (timeout reads "-5" as an option)
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader

QWEN=benchmarks/shapes/qwen3-0.6b
LLAMA=benchmarks/shapes/llama-3.1-8b
DUMMY="--load-format dummy --dtype bfloat16 --no-progress"

job_tests() {  # GPU 1: correctness (async scheduling per backend, FlashInfer's graph path)
  export CUDA_VISIBLE_DEVICES=1
  t() { timeout "$(left)" python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short "$@"; }
  t tests/gpu/test_async_scheduling_gpu.py tests/model_executor/test_sampler.py
}

job_models() {  # GPU 1: every architecture on FlashInfer (issue 5), FlashInfer graph replays
  export CUDA_VISIBLE_DEVICES=1
  timeout "$(left)" python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_models_gpu.py \
    tests/gpu/test_cuda_graphs.py -k "FLASHINFER and not decode_graph_matches_eager"
}

bench() {  # NAME ARGS...: one bench command, its JSON in $RES/NAME.json
  local name=$1; shift
  echo "== $name: attnserve bench $*"
  timeout "$(left)" python3 -m attnserve.entrypoints.cli.main bench "$@" --output-json "$RES/$name.json" \
    || echo "!! $name failed (rc $?)"
}

LAT="--batch-size 1 64 --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536"
QWEN_LAT="latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm"
LLAMA_LAT="latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm"

job_bench() {  # GPU 0: speed (issue 8)
  export CUDA_VISIBLE_DEVICES=0
  bench lat_qwen_fa3 latency --model $QWEN $DUMMY --attention-backend FLASH_ATTN $LAT
  bench lat_qwen_fa3_sync latency --model $QWEN $DUMMY --attention-backend FLASH_ATTN $LAT --no-async-scheduling
  bench lat_qwen_fa3_skinny latency --model $QWEN $DUMMY --attention-backend FLASH_ATTN $LAT --use-skinny-gemm
  bench lat_llama_fa3_skinny latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN $LAT --use-skinny-gemm
}

job_bench2() {  # GPU 0: throughput, FlashInfer on Llama
  export CUDA_VISIBLE_DEVICES=0
  bench thr_qwen_fa3 throughput --model $QWEN $DUMMY --attention-backend FLASH_ATTN --num-prompts 256 \
    --input-len 562 --output-len 562 --range-ratio 0.822 --max-num-seqs 256 --max-num-batched-tokens 16384 \
    --max-model-len 2304
  bench lat_llama_fi latency --model $LLAMA $DUMMY --attention-backend FLASHINFER $LAT
}

job_next() {  # what session 4 left unrun (~400 s with g1 g2 fa3 fi staged): run it first next time
  (export CUDA_VISIBLE_DEVICES=1  # FlashInfer's graph path after its move to flashinfer_graphs.py
   timeout "$(left)" python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_cuda_graphs.py \
     tests/gpu/test_async_scheduling_gpu.py -k FLASHINFER) > "$OUT/next_fi.log" 2>&1 &
  export CUDA_VISIBLE_DEVICES=0  # where a decode step's time goes (issue 8's two misses)
  prof qwen_fa3_b1 --model $QWEN --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof qwen_fa3_b64 --model $QWEN --backend FLASH_ATTN --batch-size 64
  prof llama_fa3_b1 --model $LLAMA --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  wait
  unset CUDA_VISIBLE_DEVICES  # TTFT at TP=2 (1.6-2.4x TP=1's in session 4): synchronous, for comparison
  bench lat_llama_tp2_sync latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 \
    --input-len 1024 --output-len 64 --num-iters 2 --max-model-len 4096 --use-skinny-gemm --tensor-parallel-size 2 \
    --no-async-scheduling
}

prof() {  # NAME ARGS...: benchmarks.gpu.profile_decode, its JSON in $RES/prof_NAME.json
  echo "== profile $1: ${*:2}"
  timeout "$(left)" python3 -m benchmarks.gpu.profile_decode "${@:2}" --json "$RES/prof_$1.json" || echo "!! $1 failed"
}

job_check() {  # ~300 s with g1 g2 fa3 fi staged
  (export CUDA_VISIBLE_DEVICES=1
   t() { timeout "$(left)" python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf "$@"; }
   t tests/gpu/test_models_gpu.py -k "not FLASHINFER or opt_post_ln"
   t tests/gpu/test_cuda_graphs.py tests/gpu/test_async_scheduling_gpu.py -k FLASHINFER) > "$OUT/check_tests.log" 2>&1 &
  export CUDA_VISIBLE_DEVICES=0
  prof qwen_fa3_b1 --model $QWEN --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof qwen_fa3_b64 --model $QWEN --backend FLASH_ATTN --batch-size 64
  prof qwen_fi_b64 --model $QWEN --backend FLASHINFER --batch-size 64
  prof llama_fa3_b1 --model $LLAMA --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  for b in 16 64; do
    bench attn_qwen_bs$b attention --dtype bfloat16 --num-heads 16 --num-kv-heads 8 --head-size 128 --batch-size 64 \
      --context-lens 1024 --prefill-lens 1024 --block-size $b --backends FLASH_ATTN FLASHINFER --no-progress
  done
  wait
}

job_tpfast() {  # both GPUs: the symmetric-memory all-reduce, then TP with it (issue 9)
  unset CUDA_VISIBLE_DEVICES
  timeout 90 python3 -m benchmarks.gpu.bench_allreduce --json "$RES/allreduce.json" || echo "!! bench_allreduce failed"
  timeout 260 python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_all_reduce_gpu.py \
    tests/gpu/test_tp_gpu.py -k "all_reduce or (TRITON_ATTN and cudagraph) or tiny or dead"
  local tp="--model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 --input-len 1024 --output-len 64 \
    --num-iters 2 --max-model-len 4096 --use-skinny-gemm"
  bench lat_llama_tp latency $tp --compare-tensor-parallel-sizes 1 2
  bench lat_llama_tp2_nccl latency $tp --tensor-parallel-size 2 --disable-custom-all-reduce
  export CUDA_VISIBLE_DEVICES=0  # then, time permitting, where a decode step's time goes
  prof qwen_fa3_b1 --model $QWEN --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof llama_fa3_b1 --model $LLAMA --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof qwen_fa3_b64 --model $QWEN --backend FLASH_ATTN --batch-size 64
}

job_tplast() {  # ~250 s: tpfast's essentials after its first run found the all-reduce setup bug
  unset CUDA_VISIBLE_DEVICES
  timeout 100 python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_all_reduce_gpu.py \
    tests/gpu/test_tp_gpu.py -k "all_reduce or (TRITON_ATTN and cudagraph)"
  bench lat_llama_tp latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 --input-len 1024 \
    --output-len 64 --num-iters 2 --max-model-len 4096 --use-skinny-gemm --compare-tensor-parallel-sizes 1 2
  timeout "$(left)" python3 -m benchmarks.gpu.bench_allreduce --json "$RES/allreduce.json" || echo "!! bench_allreduce failed"
}

job_s5a() {  # session 5, first call (one GPU, fa3 staged): the fused SwiGLU GEMV, then decode-step profiles
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_silu_mul_gemv.py \
    tests/gpu/test_skinny_gemm.py
  timeout 60 python3 -m benchmarks.gpu.bench_silu_mul_gemv --json "$RES/silu_mul_gemv.json" || echo "!! bench_silu_mul_gemv"
  prof qwen_fa3_b1 --model $QWEN --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof llama_fa3_b1 --model $LLAMA --backend FLASH_ATTN --batch-size 1 --use-skinny-gemm
  prof qwen_fa3_b64 --model $QWEN --backend FLASH_ATTN --batch-size 64
  prof llama_fa3_b64 --model $LLAMA --backend FLASH_ATTN --batch-size 64
}

job_s5b() {  # session 5 (one GPU; fa3, g1, g2 staged): the fused RoPE + KV write, FA3's graph plan, then speed
  export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf -x tests/gpu/test_rope_kv_write_gpu.py \
    tests/gpu/test_cuda_graphs.py -k "not FLASHINFER and not FLEX"
  bench lat_qwen_fa3_skinny latency --model $QWEN $DUMMY --attention-backend FLASH_ATTN $LAT --use-skinny-gemm
  bench lat_llama_fa3_b1_skinny latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 \
    --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536 --use-skinny-gemm
  timeout 60 python3 -m benchmarks.gpu.bench_fa3_decode --json "$RES/fa3_decode.json" || echo "!! bench_fa3_decode"
  prof qwen_fa3_b64 --model $QWEN --backend FLASH_ATTN --batch-size 64 --use-skinny-gemm
}

job_s5c() {  # session 5 (fi staged too): FlashInfer speed, then the GEMV/SwiGLU tests and the 16..64-row GEMV bench
  export CUDA_VISIBLE_DEVICES=0
  bench lat_qwen_fi_skinny latency --model $QWEN $DUMMY --attention-backend FLASHINFER $LAT --use-skinny-gemm
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_skinny_gemm.py \
    tests/gpu/test_silu_mul_gemv.py tests/model_executor/test_sampler.py tests/gpu/test_rope_kv_write_gpu.py \
    -k "not FLASH_ATTN_2 and not FA4"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_gemv --models qwen --json "$RES/gemv64.json" || echo "!! bench_gemv"
}

job_s5d() {  # session 5 (fa3, g1, g2 staged): the failed forced-Triton test, host gaps between steps, Llama b64
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=long -rf \
    tests/gpu/test_skinny_gemm.py::test_decode_graph_with_triton_gemvs_matches_cublas 2>&1 | tail -60
  timeout 120 python3 -m benchmarks.gpu.profile_engine_steps --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_fa3_b64.json" || echo "!! profile_engine_steps"
  timeout 60 python3 -m benchmarks.gpu.bench_silu_mul_gemv --models qwen --ms 8 16 32 64 --json "$RES/silu_mul_gemv64.json" \
    || echo "!! bench_silu_mul_gemv"
  bench lat_llama_fa3_b64_skinny latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 64 \
    --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536 --use-skinny-gemm
}

job_s5e() {  # session 5, last call (g1, g2, fi staged): the forced-Triton test's bound, FlashInfer's fused RoPE + KV
  export CUDA_VISIBLE_DEVICES=0  # write and graph path (after flashinfer_graphs.py)
  t() { timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf "$@"; }
  t tests/gpu/test_skinny_gemm.py::test_decode_graph_with_triton_gemvs_matches_cublas
  t tests/gpu/test_rope_kv_write_gpu.py tests/gpu/test_cuda_graphs.py -k FLASHINFER
}

job_s6a() {  # session 6, first call (fa3, g1, g2 staged): PDL correctness, then PDL variants of a decode step
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_pdl_gpu.py
  timeout 240 python3 -m benchmarks.gpu.bench_pdl --model $LLAMA --batch-size 1 --json "$RES/pdl_llama_b1.json" \
    || echo "!! bench_pdl llama"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_pdl --model $QWEN --batch-size 64 --prefetch 2048 \
    --json "$RES/pdl_qwen_b64.json" || echo "!! bench_pdl qwen"
}

job_s6b() {  # session 6 (g1, g2, fi staged): PDL engine test, the GEMV's unrolled split-K reduction, FlashInfer +- PDL
  export CUDA_VISIBLE_DEVICES=0
  (timeout 300 python3 -m benchmarks.gpu.flashinfer_warm 16:8:128 > "$OUT/fiwarm.log" 2>&1) & local warm=$!
  timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_pdl_gpu.py \
    tests/gpu/test_silu_mul_gemv.py -k "engine or silu_mul or fused"
  timeout 120 python3 -m benchmarks.gpu.bench_gemv --models qwen --ms 1 4 16 64 --json "$RES/gemv_unroll.json" \
    || echo "!! bench_gemv"
  wait $warm
  bench lat_qwen_fi_skinny latency --model $QWEN $DUMMY --attention-backend FLASHINFER $LAT --use-skinny-gemm
  bench lat_qwen_fi_skinny_pdl latency --model $QWEN $DUMMY --attention-backend FLASHINFER $LAT --use-skinny-gemm \
    --enable-pdl
  bench lat_llama_fa3_b1_pdl latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 \
    --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536 \
    --use-skinny-gemm --enable-pdl
}

job_s6c() {  # session 6 (g1, g2, fa3 staged): L2 prefetch premise, GPU tests with PDL on, FA3 latency with PDL on
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 -m benchmarks.gpu.bench_l2_prefetch --json "$RES/l2_prefetch.json" || echo "!! bench_l2_prefetch"
  timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_pdl_gpu.py \
    tests/gpu/test_rope_kv_write_gpu.py tests/gpu/test_cuda_graphs.py -k "engine or not (FLASHINFER or FLEX or chain)"
  bench lat_qwen_fa3_skinny latency --model $QWEN $DUMMY --attention-backend FLASH_ATTN $LAT --use-skinny-gemm
  bench lat_llama_fa3_b1_skinny latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 \
    --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536 --use-skinny-gemm
  bench lat_llama_fa3_b64_skinny latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 64 \
    --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536 --use-skinny-gemm
}

B64="--batch-size 64 --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536"

job_s6d() {  # session 6 (g1, g2, fa3 staged): batch 64 with and without PDL on one machine, FA3
  export CUDA_VISIBLE_DEVICES=0
  for m in qwen llama; do
    local model=$QWEN; [ $m = llama ] && model=$LLAMA
    bench lat_${m}_fa3_b64_nopdl latency --model $model $DUMMY --attention-backend FLASH_ATTN $B64 --use-skinny-gemm \
      --no-enable-pdl
    bench lat_${m}_fa3_b64_pdl latency --model $model $DUMMY --attention-backend FLASH_ATTN $B64 --use-skinny-gemm
  done
}

job_s6e() {  # session 6 (g1, g2, fia, fib staged): FlashInfer tests after the PDL default, Llama batch 1 +- PDL
  export CUDA_VISIBLE_DEVICES=0
  (timeout 200 python3 -m benchmarks.gpu.flashinfer_warm 32:8:128 > "$OUT/fiwarm.log" 2>&1) & local warm=$!
  timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_rope_kv_write_gpu.py \
    tests/gpu/test_cuda_graphs.py -k FLASHINFER
  wait $warm
  local b1="--batch-size 1 --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536"
  bench lat_llama_fi_b1_pdl latency --model $LLAMA $DUMMY --attention-backend FLASHINFER $b1 --use-skinny-gemm
  bench lat_llama_fi_b1_nopdl latency --model $LLAMA $DUMMY --attention-backend FLASHINFER $b1 --use-skinny-gemm \
    --no-enable-pdl
}

job_s7a() {  # session 7, first call (g1, g2, fia, fib staged): TRITON_ATTN's KV tiles; decode by KV layout and block size
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m benchmarks.gpu.bench_triton_decode --json "$RES/triton_decode.json"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_decode_layout --backends FLASHINFER TRITON_ATTN --json "$RES/decode_layout.json"
}

job_s7b() {  # session 7 (g1, g2, fia, fib staged): TRITON_ATTN with vector block ids, PDL and finer splits:
  # correctness, kernel times, engine latency against FLASHINFER on the same machine, a step profile
  export CUDA_VISIBLE_DEVICES=0
  (timeout 200 python3 -m benchmarks.gpu.flashinfer_warm 16:8:128 > "$OUT/fiwarm.log" 2>&1) & local warm=$!
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_backends_vs_reference.py \
    tests/gpu/test_cuda_graphs.py tests/gpu/test_rope_kv_write_gpu.py -k TRITON
  timeout 60 python3 -m benchmarks.gpu.bench_triton_decode --json "$RES/triton_decode2.json"
  timeout 90 python3 -m benchmarks.gpu.bench_decode_layout --backends TRITON_ATTN FLASHINFER --layouts NHD \
    --json "$RES/decode_layout2.json"
  local b1="--batch-size 1 --input-len 1024 --output-len 128 --num-iters 3 --max-model-len 4096 --max-num-batched-tokens 65536"
  bench lat_qwen_triton latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm
  prof qwen_triton_b64 --model $QWEN --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm
  wait $warm
  bench lat_qwen_fi latency --model $QWEN $DUMMY --attention-backend FLASHINFER $LAT --use-skinny-gemm
  bench lat_llama_triton_b1 latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN $b1 --use-skinny-gemm
}

job_s7c() {  # session 7 (g1, g2 staged): GEMV first weight tile before the PDL wait, TRITON_ATTN decode launch
  # options: GPU correctness, then in-process PDL/GEMV variants of a step, the engine's step loop, latency
  export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_pdl_gpu.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_backends_vs_reference.py tests/gpu/test_cuda_graphs.py -k \
    "not FLASHINFER and not FLASH_ATTN and not FLEX"
  timeout 110 python3 -m benchmarks.gpu.bench_pdl --model $QWEN --backend TRITON_ATTN --batch-size 64 --json "$RES/pdl_qwen_b64.json"
  timeout 130 python3 -m benchmarks.gpu.bench_pdl --model $LLAMA --backend TRITON_ATTN --batch-size 1 --json "$RES/pdl_llama_b1.json"
  timeout 60 python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_triton_b64.json" | tail -15
  bench lat_qwen_triton2 latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm
}

job_s7d() {  # session 7, last call (g1, g2 staged): RoPE + KV write inside TRITON_ATTN's decode kernel:
  # GPU correctness (bitwise against the unfused path), kernel times, latency of both shapes, a step profile
  export CUDA_VISIBLE_DEVICES=0
  timeout 215 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short -rf tests/gpu/test_rope_kv_write_gpu.py \
    tests/gpu/test_pdl_gpu.py tests/gpu/test_cuda_graphs.py tests/gpu/test_backends_vs_reference.py \
    tests/gpu/test_skinny_gemm.py -k "not FLASHINFER and not FLASH_ATTN and not FLEX"
  timeout 40 python3 -m benchmarks.gpu.bench_triton_decode --cases qwen3_b64 llama_b1 --json "$RES/triton_decode3.json"
  bench lat_qwen_triton3 latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm
  prof qwen_triton_b64_rope --model $QWEN --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm
  bench lat_llama_triton3 latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm
}

job_s7e() {  # session 7, after the last (g1, g2 staged): RoPE inside TRITON_ATTN's decode kernel vs two kernels,
  # same process (Qwen3 then Llama-3.1-8B shape, batch 64)
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 -m benchmarks.gpu.bench_rope_fusion --model $QWEN --json "$RES/rope_fusion_qwen.json"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_rope_fusion --model $LLAMA --json "$RES/rope_fusion_llama.json"
}

job_s8a() {  # session 8, first call (g1, g2 staged): side-stream step copies (tests, same-process A/B, engine gaps),
  # cuBLAS vs cuBLASLt on the decode matmuls, the RoPE-fusion A/B session 7 left unrun, latency +- cuBLASLt
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_graph_input_stream.py \
    tests/gpu/test_async_scheduling_gpu.py tests/gpu/test_cuda_graphs.py -k "TRITON or input_stream or in_line" \
    --junitxml "$RES/s8a_tests.xml" 2>&1 | tail -15
  timeout 120 python3 -m benchmarks.gpu.bench_step_copies --json "$RES/step_copies_qwen.json"
  timeout 60 python3 -m benchmarks.gpu.bench_blas --json "$RES/blas.json"
  timeout 60 python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_triton_b64.json" | grep -v '^ *"\|^ *\]\|^ *\[' | head -5
  timeout 60 python3 -m benchmarks.gpu.bench_rope_fusion --model $QWEN --json "$RES/rope_fusion_qwen.json"
  bench lat_qwen_triton $QWEN_LAT
  TORCH_BLAS_PREFER_CUBLASLT=1 bench lat_qwen_triton_lt $QWEN_LAT
}

job_s8b() {  # session 8 (g1, g2 staged): ran a TRITON_ATTN decode prologue (first KV tile prefetched, q from registers)
  # since dropped (3.67 / 3.53 ms a step vs 2.96): now the RoPE-fusion A/B, GPU tests, latency, the step breakdown
  export CUDA_VISIBLE_DEVICES=0
  timeout 60 python3 -m benchmarks.gpu.bench_rope_fusion --model $QWEN --json "$RES/rope_prologue_qwen.json"
  timeout 170 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_rope_kv_write_gpu.py \
    tests/gpu/test_graph_input_stream.py tests/gpu/test_backends_vs_reference.py -k "TRITON or input_stream or in_line" \
    --junitxml "$RES/s8b_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -15
  bench lat_qwen_triton_prefetch $QWEN_LAT
  timeout 60 python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_triton_b64_prefetch.json" > /dev/null
  python3 -c "import json; [print(r) for r in json.load(open('$RES/engine_steps_qwen_triton_b64_prefetch.json'))['by_kernel']]"
}

job_s8c() {  # session 8 (g1, g2 staged): the sampler's Triton argmax (tests, kernel A/B), then engine latency of both
  # shapes with it and the side-stream copies, the step breakdown, Llama batch 64 with cuBLASLt
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_triton_argmax_gpu.py \
    tests/gpu/test_async_scheduling_gpu.py tests/model_executor/test_sampler.py -k "not FLASH and not FLEX" \
    --junitxml "$RES/s8c_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  timeout 40 python3 -m benchmarks.gpu.bench_argmax --json "$RES/argmax.json"
  bench lat_qwen_triton_argmax $QWEN_LAT
  timeout 60 python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_triton_b64_argmax.json" > /dev/null
  python3 -c "import json; d=json.load(open('$RES/engine_steps_qwen_triton_b64_argmax.json')); print(d['span_ms']/d['engine_steps'], 'ms/step'); [print(r) for r in d['by_kernel'][:14]]"
  bench lat_llama_triton $LLAMA_LAT
  TORCH_BLAS_PREFER_CUBLASLT=1 bench lat_llama_triton_b64_lt latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN \
    ${LAT/--batch-size 1 64/--batch-size 64} --use-skinny-gemm
}

job_s8d() {  # session 8 (g1, g2 staged): decode calls without tile-array loads (DECODE_DIRECT): tests, kernel-graph
  # A/B (Qwen3 b64, Llama b1), then the engine variants A/B (side streams, Triton argmax, direct decode) of Qwen3
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_rope_kv_write_gpu.py \
    tests/gpu/test_backends_vs_reference.py tests/gpu/test_cuda_graphs.py -k "TRITON" \
    --junitxml "$RES/s8d_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
  timeout 60 python3 -m benchmarks.gpu.bench_rope_fusion --model $QWEN --json "$RES/decode_direct_qwen_b64.json"
  timeout 90 python3 -m benchmarks.gpu.bench_rope_fusion --model $LLAMA --batch-size 1 --json "$RES/decode_direct_llama_b1.json"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_engine_variants --json "$RES/engine_variants_qwen.json"
}

job_s8e() {  # session 8, last call (g1, g2 staged): the final latency of both shapes (cuBLASLt in the GEMV plan), the
  # GEMV-plan GPU tests, throughput of the Qwen3 shape (TRITON_ATTN), Qwen3 batch 64 once more
  export CUDA_VISIBLE_DEVICES=0
  bench lat_qwen_final $QWEN_LAT
  bench lat_llama_final $LLAMA_LAT
  timeout 100 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_skinny_gemm.py \
    --junitxml "$RES/s8e_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error|cuBLASLt" | tail -30
  bench thr_qwen_triton throughput --model $QWEN $DUMMY --attention-backend TRITON_ATTN --num-prompts 256 \
    --input-len 562 --output-len 562 --range-ratio 0.822 --max-num-seqs 256 --max-num-batched-tokens 16384 \
    --max-model-len 2304 --use-skinny-gemm
  bench lat_qwen_b64_again latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN \
    ${LAT/--batch-size 1 64/--batch-size 64} --use-skinny-gemm
}

job_s9a() {  # session 9, first call (g1, g2 staged), run on main + branch splitmerge (not merged: the fused merge was
  # slower) with a 32-token decode-tile switch (dropped: slower): the fused split-KV merge and session 8's
  # CPU-only changes (cuBLASLt's silenced warning, shared ticket counters) on the GPU; step A/B of the merge (Llama
  # b1), a 32-token KV-tile sweep at Qwen3 b64, then the engine A/B of 32-token decode tiles (Qwen3 b64)
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_split_merge_gpu.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_triton_argmax_gpu.py tests/gpu/test_backends_vs_reference.py \
    tests/gpu/test_cuda_graphs.py -k "not FLASHINFER and not FLASH_ATTN and not FLEX" \
    --junitxml "$RES/s9a_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -20
  python3 -c "
import torch; from attnserve.gemv.blas import cublaslt_linear
x = torch.randn(4, 64, device='cuda', dtype=torch.bfloat16); w = torch.randn(32, 64, device='cuda', dtype=torch.bfloat16)
print('cublaslt_linear max diff', (cublaslt_linear(x, w) - x @ w.T).abs().max().item())" 2> "$RES/blas_stderr.txt"
  echo "blas stderr bytes: $(wc -c < "$RES/blas_stderr.txt")"
  timeout 120 python3 -m benchmarks.gpu.bench_split_merge --splits 32 --use-skinny-gemm --rounds 3 \
    --json "$RES/split_merge_llama_b1.json"
  timeout 90 python3 -m benchmarks.gpu.bench_triton_decode --cases qwen3_b64 --sweep --sweep-tokens 32 64 \
    --sweep-warps 2 4 --sweep-stages 2 3 4 --no-sweep-maxnreg --json "$RES/triton_decode_tile32.json"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_engine_variants --batch-size 64 --rounds 2 \
    --variants engine "decode tile 32" "decode tile 32, 3 stages" --json "$RES/engine_variants_tile32.json"
}

job_s9b() {  # session 9 (g1, g2 staged): the fused greedy head (LM head + argmax without logits): GPU tests (and
  # session 8's GEMV-plan / ticket-counter ones), engine A/B against LM head + argmax, latency, the step's kernels
  export CUDA_VISIBLE_DEVICES=0
  timeout 260 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_greedy_head_gpu.py \
    tests/gpu/test_triton_argmax_gpu.py tests/gpu/test_skinny_gemm.py \
    --junitxml "$RES/s9b_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|Error|error" | tail -20
  timeout 150 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 1 64 --rounds 2 \
    --variants engine "no greedy head" --json "$RES/engine_variants_greedy.json"
  timeout 60 python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_b64_greedy.json" > /dev/null
  python3 -c "import json; d=json.load(open('$RES/engine_steps_qwen_b64_greedy.json')); print(d['span_ms']/d['engine_steps'], 'ms/step'); [print(r) for r in d['by_kernel'][:16]]"
}

job_s9c() {  # session 9 (g1, g2 staged): the fused greedy head computing 33..64-row tiles unswapped: GPU tests,
  # engine A/B against LM head + argmax (Qwen3 b1, b64), the final Qwen3 latency
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_greedy_head_gpu.py \
    tests/gpu/test_triton_argmax_gpu.py --junitxml "$RES/s9c_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|rror" | tail -20
  timeout 150 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 1 64 --rounds 2 \
    --variants engine "no greedy head" --json "$RES/engine_variants_greedy2.json"
  bench lat_qwen_final $QWEN_LAT
}

job_s9d() {  # session 9, last call (g1, g2, fa3 staged): Llama-3.1-8B latency with the greedy head in the plan,
  # throughput of the Qwen3 shape (FA3, session 4's command; TRITON_ATTN), the Qwen3 batch-64 step's kernels
  export CUDA_VISIBLE_DEVICES=0
  bench lat_llama_final $LLAMA_LAT
  local thr="--model $QWEN $DUMMY --num-prompts 256 --input-len 562 --output-len 562 --range-ratio 0.822 \
    --max-num-seqs 256 --max-num-batched-tokens 16384 --max-model-len 2304 --use-skinny-gemm"
  bench thr_qwen_fa3 throughput $thr --attention-backend FLASH_ATTN
  bench thr_qwen_triton throughput $thr --attention-backend TRITON_ATTN
  timeout "$(left)" python3 -m benchmarks.gpu.profile_engine_steps --backend TRITON_ATTN --batch-size 64 --use-skinny-gemm \
    --json "$RES/engine_steps_qwen_b64_greedy2.json" > /dev/null
  python3 -c "import json; d=json.load(open('$RES/engine_steps_qwen_b64_greedy2.json')); print(d['span_ms']/d['engine_steps'], 'ms/step'); [print(r) for r in d['by_kernel'][:16]]"
}

job_s9e() {  # session 9, after the last (g1, g2 staged): Qwen3 batch 64 once more on another machine start: the
  # engine A/B of the fused greedy head (3 rounds), then bench latency at batch 64
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 64 --rounds 3 \
    --variants engine "no greedy head" --json "$RES/engine_variants_greedy3.json"
  bench lat_qwen_b64_again latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN \
    ${LAT/--batch-size 1 64/--batch-size 64} --use-skinny-gemm
}

job_s9f() {  # session 9, last (g1, g2 staged): the model runner's greedy-step path (hidden states, then the fused
  # greedy head or the LM head + sampler) across the engine GPU tests, and the main command with the GEMV plan
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_async_scheduling_gpu.py \
    tests/gpu/test_cuda_graphs.py tests/gpu/test_e2e_default_model.py tests/gpu/test_pdl_gpu.py \
    -k "not FLASHINFER and not FLASH_ATTN and not FLEX" --junitxml "$RES/s9f_tests.xml" 2>&1 \
    | grep -E "passed|failed|FAILED|rror" | tail -20
  timeout "$(left)" python3 -m attnserve.entrypoints.cli.main generate --device cuda --attention-backend TRITON_ATTN \
    --use-skinny-gemm --max-tokens 32 2>&1 | tail -8
}

job_s10a() {  # session 10 (g1, g2 staged): the decode step's kernels per decode step (profile_engine_steps now
  # divides by decode steps, not engine.step() calls) for Llama-3.1-8B batch 1 and Qwen3-0.6B batch 64, then their
  # latency figures once more
  export CUDA_VISIBLE_DEVICES=0
  for m in "llama-3.1-8b 1" "qwen3-0.6b 64"; do
    set -- $m
    timeout 150 python3 -m benchmarks.gpu.profile_engine_steps --model benchmarks/shapes/$1 --backend TRITON_ATTN \
      --batch-size $2 --use-skinny-gemm --json "$RES/engine_steps_${1}_b$2.json" > /dev/null
    python3 -c "import json; d=json.load(open('$RES/engine_steps_${1}_b$2.json')); print('$1 b$2', round(d['ms_per_decode_step'], 4), 'ms/step, busy', round(d['busy_ms_per_decode_step'], 4)); [print(r) for r in d['by_kernel'][:18]]"
  done
  bench lat_llama_b1_s10 latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 1} --use-skinny-gemm
  bench lat_qwen_b64_s10 latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 64} --use-skinny-gemm
}

job_s10b() {  # session 10 (g1, g2 staged): Llama-3.1-8B batch 1's decode step (PDL on, then off: with PDL a kernel's
  # time includes its wait for the one before), then Qwen3 batch 64 and Llama batch 1 latency on this machine start
  export CUDA_VISIBLE_DEVICES=0
  for pdl in "" "--no-enable-pdl"; do
    local tag=${pdl:+_nopdl}
    timeout 150 python3 -m benchmarks.gpu.profile_engine_steps --model $LLAMA --backend TRITON_ATTN --batch-size 1 \
      --use-skinny-gemm $pdl --json "$RES/engine_steps_llama_b1$tag.json" > /dev/null
    python3 -c "import json; d=json.load(open('$RES/engine_steps_llama_b1$tag.json')); print('llama b1 $pdl', d['decode_steps'], 'steps', round(d['ms_per_decode_step'], 4), 'ms/step, busy', round(d['busy_ms_per_decode_step'], 4), 'idle inside', round(d['idle_inside_steps_ms'] / d['decode_steps'], 4)); [print(r) for r in d['by_kernel'][:18]]"
  done
  bench lat_qwen_b64_s10b latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 64} --use-skinny-gemm
  bench lat_llama_b1_s10b latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 1} --use-skinny-gemm
}

job_s10c() {  # session 10 (g1, g2 staged), run on branch kvprefetch (not merged: slower): TRITON_ATTN's decode
  # programs ask L2 for their first KV tile before the PDL wait: the GPU tests of the kernel and its engine paths,
  # then engine A/Bs against KV_PREFETCH off
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_backends_vs_reference.py \
    tests/gpu/test_rope_kv_write_gpu.py tests/gpu/test_cuda_graphs.py -k "TRITON and not FLASHINFER" \
    --junitxml "$RES/s10c_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|rror" | tail -20
  timeout 150 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 64 --rounds 2 \
    --variants engine "no KV prefetch" --json "$RES/engine_variants_prefetch_qwen.json" | grep -v "greedy head plan"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_engine_variants --model $LLAMA --batch-size 1 --rounds 2 \
    --variants engine "no KV prefetch" --json "$RES/engine_variants_prefetch_llama.json" | grep -v "greedy head plan"
}

job_s10d() {  # session 10, last (g1, g2 staged): after the CLI/engine error changes (the scheduler's prompt check in
  # check_prompt, the serve preflight, worker errors): the engine GPU tests, generate, and serve's preflight on CUDA
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/gpu/test_e2e_default_model.py \
    tests/gpu/test_async_scheduling_gpu.py tests/gpu/test_cuda_graphs.py -k "not FLASHINFER and not FLASH_ATTN and not FLEX" \
    --junitxml "$RES/s10d_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|rror" | tail -20
  timeout 120 python3 -m attnserve.entrypoints.cli.main generate --device cuda --max-tokens 32 2>&1 | tail -4
  timeout 60 python3 -m attnserve.entrypoints.cli.main serve --device cuda --max-model-len 999999 --port 8765; echo "serve rc=$?"
}

job_s11a() {  # session 11 (g1, g2 staged; run at commit 5146041, which had pdl.configure(early=True)): early PDL
  # launches and whole-share GEMV tiles on a Llama-3.1-8B batch-1 step (benchmarks/gpu/bench_cascade.py), then early PDL
  # in the engine (A/B)
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m benchmarks.gpu.bench_cascade --rounds 2 --json "$RES/cascade_llama_b1.json" 2>&1 | grep -v Warning
  timeout 130 python3 -m benchmarks.gpu.bench_engine_variants --model $LLAMA --batch-size 1 --rounds 2 \
    --variants engine "early pdl" --json "$RES/engine_variants_early_llama.json" | grep -v "greedy head plan"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_engine_variants --batch-size 64 --rounds 2 \
    --variants engine "early pdl" --json "$RES/engine_variants_early_qwen.json" | grep -v "greedy head plan"
}

job_s11b() {  # session 11 (g1, g2 staged): the GEMV plan with whole-K tiles (gemv_tiles.whole_k_config): engine
  # A/B against the plan without them (Llama-3.1-8B batch 1, Qwen3-0.6B batch 1 and 64), whole-K tiles forced per shape
  export CUDA_VISIBLE_DEVICES=0
  timeout 170 python3 -m benchmarks.gpu.bench_engine_variants --model $LLAMA --batch-size 1 --rounds 2 \
    --variants engine "no whole-K tiles" --json "$RES/engine_variants_wholek_llama.json" | grep -v "greedy head plan"
  timeout 170 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 1 64 --rounds 2 \
    --variants engine "no whole-K tiles" --json "$RES/engine_variants_wholek_qwen.json" | grep -v "greedy head plan"
  timeout "$(left)" python3 -m benchmarks.gpu.bench_cascade --rounds 1 --json "$RES/wholek_forced_llama_b1.json" 2>&1 \
    | grep -E "^r0|shape"
}

job_s11c() {  # session 11 (g1, g2 staged): correctness of the whole-K tiles and the engine with them, then latency
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --tb=short tests/kernels/test_triton_gemv.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_pdl_gpu.py tests/gpu/test_silu_mul_gemv.py \
    --junitxml "$RES/s11c_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|rror" | tail -20
  bench lat_llama_b1_s11 latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 1} --use-skinny-gemm
  bench lat_qwen_s11 latency --model $QWEN $DUMMY --attention-backend TRITON_ATTN $LAT --use-skinny-gemm
  timeout "$(left)" python3 -m benchmarks.gpu.bench_cascade --rounds 1 --sets --json "$RES/wholek_alone_s11c.json" 2>&1 \
    | grep -E "^r0|shape"
}

job_s11d() {  # session 11 (g1, g2 staged): GPU correctness with the whole-K tiles in the plan (s11c's pytest group
  # overran its budget: narrowed), then Llama-3.1-8B batch 1 latency once more
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -m gpu -q -rf -p no:cacheprovider --tb=short \
    tests/kernels/test_triton_gemv.py -k "whole_k or matches_f_linear_on_cuda or replays" \
    tests/gpu/test_pdl_gpu.py tests/gpu/test_skinny_gemm.py tests/gpu/test_e2e_default_model.py \
    --junitxml "$RES/s11d_tests.xml" 2>&1 | grep -E "passed|failed|FAILED|rror" | tail -20
  bench lat_llama_b1_s11d latency --model $LLAMA $DUMMY --attention-backend TRITON_ATTN ${LAT/--batch-size 1 64/--batch-size 1} --use-skinny-gemm
}

job_s11e() {  # session 11 (g1, g2 staged): s11d's -k kept only test_triton_gemv: the engine-level GPU tests with the
  # whole-K tiles in the plan, and generate on CUDA with --use-skinny-gemm
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -m gpu -q -rf -p no:cacheprovider --tb=short tests/gpu/test_pdl_gpu.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_e2e_default_model.py --junitxml "$RES/s11e_tests.xml" 2>&1 \
    | grep -E "passed|failed|FAILED|rror" | tail -20
  timeout "$(left)" python3 -m attnserve.entrypoints.cli.main generate --device cuda --use-skinny-gemm \
    --attention-backend TRITON_ATTN --max-tokens 32 2>&1 | tail -3
}

job_s11f() {  # session 11, last (g1, g2 staged): the KV-cache size check on CUDA (a cache beyond free memory is one
  # line naming the flag; a fitting one runs)
  export CUDA_VISIBLE_DEVICES=0
  timeout 90 python3 -m attnserve.entrypoints.cli.main generate --device cuda --num-gpu-blocks-override 1000000000000 \
    --max-tokens 8 2>&1 | grep -v Warning | tail -2; echo "rc=${PIPESTATUS[0]}"
  timeout 90 python3 -m attnserve.entrypoints.cli.main generate --device cuda --kv-cache-memory-bytes 1G \
    --max-tokens 16 2>&1 | grep -v Warning | tail -3; echo "rc=${PIPESTATUS[0]}"
}

job_attn() {
  export CUDA_VISIBLE_DEVICES=0
  bench attention attention --dtype bfloat16 --num-heads 32 --num-kv-heads 8 --head-size 128 --batch-size 64 \
    --context-lens 1024 2048 4096 8192 --prefill-lens 4096 --no-progress
}

job_tp() {  # both GPUs (issue 9)
  unset CUDA_VISIBLE_DEVICES
  timeout "$(left)" python3 -m pytest -m gpu -q -s -p no:cacheprovider --tb=short -rf tests/gpu/test_tp_gpu.py
  bench lat_llama_tp latency --model $LLAMA $DUMMY --attention-backend FLASH_ATTN --batch-size 1 --input-len 1024 \
    --output-len 64 --num-iters 2 --max-model-len 4096 --compare-tensor-parallel-sizes 1 2 --use-skinny-gemm
}
job_s12a() {  # session 12 (g1, g2 staged): the gate/up SwiGLU epilogue and the unsplit 64-row tile: GPU tests, the
  # engine A/B on the Qwen3-0.6B shape (batch 1, 64), its latency
  export CUDA_VISIBLE_DEVICES=0
  timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_skinny_gemm.py \
    tests/gpu/test_pdl_gpu.py tests/gpu/test_gate_up_swiglu_gpu.py tests/gpu/test_e2e_default_model.py 2>&1 | tail -8
  timeout 200 python3 -m benchmarks.gpu.bench_engine_variants --batch-size 1 64 --rounds 2 \
    --variants engine "no SwiGLU epilogue" "no unsplit tile" --json "$RES/engine_variants_swiglu_qwen.json" \
    | grep -v "greedy head plan"
  bench lat_qwen_s12a $QWEN_LAT
}
job_s12b() {  # session 12 (g1, g2 staged): the same on the Llama-3.1-8B shape, batch 1 and 64
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m benchmarks.gpu.bench_engine_variants --model $LLAMA --batch-size 1 64 --rounds 2 \
    --variants engine "no SwiGLU epilogue" --json "$RES/engine_variants_swiglu_llama.json" | grep -v "greedy head plan"
  bench lat_llama_s12b $LLAMA_LAT
  timeout "$(left)" python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_gate_up_swiglu_gpu.py \
    tests/gpu/test_skinny_gemm.py tests/gpu/test_pdl_gpu.py tests/gpu/test_e2e_default_model.py 2>&1 | tail -12
}
job_s12c() {  # session 12, last (g1, g2 staged): the GEMV's GPU tests (plain and SwiGLU-prologue paths after the
  # epilogue's change to the kernel), then the Qwen3-0.6B latency again
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_silu_mul_gemv.py \
    tests/kernels/test_triton_gemv.py -k "not interpreter" 2>&1 | tail -6
  bench lat_qwen_s12c $QWEN_LAT
}
job_s12e() {  # session 12, final code (g1, g2 staged; a new machine start): the fused greedy head's GPU tests (its
  # calls into the GEMV's tile functions were broken by the epilogue's new argument until d6fa9b2), then the
  # Qwen3-0.6B latency
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -rf tests/gpu/test_greedy_head_gpu.py 2>&1 | tail -4
  bench lat_qwen_s12e $QWEN_LAT
}

pids=()
for j in "$@"; do
  case "$j" in
    tests) job_tests > "$OUT/tests.log" 2>&1 & pids+=($!) ;;
    models) job_models > "$OUT/models.log" 2>&1 & pids+=($!) ;;
    fiwarm) (CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.gpu.flashinfer_warm 16:8:128 32:8:128 > "$OUT/fiwarm.log" 2>&1) & pids+=($!) ;;
    bench) job_bench > "$OUT/bench.log" 2>&1 & pids+=($!) ;;
    bench2) job_bench2 > "$OUT/bench2.log" 2>&1 & pids+=($!) ;;
    attn) wait "${pids[@]}" 2>/dev/null; pids=(); job_attn > "$OUT/attn.log" 2>&1 ;;
    tp) wait "${pids[@]}" 2>/dev/null; pids=(); job_tp > "$OUT/tp.log" 2>&1 ;;
    next) wait "${pids[@]}" 2>/dev/null; pids=(); job_next > "$OUT/next.log" 2>&1 ;;
    check) job_check > "$OUT/check.log" 2>&1 & pids+=($!) ;;
    s5a) job_s5a > "$OUT/s5a.log" 2>&1 ;;
    s5b) job_s5b > "$OUT/s5b.log" 2>&1 ;;
    s5c) job_s5c > "$OUT/s5c.log" 2>&1 ;;
    s5d) job_s5d > "$OUT/s5d.log" 2>&1 ;;
    s5e) job_s5e > "$OUT/s5e.log" 2>&1 ;;
    s6*|s7*|s8*|s9*|s10*|s11*|s12*) "job_$j" > "$OUT/$j.log" 2>&1 ;;
    tplast) job_tplast > "$OUT/tplast.log" 2>&1 ;;
    tpfast) wait "${pids[@]}" 2>/dev/null; pids=(); job_tpfast > "$OUT/tpfast.log" 2>&1 ;;
    *) echo "unknown job $j" >&2 ;;
  esac
done
wait
tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
for f in "$OUT"/*.log; do echo "=== $f (tail)"; grep -E "passed|failed|error|Error|PASS|FAIL|tok/s|TPOT|ratio|%|==|!!" "$f" | tail -25; done
echo "elapsed $(( $(date +%s) - START )) s"
