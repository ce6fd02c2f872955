#!/usr/bin/env bash
# A GPU smoke test after merging branches (one device call, about 3 minutes once FA3 is installed): the engine
# starts, captures its graphs (cascade ones too) and generates, eagerly and with CUDA graphs, with async scheduling,
# structured outputs (when xgrammar is installed) and the kernels every backend shares. CPU CI cannot see a break in
# these paths (a merge once left every CUDA engine failing at start-up). Run it first in a device session.
#   bash benchmarks/gpu/smoke.sh OUT_DIR
set -u
out=${1:-/tmp}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
t() { n=$1; shift; timeout "$1" python3 -m pytest -q -p no:cacheprovider --tb=short "${@:2}" > "$out/$n.log" 2>&1
      echo "$n rc=$?"; tail -1 "$out/$n.log"; grep -E "^(E |FAILED)" "$out/$n.log" | head -6 | cut -c1-220; }
t cascade 90 tests/gpu/test_cascade_gpu.py
t graphs 120 tests/gpu/test_cuda_graphs.py -x
t async 120 tests/gpu/test_async_scheduling_gpu.py -x
t rope 90 tests/gpu/test_rope_kv_write_gpu.py -x -k "not model_logits"
python3 -c "import xgrammar" 2>/dev/null && t structured 120 tests/gpu/test_structured_outputs_gpu.py -x
