#!/usr/bin/env bash
# On the H200 machine, from the checkout's root: install the staged wheels (if any) and run the kernel
# tests of every installed backend. Usage: bash benchmarks/gpu/device_kernels.sh WHEEL_DIR [SECONDS]
set -o pipefail
whl=${1:-.whl}; limit=${2:-500}
if ls "$whl"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$whl"/*.whl || exit 1
  SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
  echo "import site; site.addsitedir('/tmp/site')" > "$SP/zz_attnserve_site.pth"
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 ATTNSERVE_GPU_RESULTS=${OUT:-/tmp}/kernels.json
export FLASHINFER_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
nvidia-smi -L
timeout "$limit" python3 -m pytest tests/gpu/test_backends_vs_reference.py -m gpu -s -q -p no:cacheprovider 2>&1 \
  | tee "${OUT:-/tmp}/kernels.log"
python3 -m benchmarks.gpu.report "$ATTNSERVE_GPU_RESULTS"
