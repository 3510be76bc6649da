#!/usr/bin/env bash
# CPU pipeline: every static check and every test a CPU-only runner can do.
#   lint         ruff, hadolint, shellcheck, compose-spec / workflow schemas, compose rendering
#   tests        pytest over tests/ (CPU stack installed by docker/install_stack.py)
#   tests-sglang-0.5.23  the SGLang-facing tests against SGLang 0.5.23
#   smoke-cpu    the layer-isolated smoke suite on the host
#   image-cpu    the CPU image built and run (smoke inside, chat request, bad input)
#   compose-cpu  TP=2 over two containers with Compose v2, ids equal to TP=1; then image-cpu
#                again, built with SGLang 0.5.23
# Needs Python 3.11 and PyPI. The image sessions need a Docker engine, or root + apt-get to get
# one (docker/host_engine.py); without either they are skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

sessions=(lint tests tests-sglang-0.5.23 smoke-cpu)
if reason=$(python3 docker/host_engine.py check); then
    # Compose v2 (installed from Debian's archive if missing): the rendering tests must run.
    python3 docker/host_engine.py compose
    export SGLANG_FL_TEST_REQUIRE_COMPOSE=1
    sessions+=(image-cpu compose-cpu)
else
    echo "ci/cpu-pipeline.sh: skipping image-cpu and compose-cpu: $reason"
fi

python3 -m pip install -q nox
python3 -m nox -s "${sessions[@]}" "$@"
if [[ " ${sessions[*]} " == *" image-cpu "* ]]; then
    python3 -m nox -s image-cpu -- --sglang 0.5.23
fi
