#!/usr/bin/env bash
# GPU runner (NVIDIA, Docker engine + NVIDIA Container Toolkit): build docker/cuda and run
# the layer-isolated smoke suite inside the image.
#   ci/gpu-smoke.sh                         build flagos/sglang-fl:cuda-smoke, then smoke
#   ci/gpu-smoke.sh --image REG/IMG:TAG     smoke an image built elsewhere
# Extra arguments after the image go to `python -m sglang_fl.smoke` in the container, e.g.
#   ci/gpu-smoke.sh --image IMG --no-skip   (fail if Layer 3 lacks a second GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q nox
python3 -m nox -s smoke-cuda -- "$@"
