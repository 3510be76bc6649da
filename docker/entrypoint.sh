#!/usr/bin/env bash
# Entrypoint of the sglang-fl images.
#
#   IMAGE launch_server ARGS...   -> python -m sglang.launch_server ARGS...
#                                    (adds --host 0.0.0.0 / --port $SGLANG_FL_PORT unless given;
#                                    first checks settings, model path and, on nodes of rank > 0,
#                                    that the leader answers within $SGLANG_FL_LEADER_TIMEOUT s;
#                                    $SGLANG_FL_EXTRA_ARGS, word-split, is appended to ARGS)
#   IMAGE smoke ARGS...           -> python -m sglang_fl.smoke ARGS...
#   IMAGE healthcheck             -> exit 0 iff http://127.0.0.1:<port>/health answers 200
#   IMAGE help                    -> this text
#   IMAGE anything else           -> run as is (sglang-fl config, bash, python ...)
#
# Vendor environment scripts named in SGLANG_FL_ENV_SCRIPTS (e.g. CANN's set_env.sh) are
# sourced first when they exist, so `docker run` needs no shell wrapper.
set -eo pipefail

PYTHON="${SGLANG_FL_PYTHON:-python3}"
PORT_FILE="${SGLANG_FL_PORT_FILE:-/tmp/sglang-fl.port}"

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
}

source_vendor_env() {
    local script
    for script in ${SGLANG_FL_ENV_SCRIPTS:-}; do
        if [ -f "$script" ]; then
            # Vendor scripts are not written for `set -e`: source them without it.
            set +e
            # shellcheck disable=SC1090
            . "$script"
            set -e
        fi
    done
}

has_flag() {  # has_flag --port ARGS...: is --port (or --port=...) among ARGS?
    local flag="$1" arg
    shift
    for arg in "$@"; do
        if [ "$arg" = "$flag" ] || [ "${arg%%=*}" = "$flag" ]; then
            return 0
        fi
    done
    return 1
}

flag_value() {  # flag_value --port ARGS...: the value given to --port, if any
    local flag="$1"
    shift
    while [ "$#" -gt 0 ]; do
        case "$1" in
            "$flag") echo "${2:-}"; return 0 ;;
            "$flag"=*) echo "${1#*=}"; return 0 ;;
        esac
        shift
    done
    return 1
}

cmd="${1:-help}"
case "$cmd" in
    launch_server)
        shift
        source_vendor_env
        if [ -n "${SGLANG_FL_EXTRA_ARGS:-}" ]; then
            # Options a compose file or a Kubernetes manifest adds without editing the command.
            read -r -a more <<< "$SGLANG_FL_EXTRA_ARGS"
            set -- "$@" "${more[@]}"
        fi
        extra=()
        has_flag --host "$@" || extra+=(--host "${SGLANG_FL_HOST:-0.0.0.0}")
        has_flag --port "$@" || extra+=(--port "${SGLANG_FL_PORT:-30000}")
        port="$(flag_value --port "$@" "${extra[@]}")"
        # The HEALTHCHECK runs in a separate process: tell it which port this server uses.
        echo "$port" > "$PORT_FILE" 2>/dev/null || true
        # Fail in seconds, with the reason, on what SGLang would hang on or retry for long.
        "$PYTHON" -m sglang_fl.preflight --leader-timeout "${SGLANG_FL_LEADER_TIMEOUT:-600}" \
            -- "$@" "${extra[@]}" || exit $?
        exec "$PYTHON" -m sglang.launch_server "$@" "${extra[@]}"
        ;;
    smoke)
        shift
        source_vendor_env
        exec "$PYTHON" -m sglang_fl.smoke "$@"
        ;;
    healthcheck)
        port="${SGLANG_FL_PORT:-30000}"
        if [ -s "$PORT_FILE" ]; then
            port="$(cat "$PORT_FILE")"
        fi
        exec "$PYTHON" -c 'import sys, urllib.request
try:
    ok = urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1], timeout=5).status == 200
except Exception as exc:
    print("unhealthy: %s" % exc)
    ok = False
sys.exit(0 if ok else 1)' "$port"
        ;;
    help | --help | -h)
        usage
        ;;
    *)
        source_vendor_env
        exec "$@"
        ;;
esac
