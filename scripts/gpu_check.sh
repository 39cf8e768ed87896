#!/usr/bin/env bash
# The prepared GPU check: one short script for a lent device (about 5 minutes on an H200).
#   here, once:   bash scripts/gpu_wheels.sh
#   then:         device run, command "bash scripts/gpu_check.sh", carry [".whl"], timeout_s 540
# It prints the card, runs the tests that need a GPU and the batched executor's tests on it, then the kernel counts
# and the compute limit with `device: auto` (the GPU): the figures docs/performance.md records per card. What it
# writes under $OUT comes back.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "no wheels: run scripts/gpu_wheels.sh here and carry .whl"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/card.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_devices.py tests/test_batched.py tests/test_batched_dense.py \
    tests/test_checkpoint_integrity.py 2>&1 | tail -n 15 | tee "$OUT/tests.txt"
timeout 240 python3 -c "from manytask.cli import main; main()" bench --only kernels --only limit --rounds 2 \
    --out "$OUT/bench.json" 2>&1 | grep -v 'one after another' | tail -n 30 | tee "$OUT/bench.txt"
