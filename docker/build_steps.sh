#!/usr/bin/env bash
# The build steps every sglang-fl image shares, called from each docker/<vendor>/Dockerfile,
# which keeps only its base image and what truly differs (extra system packages, a vendor
# environment script, labels, the user). Run from the source folder (/opt/sglang-fl/src):
#
#   docker/build_steps.sh system [PACKAGE...]  trust docker/ca-certificates/*.crt (apt, pip, git),
#                                              apt-get install curl (+ FlagCX's build tools
#                                              where FLAGCX_PATH is set) and PACKAGEs
#   docker/build_steps.sh deps                 install_stack.py --phase deps: vendor torch
#                                              frozen, SGLang/FlagGems/sglang-kernel, FlagCX
#                                              built into FLAGCX_PATH (docker/stacks/<platform>.ini)
#   docker/build_steps.sh plugin               install_stack.py --phase plugin, the entrypoint
#                                              as sglang-fl-entrypoint, the platform YAML checked
#
# Each Dockerfile copies docker/ (this script, the entrypoint, install_stack.py, the stack files,
# docker/ca-certificates/), pyproject.toml and requirements/, runs `system` and `deps`, and only
# then copies the whole tree and runs `plugin`: a change to the plugin's source rebuilds only
# that last layer.
#
# Read from the environment (the Dockerfile's ENV and build ARGs): SGLANG_FL_PLATFORM,
# SGLANG_FL_PYTHON, FLAGCX_PATH (unset: no FlagCX, as on CPU), SGLANG_VERSION (empty: the
# stack's default), VENDOR_INDEX_URL (set, even empty: replaces the stack's vendor index),
# FLAGCX_REPO (a FlagCX git mirror), SGLANG_FL_ENV_SCRIPTS (vendor scripts, e.g. CANN's
# set_env.sh, sourced by docker/entrypoint.sh, which runs install_stack.py as at run time).
set -eo pipefail
# Build-time only (not kept in the image's environment).
export DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

die() {
    echo "build_steps.sh: $*" >&2
    exit 2
}

system() {
    # Extra CA certificates (a TLS-intercepting proxy's), trusted by apt, pip and git from here on.
    install -d /usr/local/share/ca-certificates/sglang-fl
    find docker/ca-certificates -maxdepth 1 -name '*.crt' -exec cp {} /usr/local/share/ca-certificates/sglang-fl/ \;
    local packages=(ca-certificates curl "$@")
    if [ -n "${FLAGCX_PATH:-}" ]; then
        packages+=(git make g++ nlohmann-json3-dev)  # FlagCX is built from source
    fi
    apt-get update
    apt-get install -y --no-install-recommends "${packages[@]}"
    update-ca-certificates
    rm -rf /var/lib/apt/lists/*
}

install_stack() {  # install_stack PHASE: docker/install_stack.py with this image's settings
    local python args
    python="$(command -v "$SGLANG_FL_PYTHON")" || die "SGLANG_FL_PYTHON=$SGLANG_FL_PYTHON: no such interpreter"
    args=(--platform "$SGLANG_FL_PLATFORM" --python "$python" --phase "$1"
          --sglang="${SGLANG_VERSION:-}" --pip-arg=--no-cache-dir)
    if [ -n "${FLAGCX_PATH:-}" ]; then
        args+=(--flagcx-dir "$FLAGCX_PATH" ${FLAGCX_REPO:+"--flagcx-repo=$FLAGCX_REPO"})
    fi
    if [ "$1" = deps ]; then
        args+=(${VENDOR_INDEX_URL+"--vendor-index-url=$VENDOR_INDEX_URL"})
    fi
    # Through the entrypoint, which sources the vendor scripts first (SGLANG_FL_ENV_SCRIPTS);
    # pip trusts the system store, where docker/ca-certificates/*.crt were added.
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        docker/entrypoint.sh "$python" docker/install_stack.py "${args[@]}"
}

[ -n "${SGLANG_FL_PLATFORM:-}" ] || die "SGLANG_FL_PLATFORM is not set (the Dockerfile's ENV)"
[ -n "${SGLANG_FL_PYTHON:-}" ] || die "SGLANG_FL_PYTHON is not set (the Dockerfile's ENV)"
step="${1:-}"
[ "$#" -gt 0 ] && shift
case "$step" in
    system) system "$@" ;;
    deps) install_stack deps ;;
    plugin)
        install_stack plugin
        install -m 0755 docker/entrypoint.sh /usr/local/bin/sglang-fl-entrypoint
        # The platform YAML, validated at build time by the real Settings loader.
        sglang-fl config
        ;;
    *) die "unknown step '${step}'; accepted: system [PACKAGE...], deps, plugin" ;;
esac
