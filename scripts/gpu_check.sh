#!/usr/bin/env bash
# The prepared GPU check: one short script for a lent device (about 6 minutes; 8 at most).
#   here, once:   bash scripts/gpu_wheels.sh
#   then:         device run, command "bash scripts/gpu_check.sh", carry [".whl", ".gpu_data"], timeout_s 560
# It prints the card and its measured matmul rates, runs the tests that need a GPU, then every member of SFMTL-Graph's
# paper-scale comparison (configs/sfmtl/fashion_mnist_rotated_masked.yaml, the real Fashion-MNIST files carried in
# .gpu_data) batched and sequential against a bare sequential loop on the card (`manytask bench --only paper`): the
# figures docs/performance.md records per card; the same for FedAvg + DEA on a Swin-T, FL + TaLoS and MAS-2
# (`--only scale`, offline stand-ins); then one round of FedAvg and of SFMTL-Graph under the profiler
# (scripts/profile_round.py). What it writes under $OUT comes back, each part as it finishes.
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
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_devices.py tests/test_resident.py \
    tests/test_checkpoint_integrity.py 2>&1 | tail -n 30 | tee "$OUT/tests.txt"
timeout 400 python3 -c "from manytask.cli import main; main()" bench --only paper --rounds 1 \
    --out "$OUT/paper.json" 2>&1 | tee "$OUT/paper.txt" | grep -v 'one after another'
# FedAvg + DEA on a Swin-T with BatchNorm decoders, FL + TaLoS's sparse rounds, MAS-2's all-in-one rounds
timeout 150 python3 -c "from manytask.cli import main; main()" bench --only scale --rounds 1 \
    --out "$OUT/scale.json" 2>&1 | tee "$OUT/scale.txt" | grep -v 'one after another'
for member in fedavg sfmtl-graph; do  # where a batched round's time goes on the card (top ops by device time)
    timeout 90 python3 scripts/profile_round.py --member "$member" 2>&1 | grep -v 'one after another\|USDT' \
        | tee "$OUT/profile-$member.txt" | head -n 22
done
