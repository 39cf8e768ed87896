#!/usr/bin/env bash
# Run here, once, before scripts/gpu_check.sh: downloads the wheels the GPU machine lacks (its image has torch,
# numpy, safetensors, typer, rich, pyyaml, networkx, matplotlib, scikit-learn; not pydantic) for its Python 3.12
# into .whl/, which git ignores and the device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
for spec in pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5; do
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "$spec"
done
ls .whl
