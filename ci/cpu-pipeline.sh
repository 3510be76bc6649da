#!/usr/bin/env bash
# CPU pipeline: every static check and every test a CPU-only runner can do.
#   lint       ruff, hadolint, shellcheck, compose-spec / workflow schemas, compose rendering
#   tests      pytest over tests/ (CPU stack installed by docker/install_stack.py)
#   smoke-cpu  the layer-isolated smoke suite on the host
# Needs Python 3.11 and PyPI; on a Debian/Ubuntu runner running as root it also installs
# Debian's docker-compose, the compose implementation the packaging tests render with.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose
    else
        echo "ci/cpu-pipeline.sh: no compose implementation and cannot apt-get one" >&2
        exit 1
    fi
fi
# With a compose implementation present, its rendering tests must run, not skip.
export SGLANG_FL_TEST_REQUIRE_COMPOSE=1

python3 -m pip install -q nox
python3 -m nox -s lint tests smoke-cpu "$@"
