#!/usr/bin/env bash
# The prepared GPU check: one short script for a lent device (about 7 minutes on an H200; 8 at most).
#   here, once:   bash scripts/gpu_wheels.sh
#   then:         device run, command "bash scripts/gpu_check.sh", carry [".whl", ".gpu_data"], timeout_s 540
# It prints the card and its measured matmul rate, runs the tests that need a GPU and the batched executor's tests on
# it, then the kernel counts, the compute limit and every SFMTL member against it with `device: auto` (the GPU): the
# figures docs/performance.md records per card. Carry .gpu_data too for the real Fashion-MNIST files. What it writes
# under $OUT comes back.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "no wheels: run scripts/gpu_wheels.sh here and carry .whl"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/card.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/card.txt"
if [ -d .gpu_data/fashion-mnist ]; then  # where the loaders and the compute limit look for it
    mkdir -p /usr/share/datasets/fashion-mnist 2>/dev/null && cp -n .gpu_data/fashion-mnist/* /usr/share/datasets/fashion-mnist/
fi
python3 - <<'PY' | tee "$OUT/flops.txt"
import time, torch
for dtype in (torch.float32, torch.bfloat16):
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    print(f"{dtype} matmul 8192²: {2 * 8192 ** 3 * 20 / (time.perf_counter() - began) / 1e12:.1f} TFLOP/s")
PY
timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/test_devices.py tests/test_batched.py tests/test_batched_dense.py \
    tests/test_checkpoint_integrity.py 2>&1 | tail -n 15 | tee "$OUT/tests.txt"
timeout 240 python3 -c "from manytask.cli import main; main()" bench --only kernels --only limit --rounds 2 \
    --out "$OUT/bench.json" 2>&1 | grep -v 'one after another' | tail -n 30 | tee "$OUT/bench.txt"
timeout 200 python3 -c "from manytask.cli import main; main()" bench --only members --rounds 2 \
    --out "$OUT/members.json" 2>&1 | grep -v 'one after another' | tail -n 15 | tee "$OUT/members.txt"
