#!/usr/bin/env bash
# One GPU session, run from the repository root on an offline NVIDIA host: install the bundle
# made by ci/gpu-bundle, then the named stages, writing logs and JSON under $OUT.
#
#   OUT=/tmp/out benchmarks/gpu_session.sh install jit tests ops e2e
#
# In a device call, `export CALL_END=$(( $(date +%s) + 545 ))` first (560-s call): every stage's
# timeout then ends before the call's (see `budget` below).
#
# Stages:
#   install  pip-install wheels/gpu (but the sglang_fl wheel) + this checkout, into the python
#            that holds torch; restores $JIT_CACHE_TGZ (a tarball of TVM_FFI_CACHE_DIR) if given.
#            On a machine where another bundle was installed, first removes what that one added
#            to the image and this one lacks ($BUNDLE_ADDED), so versions can switch warm
#   flagcx   build FlagCX (a source tree at $FLAGCX_SRC, default wheels/flagcx: v0.13.0, made
#            with `git archive`) against torch's NCCL wheel; sets FLAGCX_PATH for later stages
#   jit      pre-build SGLang's JIT CUDA kernels in parallel (benchmarks/jit_prebuild.py)
#   tests    pytest -v tests/gpu (FlagCX cases run when FLAGCX_PATH is set; -v so that a run cut
#            by TESTS_TIMEOUT still names each test and its outcome in gpu-tests.log);
#            PYTEST_ARGS adds arguments (split on spaces), PYTEST_K one -k expression
#   repro    tools/repro_flaggems_rope_race.py: FlagGems' in-place RoPE race, and the cost of
#            sglang-fl's out-of-place workaround -> $OUT/rope-repro.txt, $OUT/rope-timing.json
#   emptymode  uninstall what empty mode lacks (sglang-kernel, flashinfer, with 0.5.11
#            apache-tvm-ffi), then tests/e2e/test_gpu_empty_mode.py (last: it leaves SGLang's own
#            kernels uninstalled; verify serves empty mode in an overlay venv instead)
#   ops      benchmarks/op_bench.py -> $OUT/ops.json
#   model    make the random-weight checkpoint of preset $MODEL_PRESET (default qwen2.5-0.5b) in
#            $MODEL_DIR; MODEL_ARGS adds make-tiny-model options (e.g. --mtp-num-hidden-layers 1
#            --layer-output-share 0.02: a near-bigram main model and an MTP head that drafts its
#            tokens; their agreement -> $OUT/sglang_fl_mtp_agreement.json)
#   e2e      benchmarks/e2e_bench.py -> $OUT/e2e.json (E2E_ARGS adds arguments)
#   tune     sglang-fl tune on $MODEL_DIR's shapes -> $OUT/tuned.yaml (TUNE_ARGS adds arguments)
#   savejit  tar TVM_FFI_CACHE_DIR into $OUT/jit-cache.tgz for the next session
#   doctor   sglang-fl doctor (text and --json) on this install -> $OUT/doctor.txt, doctor.json
#   treecore tools/diagnose_tree_core.py -> $OUT/tree-core.txt (SGLang 0.5.23's Rust TreeCore)
#   profile  benchmarks/step_profile.py --phase decode on $MODEL_DIR (PROFILE_ARGS adds
#            arguments): decode step wall vs GPU time from SGLang's torch-profiler trace, py-spy
#            of the scheduler -> $OUT/profile.log, $OUT/decode-profile-<sglang version>.json
#   prefillprofile  where prefill time goes, FlagGems for every op against SGLang's own kernels
#            (~260 s with the model made and the JIT built): benchmarks/op_bench.py at prefill
#            sizes (eager, graph, eager - graph) -> $OUT/prefill-ops.json, .log;
#            benchmarks/launch_cost.py (one Triton launch by path: sglang-fl's wrapper,
#            JITFunction.run, a bound compiled runner, a CUDA graph) -> $OUT/launch-cost.json; then
#            benchmarks/step_profile.py --phase prefill on $MODEL_DIR (PREFILL_ARGS adds
#            arguments): per forward wall, GPU busy and idle, per kernel GPU, launch, host and
#            idle-gap time, and the launch-bound/kernel-bound verdict -> $OUT/prefill-profile.log,
#            $OUT/prefill-profile-<sglang version>.json; KEEP_TRACES=1 adds the traces as
#            $OUT/prefill-traces.tgz
#   shapes   greedy correctness of Qwen3.6's real shapes (issue 29): for each preset of
#            SHAPES_PRESETS (default "qwen3.6-27b qwen3.6-35b-a3b"; 8 of their layers, random bf16
#            weights; all made at once, on the CPU, in SHAPES_MODEL_ROOT, default /tmp; a later
#            call on the same warm machine reuses them), benchmarks/e2e_bench.py serves SHAPES_CONFIGS
#            (default native-L1off,fl-defaults,flagos-L1off) and judges each one's greedy ids
#            against HF transformers fp32 on the GPU, prompt by prompt: equal, near-tie or DEFECT
#            (sglang_fl/models/hf_reference.py) -> $OUT/shapes-<preset>.json/.log and the HF
#            reference $OUT/hf-reference-<preset>.json (carry it back as SHAPES_REFERENCE_DIR
#            and a later session skips HF: it is keyed by prompt and the seeded model).
#            SHAPES_ARGS adds e2e_bench arguments (default "--repeats 2 --new-tokens 32");
#            SHAPES_TIMEOUT (default 360 s) caps each preset's e2e_bench.
#            With 2+ GPUs the presets run side by side, one per GPU; on one GPU one after
#            another (one preset fits one 540 s call: SHAPES_PRESETS=qwen3.6-27b). Fails when
#            any verdict is DEFECT or a check could not be made. Step durations go to
#            $OUT/shapes-durations.txt, logs to $OUT/shapes-logs.tgz.
#   pack     everything under $OUT but the summaries into $OUT/results.tgz (call last)
#   verify   the whole GPU check of one SGLang bundle inside one device call (at most 540 s on a
#            fresh machine): install; treecore, doctor, the model and the empty-mode overlay
#            (tools/overlay_env.py: a venv that sees the full install but sglang-kernel,
#            flashinfer and, with 0.5.11, apache-tvm-ffi) beside the JIT warm-up (restored from
#            $JIT_CACHE_TGZ when given, else pre-built); then three things share the GPU: the
#            default GPU suite (tests/gpu, xdist, VERIFY_WORKERS), a short e2e smoke (defaults vs
#            SGLang's own kernels where the bundle has them, else vs FlagGems for every op), and,
#            in the overlay, the four empty-mode servers at once (dense, MoE, the tiny and the
#            27B-shaped hybrids; EMPTY_MEM_FRACTION each, default 0.3) with doctor in empty mode.
#            The 27B-shaped checkpoint (minutes of CPU) is written from the start beside the rest
#            (tests/e2e/e2e_support.py MADE_AHEAD, into VERIFY_MODELS, which the empty-mode
#            tests read as SGLANG_FL_TEST_MODELS); only the test that serves it waits for it.
#            Without an overlay, empty mode uninstalls SGLang's kernels after the suite, as
#            before (H200, 2026-12-03: ~555 s in series). Each step's duration and the total go
#            to $OUT/verify-durations.txt. VERIFY_FRESH=1 (default) first removes the JIT and
#            Triton kernel caches, so a call on a warm machine is timed as a fresh one.
#
#   OUT=/tmp/out benchmarks/gpu_session.sh verify                      # SGLang 0.5.11 bundle
#   OUT=/tmp/out BUNDLE=wheels/gpu-0.5.23 benchmarks/gpu_session.sh verify
set -uo pipefail

export OUT=${OUT:-/tmp/gpu-out}  # exported: served tests write failure reasons under it
BUNDLE=${BUNDLE:-wheels/gpu}
MODEL_DIR=${MODEL_DIR:-/tmp/qwen2.5-0.5b-random}
export TVM_FFI_CACHE_DIR=${TVM_FFI_CACHE_DIR:-/tmp/tvm-ffi-cache}
# SGLang 0.5.23 keeps its JIT builds here (0.5.11: under TVM_FFI_CACHE_DIR): one tarball for both.
export SGLANG_JIT_CACHE_DIR=${SGLANG_JIT_CACHE_DIR:-$TVM_FFI_CACHE_DIR/sglang}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PY=${PY:-python3}

log() { echo "== [$(date -u +%H:%M:%S)] $*"; }

#: A device call's deadline in Unix seconds, set by the call script (`export CALL_END=$(( $(date
#: +%s) + 545 ))`). A stage's *_TIMEOUT counts from its own start and cannot know what the
#: stages before it took (install, the checkpoints): on 2026-12-07 a call's shapes stage ran past
#: the call's limit and nothing of it came back. With CALL_END set, every stage's timeout is cut
#: to end PACK_RESERVE s (default 25) before it, and e2e_bench's repeats end JUDGE_RESERVE s
#: (default 60) before that, which leaves its HF check and `pack` their time.
if [[ -n ${CALL_END:-} && ! $CALL_END =~ ^[0-9]+$ ]]; then
  echo "CALL_END must be Unix seconds (as \`date +%s\` prints), got '$CALL_END'" >&2
  exit 2
fi
budget() {  # budget SECONDS: SECONDS, or what CALL_END leaves where that is less
  local want=$1 left
  [[ -n ${CALL_END:-} ]] || { echo "$want"; return; }
  left=$(( CALL_END - $(date +%s) - ${PACK_RESERVE:-25} ))
  if (( left < want )); then
    echo "budget: ${want} s cut to $(( left > 1 ? left : 1 )) s by CALL_END" >&2
    want=$(( left > 1 ? left : 1 ))
  fi
  echo "$want"
}
end_by() {  # e2e_bench's --end-by from CALL_END, into the array END_BY (empty without it)
  END_BY=()
  [[ -n ${CALL_END:-} ]] && END_BY=(--end-by "$(( CALL_END - ${PACK_RESERVE:-25} - ${JUDGE_RESERVE:-60} ))")
  return 0
}

args() { read -ra ARGS <<< "${1:-}"; }  # split an *_ARGS variable into the array ARGS

#: What earlier installs on this machine added to the image (packages absent before them): an
#: install of another bundle removes those it does not carry, so that a warm machine can switch
#: SGLang versions without a new start (0.5.23's xgrammar left behind broke 0.5.11's empty mode).
#: Packages the image had are never removed (transformers needs the image's regex).
BUNDLE_ADDED=${BUNDLE_ADDED:-/tmp/sglang-fl-bundle-added.txt}

normalized() { tr 'A-Z' 'a-z' | tr -- '-.' '__' | sort -u; }  # PEP 503-ish, as wheel names

installed_names() { "$PY" -m pip list --format=freeze 2>/dev/null | sed 's/==.*//; s/ @ .*//' | normalized; }

stage_install() {
  local wheels=() w stale before
  for w in "$BUNDLE"/*.whl; do
    [[ $w == */sglang_fl-* ]] || wheels+=("$w")  # the checkout itself is installed below
  done
  if [[ -f $BUNDLE_ADDED ]]; then
    stale=$(comm -23 <(normalized < "$BUNDLE_ADDED") \
      <(for w in "$BUNDLE"/*.whl; do basename "$w" | cut -d- -f1; done | normalized))
    if [[ -n $stale ]]; then
      log "install: removing what an earlier bundle added and $BUNDLE lacks:" $stale
      # shellcheck disable=SC2086  # one name per word
      "$PY" -m pip uninstall -q -y $stale 2>/dev/null
    fi
  fi
  before=$(installed_names)
  log "install: ${#wheels[@]} wheels from $BUNDLE + this checkout"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "${wheels[@]}" || return 1
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir . || return 1
  # Added now, plus what earlier installs added that is still there.
  { comm -13 <(echo "$before") <(installed_names)
    if [[ -f $BUNDLE_ADDED ]]; then comm -12 <(normalized < "$BUNDLE_ADDED") <(installed_names); fi
  } | sort -u > "$BUNDLE_ADDED.new" && mv "$BUNDLE_ADDED.new" "$BUNDLE_ADDED"
  if ! ls "$BUNDLE"/sglang_kernel-*.whl >/dev/null 2>&1; then
    # A bundle without SGLang's kernels (ci/gpu-bundle --sglang 0.5.23): empty mode with
    # FlagGems; a sglang-kernel left by an earlier install would not match this SGLang.
    "$PY" -m pip uninstall -q -y sglang-kernel 2>/dev/null || true
  fi
  if [[ -n "${JIT_CACHE_TGZ:-}" && -f "$JIT_CACHE_TGZ" ]]; then
    mkdir -p "$TVM_FFI_CACHE_DIR" && tar -xzf "$JIT_CACHE_TGZ" -C "$TVM_FFI_CACHE_DIR"
    log "restored JIT cache from $JIT_CACHE_TGZ"
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  "$PY" - <<'EOF'
import importlib.metadata as md, torch
def version(p):
    try:
        return md.version(p)
    except md.PackageNotFoundError:
        return None
print({p: version(p) for p in ("torch", "triton", "sglang", "flag_gems", "sglang-kernel",
                               "apache-tvm-ffi", "xgrammar", "transformers", "sglang_fl")})
print("cuda", torch.version.cuda, torch.cuda.get_device_name())
import sglang_fl.compat as c; c.activate()
import sgl_kernel, sgl_kernel.elementwise as e
print("sgl_kernel", getattr(sgl_kernel, "__file__", "(stand-in)"), "flashinfer routing:", getattr(e, "_has_flashinfer", None),
      "stand-ins:", c.state.standins)
EOF
}

stage_flagcx() {
  local src=${FLAGCX_SRC:-wheels/flagcx} nccl
  nccl=$("$PY" -c "import nvidia.nccl as m; print(list(m.__path__)[0])") || return 1
  log "flagcx: build $src (NCCL $nccl)"
  (cd "$src" && LIBRARY_PATH=/usr/local/cuda/lib64/stubs make -j16 USE_NVIDIA=1 \
     CCL_HOME="$nccl" CCL_LINK=-l:libnccl.so.2) > "$OUT/flagcx-build.log" 2>&1 \
    || { tail -n 30 "$OUT/flagcx-build.log"; return 1; }
  FLAGCX_PATH=$(cd "$src" && pwd)
  export FLAGCX_PATH
  ls -la "$FLAGCX_PATH/build/lib/libflagcx.so"
}

stage_repro() {
  log "FlagGems RoPE race reproducer"
  timeout 120 "$PY" tools/repro_flaggems_rope_race.py --iters 300 2>&1 | tee "$OUT/rope-repro.txt"
  timeout 120 "$PY" tools/repro_flaggems_rope_race.py --timing --dtype bfloat16 > "$OUT/rope-timing.json"
  tail -n 40 "$OUT/rope-timing.json"
}

empty_drop() {
  # What empty mode lacks: SGLang's own kernels and flashinfer. SGLang 0.5.23's OpenAI server
  # imports xgrammar, which needs apache-tvm-ffi: its empty mode keeps that package (the bundle
  # has no sglang-kernel); 0.5.11's runs without it.
  echo sglang-kernel sgl-kernel flashinfer-python
  ls "$BUNDLE"/sglang_kernel-*.whl >/dev/null 2>&1 && echo apache-tvm-ffi
  return 0
}

empty_uninstall() {
  local drop
  read -ra drop <<< "$(empty_drop | tr '\n' ' ')"
  log "empty mode: uninstall ${drop[*]}"
  "$PY" -m pip uninstall -q -y "${drop[@]}" 2>/dev/null
  return 0
}

empty_overlay() {
  # Empty mode beside the full install: a virtual environment that sees every package of it
  # but those empty mode lacks (tools/overlay_env.py); prints its python once that python has
  # imported the serving stack and seen the GPU (else verify falls back to uninstalling).
  local drop py
  read -ra drop <<< "$(empty_drop | tr '\n' ' ')"
  py=$("$PY" tools/overlay_env.py "${EMPTY_OVERLAY:-/tmp/sglang-fl-empty}" --without "${drop[@]}" \
    | tail -n 1) || return 1
  "$py" -c "import torch, sglang, sglang_fl, flag_gems
assert torch.cuda.is_available(), 'no CUDA device seen from the overlay'" || return 1
  echo "$py"
}

empty_servers() {
  # The four servers at once (EMPTY_WORKERS, pytest-xdist): the GPU holds them all.
  log "empty mode: the served GPU tests ($PY)"
  # A test waiting for a checkpoint written ahead gives up (naming it) before the timeout kills.
  SGLANG_FL_TEST_AHEAD_WAIT=${SGLANG_FL_TEST_AHEAD_WAIT:-$(( ${EMPTY_TIMEOUT:-300} - 60 ))} \
  timeout "$(budget "${EMPTY_TIMEOUT:-300}")" "$PY" -m pytest tests/e2e/test_gpu_empty_mode.py -q \
    -n "${EMPTY_WORKERS:-4}" -p no:cacheprovider -o addopts="-rfEs" --durations=8 2>&1 \
    | tee "$OUT/gpu-empty-mode.log" | tail -n 40
}

stage_emptymode() { empty_uninstall && empty_servers; }

stage_jit() {
  log "jit prebuild"
  args "${JIT_ARGS:-}"
  timeout 400 "$PY" benchmarks/jit_prebuild.py --jobs 12 "${ARGS[@]}"
}

stage_tests() {
  log "tests/gpu"
  args "${PYTEST_ARGS:-}"
  # PYTEST_K: one -k expression with spaces ("a or b"), which PYTEST_ARGS would split.
  [[ -n ${PYTEST_K:-} ]] && ARGS+=(-k "$PYTEST_K")
  timeout "$(budget "${TESTS_TIMEOUT:-420}")" "$PY" -m pytest tests/gpu -m gpu -v -p no:cacheprovider \
    -o addopts="-rfEs" --junitxml="$OUT/gpu-tests.xml" "${ARGS[@]}" 2>&1 | tee "$OUT/gpu-tests.log" | tail -n 60
}

stage_ops() {
  log "op benchmark"
  args "${OPS_ARGS:-}"
  timeout "$(budget "${OPS_TIMEOUT:-300}")" "$PY" benchmarks/op_bench.py --out "$OUT/ops.json" --replays 5 "${ARGS[@]}" \
    2>&1 | tee "$OUT/ops.log" | tail -n 60
}

stage_model() {
  log "model -> $MODEL_DIR"
  args "${MODEL_ARGS:-}"
  "$PY" -m sglang_fl.cli make-tiny-model "$MODEL_DIR" --preset "${MODEL_PRESET:-qwen2.5-0.5b}" "${ARGS[@]}"
  # --layer-output-share with an MTP head: how often its drafts are the main model's tokens
  [ -f "$MODEL_DIR/sglang_fl_mtp_agreement.json" ] && cp "$MODEL_DIR/sglang_fl_mtp_agreement.json" "$OUT/" \
    && cat "$MODEL_DIR/sglang_fl_mtp_agreement.json"
  return 0
}

stage_e2e() {
  log "e2e benchmark"
  args "${E2E_ARGS:-}"
  end_by
  timeout "$(budget "${E2E_TIMEOUT:-480}")" "$PY" benchmarks/e2e_bench.py --model "$MODEL_DIR" --out "$OUT/e2e.json" \
    --log-dir /tmp/e2e-logs "${END_BY[@]}" "${ARGS[@]}" 2>&1 | tee "$OUT/e2e.log" | tail -n 60
  local rc=$?  # e2e_bench's status (pipefail), which the tarball after it must not replace
  # A --reprobe serves nothing and leaves no log folder (2026-12-07c: the stage said rc=2, tar's).
  [[ ! -d /tmp/e2e-logs ]] || tar -czf "$OUT/e2e-logs.tgz" -C /tmp e2e-logs
  return "$rc"
}

stage_tune() {
  log "sglang-fl tune on $MODEL_DIR"
  args "${TUNE_ARGS:-}"
  timeout "$(budget "${TUNE_TIMEOUT:-300}")" "$PY" -m sglang_fl.cli tune --model "$MODEL_DIR" \
    --out "$OUT/tuned.yaml" "${ARGS[@]}" 2>&1 | tee "$OUT/tune.log" | tail -n 40
}

stage_savejit() {
  tar -czf "$OUT/jit-cache.tgz" -C "$TVM_FFI_CACHE_DIR" . && ls -la "$OUT/jit-cache.tgz"
}

stage_doctor() {  # stage_doctor [TAG]: sglang-fl doctor on this install -> doctor[TAG].txt/.json
  local tag=${1:-} rc=0
  "$PY" -m sglang_fl.cli doctor > "$OUT/doctor$tag.txt" 2>&1 || rc=$?
  "$PY" -m sglang_fl.cli doctor --json > "$OUT/doctor$tag.json" 2> /dev/null
  log "doctor$tag: exit $rc (0 ok, 1 warnings, 2 cannot serve)"
  tail -n 4 "$OUT/doctor$tag.txt"
  [[ $rc -lt 2 ]]
}

timed() {  # timed NAME CMD...: run, append "NAME seconds rc" to $DURATIONS
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "$name $((SECONDS - t0)) s rc=$rc" | tee -a "${DURATIONS:-$OUT/verify-durations.txt}"
  return $rc
}

stage_treecore() {  # SGLang 0.5.23's Rust TreeCore under this torch: which tensor, which kind
  timeout 120 "$PY" tools/diagnose_tree_core.py 2>&1 | grep -v -i "warn" | tee "$OUT/tree-core.txt"
}

stage_profile() {
  log "decode profile (torch profiler trace + py-spy) on $MODEL_DIR"
  args "${PROFILE_ARGS:-}"
  timeout "$(budget "${PROFILE_TIMEOUT:-400}")" "$PY" benchmarks/step_profile.py --phase decode \
    --model "$MODEL_DIR" --out /tmp/decode-profile "${ARGS[@]}" 2>&1 | tee "$OUT/profile.log" \
    | tail -n 30
  local rc=$?  # step_profile's status (pipefail): the copies below must not replace it
  cp /tmp/decode-profile/decode-profile.json "$OUT/decode-profile-$(sglang_version).json" 2>/dev/null
  mkdir -p "$OUT/pyspy-$(sglang_version)" && cp /tmp/decode-profile/pyspy-*.txt "$OUT/pyspy-$(sglang_version)/" 2>/dev/null
  return "$rc"
}

stage_prefillprofile() {
  log "prefill profile: op_bench at prefill sizes, the launch cost by path, then step_profile --phase prefill on $MODEL_DIR"
  timeout "$(budget "${PREFILL_OPS_TIMEOUT:-75}")" "$PY" benchmarks/op_bench.py --backends flagos,vendor.cuda \
    --ops rms_norm,fused_add_rms_norm,rotary_embedding,silu_and_mul --tokens 512,2048,4096,16384 \
    --replays 5 --out "$OUT/prefill-ops.json" 2>&1 | tee "$OUT/prefill-ops.log" | tail -n 40
  timeout "$(budget "${LAUNCH_COST_TIMEOUT:-60}")" "$PY" benchmarks/launch_cost.py --out "$OUT/launch-cost.json" 2>&1 \
    | tee "$OUT/launch-cost.log" | tail -n 8
  args "${PREFILL_ARGS:-}"
  rm -rf /tmp/prefill-profile
  timeout "$(budget "${PREFILL_TIMEOUT:-170}")" "$PY" benchmarks/step_profile.py --phase prefill \
    --model "$MODEL_DIR" --out /tmp/prefill-profile "${ARGS[@]}" 2>&1 \
    | tee "$OUT/prefill-profile.log" | tail -n 45
  cp /tmp/prefill-profile/prefill-profile.json "$OUT/prefill-profile-$(sglang_version).json" 2>/dev/null
  if [[ ${KEEP_TRACES:-0} == 1 ]]; then
    tar -czf "$OUT/prefill-traces.tgz" -C /tmp/prefill-profile . && ls -la "$OUT/prefill-traces.tgz"
  fi
}

stage_shapes() {
  local presets configs p i=0 rc=0 gpus pid pids=() logs=${SHAPES_LOGS:-/tmp/shapes-logs} t0=$SECONDS
  local root=${SHAPES_MODEL_ROOT:-/tmp}  # checkpoints: ROOT/shapes-PRESET
  read -ra presets <<< "${SHAPES_PRESETS:-qwen3.6-27b qwen3.6-35b-a3b}"
  configs=${SHAPES_CONFIGS:-native-L1off,fl-defaults,flagos-L1off}
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  export DURATIONS=$OUT/shapes-durations.txt
  rm -rf "$logs" && mkdir -p "$logs"
  log "shapes: ${presets[*]} on $gpus GPU(s); the checkpoints are made at once (CPU)"
  for p in "${presets[@]}"; do  # each leaves its exit code in model-PRESET.rc
    if [[ -f $root/shapes-$p/.made ]]; then  # made by an earlier call on this warm machine
      log "shapes: $root/shapes-$p kept from an earlier call (the preset's seeded checkpoint)"
      echo 0 > "$logs/model-$p.rc"
      continue
    fi
    (rc=0; MODEL_PRESET=$p MODEL_DIR=$root/shapes-$p MODEL_ARGS='' timed "model-$p" stage_model \
       > "$logs/model-$p.log" 2>&1 || rc=$?; echo $rc > "$logs/model-$p.rc"
     if [[ $rc == 0 ]]; then touch "$root/shapes-$p/.made" 2>/dev/null || true; fi) &
  done
  shapes_one() {  # shapes_one PRESET [GPU]: once its checkpoint is made, serve and judge it
    local p=$1 ref=$OUT/hf-reference-$1.json args dev=()
    until [[ -f $logs/model-$p.rc ]]; do sleep 2; done
    [[ $(cat "$logs/model-$p.rc") == 0 ]] || { tail -n 20 "$logs/model-$p.log"; return 1; }
    if [[ -n ${SHAPES_REFERENCE_DIR:-} && -f $SHAPES_REFERENCE_DIR/hf-reference-$p.json ]]; then
      cp "$SHAPES_REFERENCE_DIR/hf-reference-$p.json" "$ref"  # HF's reference of an earlier session
    fi
    read -ra args <<< "${SHAPES_ARGS:---repeats 2 --new-tokens 32}"
    [[ -n ${2:-} ]] && dev=(env "CUDA_VISIBLE_DEVICES=$2")
    end_by
    timed "e2e-$p" "${dev[@]}" timeout "$(budget "${SHAPES_TIMEOUT:-360}")" "$PY" benchmarks/e2e_bench.py \
      --model "$root/shapes-$p" --configs "$configs" --out "$OUT/shapes-$p.json" \
      --log-dir "$logs/$p" --hf-reference "$ref" "${END_BY[@]}" "${args[@]}" > "$OUT/shapes-$p.log" 2>&1
  }
  for p in "${presets[@]}"; do
    if (( gpus >= 2 )); then  # one preset per GPU, side by side
      shapes_one "$p" "$((i % gpus))" & pids+=($!)
      i=$((i + 1))
    else
      shapes_one "$p" || rc=1
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  wait  # the checkpoints still being made, if a run stopped early
  for p in "${presets[@]}"; do
    log "shapes $p:"; tail -n 25 "$OUT/shapes-$p.log" 2>/dev/null
  done
  echo "total $((SECONDS - t0)) s rc=$rc" | tee -a "$DURATIONS"
  tar -czf "$OUT/shapes-logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")" 2>/dev/null
  unset DURATIONS
  return $rc
}

stage_pack() {  # the device tool returns 8 files: everything but the summaries as results.tgz
  # An e2e_bench signalled by a timeout around the whole call stops its servers and then writes
  # its JSON (benchmarks/e2e_bench.py): give it up to $PACK_WAIT s (the pattern's brackets keep
  # this grep from finding itself).
  local waited=0
  while grep -qsa 'benchmarks/e2e_benc[h][.]py' /proc/[0-9]*/cmdline && ((waited < ${PACK_WAIT:-12})); do
    sleep 1
    waited=$((waited + 1))
  done
  ((waited)) && echo "pack: waited ${waited}s for e2e_bench to write its results"
  (cd "$OUT" && tar -czf /tmp/results.tgz --exclude=jit-cache.tgz -- * && find . -mindepth 1 \
     -not -name verify-durations.txt -not -name tree-core.txt -not -name 'doctor*.txt' \
     -not -name profile.log -not -name prefill-profile.log -delete && mv /tmp/results.tgz . && ls -la)
}

sglang_version() { "$PY" -c "import importlib.metadata as m; print(m.version('sglang'))"; }

stage_verify() {
  # The whole check of one bundle within one device call (at most 540 s on a fresh machine):
  # steps that use different resources run side by side (doctor and model: CPU and disk, JIT:
  # nvcc; then the GPU suite, a short served smoke and the four empty-mode servers at once).
  local t0=$SECONDS models=${VERIFY_MODELS:-/tmp/sglang-fl-verify-models}
  : > "$OUT/verify-durations.txt"
  if [[ ${VERIFY_FRESH:-1} == 1 ]]; then  # time it as a fresh machine: no caches, no checkpoints
    rm -rf "$TVM_FFI_CACHE_DIR" "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" "${FLAGGEMS_CACHE_DIR:-$HOME/.flaggems}" \
      /tmp/decode-profile /tmp/prefill-profile /tmp/e2e-logs "$models"
  fi
  timed install stage_install || return 1
  (timed treecore stage_treecore > /dev/null) &
  local treecore=$!
  (timed doctor stage_doctor > "$OUT/doctor-stage.log" 2>&1) &
  local doctor=$!
  (MODEL_PRESET=qwen2.5-0.5b timed model stage_model > "$OUT/model.log" 2>&1) &
  local model=$!
  (timed overlay empty_overlay > "$OUT/overlay.log" 2>&1) &
  local overlay=$!
  # The empty-mode tests' big checkpoint (Qwen3.6-27B's layers: minutes of CPU), written now.
  # Only the test that serves it waits for it (the folder holds `.writing` until the writer
  # ends; where it failed, that test writes its own). One already there whole is reused.
  mkdir -p "$models"; touch "$models/.writing"
  (timed models-ahead "$PY" tests/e2e/e2e_support.py "$models" > "$OUT/models-ahead.log" 2>&1 \
     || rm -f "$models/.writing") &
  if [[ -n "${JIT_CACHE_TGZ:-}" && -f "$JIT_CACHE_TGZ" ]]; then
    log "JIT cache restored by install: no prebuild"
  else
    JIT_ARGS=${JIT_ARGS:-} timed jit stage_jit
  fi
  wait "$doctor" "$model" "$treecore"; cat "$OUT/doctor-stage.log"
  local configs=fl-defaults,native-L1off empty_py='' smoke empty
  "$PY" -c "import importlib.metadata as m; m.version('sglang-kernel')" 2>/dev/null \
    || configs=fl-defaults,flagos-L1off  # no SGLang kernels in this bundle (0.5.23: empty mode)
  wait "$overlay" && empty_py=$(grep '/bin/python$' "$OUT/overlay.log" | tail -n 1)
  [[ -x $empty_py ]] || { log "no empty-mode overlay (see below): empty mode after the suite"
                          cat "$OUT/overlay.log"; empty_py=''; }
  # From here three things share the GPU. The smoke serves on the full install: a smoke, not a
  # measurement (e2e and ops stages are).
  (E2E_TIMEOUT=${SMOKE_TIMEOUT:-260} E2E_ARGS="--configs $configs --repeats 3 --new-tokens 32 \
     --mem-fraction 0.1" timed smoke stage_e2e > "$OUT/smoke.log" 2>&1) &
  smoke=$!
  if [[ -n $empty_py ]]; then
    # The four empty-mode servers and doctor in empty mode, in the overlay (no SGLang kernels),
    # beside the suite on the full install; the suite and the smoke allocate while they load,
    # so each server's margin is larger than when they have the GPU to themselves.
    (PY=$empty_py timed doctor-empty stage_doctor -empty > "$OUT/doctor-empty-stage.log" 2>&1) &
    (PY=$empty_py SGLANG_FL_TEST_MODELS=$models SGLANG_FL_TEST_MEM_FRACTION=${EMPTY_MEM_FRACTION:-0.3} \
       EMPTY_TIMEOUT=${EMPTY_TIMEOUT:-420} timed emptymode empty_servers > "$OUT/empty-stage.log" 2>&1) &
    empty=$!
  fi
  PYTEST_ARGS="-n ${VERIFY_WORKERS:-10} --durations=25 ${PYTEST_ARGS:-}" \
    TESTS_TIMEOUT=${TESTS_TIMEOUT:-360} timed tests stage_tests
  wait "$smoke"; tail -n 25 "$OUT/smoke.log"
  if [[ -n $empty_py ]]; then
    wait "$empty"; tail -n 40 "$OUT/empty-stage.log"
  else  # the old way: uninstall SGLang's kernels from the full install, then serve
    empty_uninstall
    (timed doctor-empty stage_doctor -empty > "$OUT/doctor-empty-stage.log" 2>&1) &
    SGLANG_FL_TEST_MODELS=$models EMPTY_TIMEOUT=${EMPTY_TIMEOUT:-240} timed emptymode empty_servers
  fi
  wait; cat "$OUT/doctor-empty-stage.log"
  timed savejit stage_savejit > /dev/null
  echo "total $((SECONDS - t0)) s" | tee -a "$OUT/verify-durations.txt"
  # The device tool returns 8 files: the rest of the logs go back as one tarball.
  (cd "$OUT" && tar -czf verify-logs.tgz --exclude=jit-cache.tgz --exclude=verify-logs.tgz -- * \
     && rm -f gpu-tests.xml e2e.log e2e-logs.tgz smoke.log model.log doctor-stage.log \
       doctor-empty-stage.log empty-stage.log overlay.log models-ahead.log)
  cat "$OUT/verify-durations.txt"
}

for stage in "$@"; do
  "stage_$stage" || log "stage $stage FAILED (rc=$?)"
done
log "done"
