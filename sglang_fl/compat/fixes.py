"""Fixes of SGLang bugs that no plugin API reaches, applied right after the SGLang module runs.

Unlike the empty-mode entries of the ledger, these apply whether or not stand-ins are in use:
they fix SGLang itself, on every chip. Each one checks that what it wraps still exists and
raises, naming this file, when it does not, so a new SGLang version cannot drop it silently.

``request_state_leak`` (SGLang 0.5.11): ``TokenizerManager.generate_request`` registers a
request state per rid (``_init_req_state``) before it tokenizes and validates the request, and
only the scheduler's answer removes a state. A request rejected before it reaches the scheduler
(``max_new_tokens < 0``, ``temperature < 0``, a prompt over the context length, a duplicate rid)
therefore leaves its states behind, and so does every ``n > 1`` request: the batch it is
expanded to registers ``batch * n`` rids, of which ``_handle_batch_request`` removes ``batch``.
SGLang's SIGTERM drain (``sigterm_watchdog``) waits for ``rid_to_state`` to empty, i.e. forever.
The wrapper drops, when the request's generator ends, the states that this request registered
and that were never dispatched to the scheduler (their ``api_server_dispatch_time`` is unset).
A dispatched state is left alone: the scheduler's answer (or an abort) still needs it.

``grammar_mask_device`` (every SGLang version): the xgrammar backend applies a request's
grammar mask (JSON schema, regex, EBNF) only on the device types it lists and raises
``Unsupported device`` on any other, inside the scheduler, which kills the server on the first
constrained request. Which types SGLang lists is the adapter's ``GRAMMAR_MASK_DEVICES`` (0.5.11
lacks ``cpu``; a new vendor's device type is never listed). The wrapper applies the mask in
torch on the other device types and leaves SGLang's kernels to the listed ones.

``sigterm_exit_status`` (SGLang 0.5.11; the adapter's ``SIGTERM_STOP_KILLS_ITSELF``): a clean
stop (SIGTERM, requests drained) ends in ``sigterm_watchdog`` with
``kill_process_tree(os.getpid(), include_parent=True)``, which SIGKILLs the children and then
launch_server itself, so the process exits with status -9 (``docker stop``: 137, a scaled-down
Kubernetes pod: Error) although nothing failed. The wrapper marks the drain (a context variable
set by ``sigterm_watchdog``); the module's ``kill_process_tree``, called from within it for the
process itself, stops the children as SGLang does and then exits with status 0. Every other
call keeps SGLang's behaviour, so a crash (a child's SIGQUIT, a failed health check during the
drain) still ends with SIGKILL and a non-zero status. 0.5.23 already ends its drain with
``sys.exit(0)`` (or its server's stop hook) after stopping the children only.

``rust_tree_core`` (SGLang 0.5.23; the adapter's ``TREE_CORE_REGISTRY``): the radix cache runs on
a Rust TreeCore by default, an extension in the wheel compiled against the torch SGLang pins
(2.14.1). SGLang's own gate only checks that torch is within 2.11-2.14, the range a source
build supports, so under another torch release the prebuilt extension reads tensors through
the wrong C++ layouts: on the H200 image (torch 2.11) every server died on its first prefill
(``Rust TreeCore panicked: ... UnknownKind(19)``). The wrapper around
``resolve_tree_core_backend`` checks the Rust core once per process (a one-key insert, the call
that panicked: `SGLangAdapter.rust_tree_core_problem`) where SGLang would pick it by default,
and picks SGLang's Python TreeCore when that fails, with one warning naming why. A TreeCore the
user named (``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, or a cache's own override) is kept.
``sglang-fl doctor`` shows the same decision. Remove when SGLang checks the ABI of its
prebuilt extension itself.

``http_port_in_use`` (every SGLang version): SGLang binds its HTTP port only after the model
loaded, inside uvicorn's start-up, which first runs SGLang's lifespan; that starts the warm-up
thread. When the bind fails (another process took the port), uvicorn shuts the lifespan down,
whose ``finally`` joins the warm-up thread, and that thread polls ``/model_info`` on the taken
port 120 times (1 s apart, each up to 5 s) before it kills the process tree: the server sits
for up to 12 minutes with no sign but one uvicorn error line (seen on CPU, 2026-12-06; a CI run
timed out on it). Two checks, both with `sglang_fl.preflight.port_in_use`: ``launch_server``
refuses a taken ``--host``/``--port`` before anything starts (`check_http_port`); uvicorn's
``Server.startup`` of SGLang's app, just before the lifespan, ends the process at once with one
error (the children stopped, status 1) when the port was taken while the model loaded. Only a
port taken during the lifespan's own start-up (under a second), between that check and
uvicorn's bind, is left to SGLang's behaviour.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import sys

from sglang_fl.preflight import check_http_port, port_in_use

logger = logging.getLogger("sglang_fl.compat")

FIXED_MARK = "__sglang_fl_fix__"

applied: list[str] = []


def _drop_undispatched_states(rid_to_state: dict, obj) -> None:
    """Remove the states of ``obj``'s rids that belong to ``obj`` and never left this process."""
    rids = obj.rid if isinstance(obj.rid, list) else [obj.rid]
    # _init_req_state stores obj itself (one request) or obj[i], which obj caches (a batch).
    # Matching by identity keeps another request's state with the same rid (a duplicate).
    own = {id(obj), *(id(sub) for sub in vars(obj).get("_sub_obj_cache", {}).values())}
    for rid in rids:
        state = rid_to_state.get(rid)
        if (state is not None and id(state.obj) in own
                and not state.time_stats.api_server_dispatch_time):
            del rid_to_state[rid]


def tokenizer_manager_module() -> str:
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().MODULES["tokenizer_manager"]


def _check_targets(module) -> type:
    from sglang_fl.sglang_glue.adapters import get_adapter

    APIServerReqTimeStats = get_adapter().request_time_stats_class()  # noqa: N806
    manager = getattr(module, "TokenizerManager", None)
    missing = [name for name, ok in (
        ("TokenizerManager.generate_request (async generator)",
         manager is not None and inspect.isasyncgenfunction(getattr(manager, "generate_request", None))),
        ("TokenizerManager._init_req_state", hasattr(manager, "_init_req_state")),
        ("APIServerReqTimeStats.api_server_dispatch_time",
         hasattr(APIServerReqTimeStats, "api_server_dispatch_time")),
    ) if not ok]
    if missing:
        raise RuntimeError(
            f"sglang-fl fix request_state_leak: {', '.join(missing)} no longer exists in this SGLang "
            f"version; check whether the leak is fixed upstream and update sglang_fl/compat/fixes.py"
        )
    return manager


def fix_request_state_leak(module) -> None:
    """``after`` hook of SGLang's tokenizer_manager module (idempotent)."""
    manager = _check_targets(module)
    original = manager.generate_request
    if getattr(original, FIXED_MARK, False):
        return

    @functools.wraps(original)
    async def generate_request(self, obj, request=None):
        responses = original(self, obj, request)
        try:
            async for response in responses:
                yield response
        finally:
            try:
                await responses.aclose()
            finally:
                _drop_undispatched_states(self.rid_to_state, obj)

    setattr(generate_request, FIXED_MARK, True)
    manager.generate_request = generate_request
    applied.append("request_state_leak")
    logger.debug("fix: %s.TokenizerManager.generate_request drops undispatched request states",
                 module.__name__)


def apply_token_bitmask_torch(logits, bitmask) -> None:
    """In place: ``-inf`` on every token whose bit is 0 in xgrammar's packed bitmask (int32
    words, token ``t`` is bit ``t % 32`` of word ``t // 32``, one row per row of ``logits``).
    As xgrammar's kernels, only the tokens both cover are touched (a padded LM head's extra
    logits are left alone). Any device: plain tensor ops."""
    import torch

    vocab = min(logits.shape[-1], bitmask.shape[-1] * 32)
    tokens = torch.arange(vocab, device=bitmask.device)
    words = bitmask[..., tokens // 32].to(torch.int64)  # int64: bit 31 is a sign bit in int32
    allowed = ((words >> (tokens % 32)) & 1).bool().to(logits.device)
    logits[..., :vocab].masked_fill_(~allowed, float("-inf"))


def xgrammar_backend_module() -> str:
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().MODULES["xgrammar_backend"]


def fix_grammar_mask_device(module) -> None:
    """``after`` hook of SGLang's xgrammar backend module (idempotent)."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    grammar = getattr(module, "XGrammarGrammar", None)
    original = getattr(grammar, "apply_vocab_mask", None)
    if original is None:
        raise RuntimeError(
            f"sglang-fl fix grammar_mask_device: {module.__name__}.XGrammarGrammar.apply_vocab_mask "
            f"no longer exists in this SGLang version; update sglang_fl/compat/fixes.py")
    if getattr(original, FIXED_MARK, False):
        return
    handled = frozenset(get_adapter().GRAMMAR_MASK_DEVICES)

    @functools.wraps(original)
    def apply_vocab_mask(self, logits, vocab_mask):
        if logits.device.type in handled:
            return original(self, logits, vocab_mask)
        return apply_token_bitmask_torch(logits, vocab_mask)

    setattr(apply_vocab_mask, FIXED_MARK, True)
    grammar.apply_vocab_mask = apply_vocab_mask
    applied.append("grammar_mask_device")
    logger.debug("fix: %s.XGrammarGrammar.apply_vocab_mask applies masks in torch outside %s",
                 module.__name__, sorted(handled))


def _exit_now(status: int) -> None:
    """Flush the logs and leave at once with ``status``: no atexit handler, no join of a
    thread or child (what the callers' SGLang paths would wait on)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


#: The tokenizer manager whose SIGTERM drain is running in this task (``sigterm_exit_status``).
_draining = contextvars.ContextVar("sglang_fl_sigterm_drain", default=None)


def fix_sigterm_exit_status(module) -> None:
    """``after`` hook of SGLang's tokenizer_manager module (idempotent; only where the adapter
    says this version's clean stop SIGKILLs itself)."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    if not get_adapter().SIGTERM_STOP_KILLS_ITSELF:
        return
    manager = getattr(module, "TokenizerManager", None)
    watchdog = getattr(manager, "sigterm_watchdog", None)
    kill = getattr(module, "kill_process_tree", None)
    status = getattr(module, "ServerStatus", None)
    if not inspect.iscoroutinefunction(watchdog) or kill is None or status is None:
        raise RuntimeError(
            f"sglang-fl fix sigterm_exit_status: {module.__name__}.TokenizerManager."
            "sigterm_watchdog (coroutine), kill_process_tree or ServerStatus no longer exists in "
            "this SGLang version; check how its clean stop exits and update "
            "sglang_fl/compat/fixes.py (and the adapter's SIGTERM_STOP_KILLS_ITSELF)")
    if getattr(watchdog, FIXED_MARK, False):
        return

    @functools.wraps(watchdog)
    async def sigterm_watchdog(self):
        token = _draining.set(self)
        try:
            return await watchdog(self)
        finally:
            _draining.reset(token)

    @functools.wraps(kill)
    def kill_process_tree(parent_pid, include_parent=True, *args, **kwargs):
        draining = _draining.get()
        if (draining is None or not include_parent or parent_pid != os.getpid()
                or draining.server_status == status.UnHealthy):
            return kill(parent_pid, include_parent, *args, **kwargs)
        try:
            kill(parent_pid, include_parent=False, wait_timeout=30)
        except RuntimeError as exc:  # a child SIGKILLed but not gone after 30 s
            logger.warning("clean stop: %s", exc)
        logger.info("clean stop: requests drained and children stopped; exiting with status 0 "
                    "(sglang-fl fix sigterm_exit_status)")
        _exit_now(0)

    setattr(sigterm_watchdog, FIXED_MARK, True)
    manager.sigterm_watchdog = sigterm_watchdog
    module.kill_process_tree = kill_process_tree
    applied.append("sigterm_exit_status")
    logger.debug("fix: %s: a clean SIGTERM stop exits with status 0", module.__name__)


def tree_core_decision(selected: str, user_choice: str | None, problem) -> tuple[str, str | None]:
    """(TreeCore to use, why it differs from ``selected``) for SGLang's default choice
    ``selected``; ``problem()`` says why the Rust one cannot serve (None: it can)."""
    if selected != "rust" or user_choice is not None:
        return selected, None
    reason = problem()
    return ("rust", None) if reason is None else ("python", reason)


def fix_rust_tree_core(module) -> None:
    """``after`` hook of SGLang's TreeCore registry module (idempotent)."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    original = getattr(module, "resolve_tree_core_backend", None)
    if original is None:
        raise RuntimeError(
            f"sglang-fl fix rust_tree_core: {module.__name__}.resolve_tree_core_backend no longer "
            "exists in this SGLang version; check how it picks its TreeCore and update "
            "sglang_fl/compat/fixes.py (and the adapter's TREE_CORE_REGISTRY)")
    if getattr(original, FIXED_MARK, False):
        return
    adapter = get_adapter()
    problem = functools.cache(lambda device: adapter.rust_tree_core_problem(device))
    warned = []

    @functools.wraps(original)
    def resolve_tree_core_backend(name, params):
        selected = original(name, params)
        if getattr(params, "tree_core_backend", None) is not None:  # the cache's own choice
            return selected
        allocator = getattr(params, "token_to_kv_pool_allocator", None)
        device = str(getattr(allocator, "device", None) or "cpu")
        backend, reason = tree_core_decision(selected, adapter.tree_core_user_choice(),
                                             lambda: problem(device))
        if reason is not None and not warned:
            warned.append(reason)
            logger.warning("radix cache: using SGLang's Python TreeCore, because the Rust TreeCore's "
                           "%s (sglang-fl fix rust_tree_core; %s=rust keeps the Rust one)",
                           reason, adapter.TREE_CORE_ENV)
        return backend

    setattr(resolve_tree_core_backend, FIXED_MARK, True)
    module.resolve_tree_core_backend = resolve_tree_core_backend
    applied.append("rust_tree_core")
    logger.debug("fix: %s.resolve_tree_core_backend checks the Rust TreeCore before using it",
                 module.__name__)


def http_server_module() -> str:
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().MODULES["http_server"]


def _exit_port_taken(host: str, port: int, problem: str, kill) -> None:
    logger.error("cannot serve HTTP on --host %s --port %s: %s, taken by another process while "
                 "the model loaded; stopping now instead of in SGLang's warm-up, up to 12 "
                 "minutes later (sglang-fl fix http_port_in_use). Pass a free --port",
                 host, port, problem)
    try:
        kill(os.getpid(), include_parent=False)
    except Exception as exc:  # noqa: BLE001 - exit 1 either way; say why a child may remain
        logger.warning("stopping the children: %s", exc)
    _exit_now(1)


def fix_http_port_in_use(module) -> None:
    """``after`` hook of SGLang's http_server module (idempotent)."""
    import uvicorn

    launch = getattr(module, "launch_server", None)
    kill = getattr(module, "kill_process_tree", None)
    startup = getattr(getattr(uvicorn, "Server", None), "startup", None)
    if not callable(launch) or kill is None or not inspect.iscoroutinefunction(startup):
        raise RuntimeError(
            f"sglang-fl fix http_port_in_use: {module.__name__}.launch_server, "
            f"{module.__name__}.kill_process_tree or uvicorn.Server.startup (coroutine) no longer "
            "exists; check how SGLang binds its HTTP port and update sglang_fl/compat/fixes.py")
    if getattr(launch, FIXED_MARK, False):
        return

    @functools.wraps(launch)
    def launch_server(server_args, *args, **kwargs):
        check_http_port(server_args.host, server_args.port)
        return launch(server_args, *args, **kwargs)

    if not getattr(startup, FIXED_MARK, False):
        @functools.wraps(startup)
        async def checked_startup(self, sockets=None):
            config = self.config
            # SGLang's own app, on a host and port uvicorn binds itself (not a worker of the
            # multi-process mode, which gets its parent's socket, nor a UNIX socket).
            if (config.app is getattr(module, "app", None) and sockets is None
                    and config.fd is None and config.uds is None):
                problem = port_in_use(config.host, config.port)
                if problem:
                    _exit_port_taken(config.host, config.port, problem, kill)
            return await startup(self, sockets)

        setattr(checked_startup, FIXED_MARK, True)
        uvicorn.Server.startup = checked_startup
    setattr(launch_server, FIXED_MARK, True)
    module.launch_server = launch_server
    applied.append("http_port_in_use")
    logger.debug("fix: %s: a taken HTTP port stops the server at once", module.__name__)


def install() -> None:
    from sglang_fl.compat.module_hooks import add_hook
    from sglang_fl.sglang_glue.adapters import get_adapter

    add_hook(tokenizer_manager_module(), after=fix_request_state_leak)
    add_hook(tokenizer_manager_module(), after=fix_sigterm_exit_status)
    add_hook(xgrammar_backend_module(), after=fix_grammar_mask_device)
    add_hook(http_server_module(), after=fix_http_port_in_use)
    registry = get_adapter().TREE_CORE_REGISTRY
    if registry is not None:
        add_hook(registry, after=fix_rust_tree_core)
