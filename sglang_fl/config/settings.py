"""The one configuration object of sglang-fl.

`Settings` is built once per process from four sources, highest first:
``SGLANG_FL_*`` / FlagGems environment variables > the YAML named by ``SGLANG_FL_CONFIG`` >
the platform YAML (auto-detected or ``SGLANG_FL_PLATFORM``) > code defaults.
Every layer reads this object; nothing else in the package parses ``os.environ`` for these
names. Each value remembers its origin so ``sglang-fl config`` can show it.

All fields are declared once in ``FIELDS``: the env variable, the YAML key, the parser and the
default live side by side, so adding an option is one entry.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

# Layer-2 op names and the SGLang classes that can be routed (by class name, as users type
# them) come from the op table.
from sglang_fl.dispatch.discovery import OPT_IN_VENDORS
from sglang_fl.dispatch.ops import OP_NAMES, ROUTED_CLASSES, did_you_mean
from sglang_fl.sglang_glue.versions import SUPPORTED_VERSIONS as SUPPORTED_SGLANG

CONFIG_DIR = Path(__file__).resolve().parent

BACKEND_KINDS = ("flagos", "vendor", "reference")
PLATFORMS = ("cuda", "ascend", "musa", "cpu")
DIST_BACKENDS = ("nccl", "hccl", "flagcx", "gloo")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(ValueError):
    """Bad configuration: the message names the variable/key, the value and what is accepted."""


# ---------------------------------------------------------------------------------------------
# Parsers. Each takes (raw value, where) and returns the typed value or raises SettingsError.
# Env values arrive as strings; YAML values may already be typed.
# ---------------------------------------------------------------------------------------------


def _bool(raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SettingsError(f"{where}={raw!r} is not a boolean; accepted: 1/0, true/false, yes/no, on/off")


def _choice(choices: tuple[str, ...], lower: bool = True) -> Callable[[Any, str], str]:
    def parse(raw: Any, where: str) -> str:
        text = str(raw).strip()
        text = text.lower() if lower else text.upper()
        if text not in choices:
            raise SettingsError(f"{where}={raw!r} is not accepted; accepted values: {', '.join(choices)}")
        return text

    return parse


def _names(allowed: tuple[str, ...] | None = None) -> Callable[[Any, str], tuple[str, ...]]:
    """A comma-separated string (env) or a YAML list of names."""

    def parse(raw: Any, where: str) -> tuple[str, ...]:
        if raw is None:
            return ()
        if isinstance(raw, str):
            items = [x.strip() for x in raw.split(",")]
        elif isinstance(raw, (list, tuple)):
            items = [str(x).strip() for x in raw]
        else:
            raise SettingsError(f"{where} must be a list of names or a comma-separated string, got {raw!r}")
        items = [x for x in items if x]
        if allowed is not None:
            bad = [f"{x!r}{did_you_mean(x, allowed)}" for x in items if x not in allowed]
            if bad:
                raise SettingsError(
                    f"{where} has unknown name(s) {', '.join(bad)}; accepted: {', '.join(allowed)}"
                )
        return tuple(dict.fromkeys(items))

    return parse


def _kind_list(raw: Any, where: str) -> tuple[str, ...]:
    kinds = _names()(raw, where)
    bad = [k for k in kinds if k not in BACKEND_KINDS]
    if bad or not kinds:
        raise SettingsError(
            f"{where}={raw!r}: unknown or missing backend kind {', '.join(map(repr, bad)) or '(empty)'}; "
            f"accepted kinds: {', '.join(BACKEND_KINDS)}"
        )
    return kinds


_PER_OP_ITEM = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:@\s*([A-Za-z_][A-Za-z0-9_]*)\s*)?=\s*([A-Za-z|\s]+?)\s*$")

#: ``op_backends`` keys are ``op`` (every token bucket) or ``op@bucket`` (one bucket).
BUCKET_SEP = "@"


def _op_backends(raw: Any, where: str) -> Mapping[str, tuple[str, ...]]:
    """``rms_norm=vendor|flagos;silu_and_mul@decode=flagos|vendor`` (env) or a YAML mapping
    op -> [kinds] or op -> {bucket: [kinds]} (or ``op@bucket: [kinds]``).

    The result is flat: key ``op`` is the op's order for every bucket without its own,
    key ``op@bucket`` the order of one token bucket. Bucket names are checked against
    ``token_buckets`` once both are known (`_check_combinations`)."""
    result: dict[str, tuple[str, ...]] = {}
    if raw is None:
        return MappingProxyType(result)
    if isinstance(raw, str):
        for chunk in filter(None, (c.strip() for c in raw.split(";"))):
            m = _PER_OP_ITEM.match(chunk)
            if not m:
                raise SettingsError(
                    f"{where}: malformed entry {chunk!r}; expected 'op=kind|kind;op@bucket=kind', "
                    f"e.g. 'rms_norm=vendor|flagos;silu_and_mul@decode=flagos|vendor'"
                )
            op, bucket, kinds = m.group(1), m.group(2), m.group(3).replace("|", ",")
            key = f"{op}{BUCKET_SEP}{bucket}" if bucket else op
            result[key] = _kind_list(kinds, f"{where}[{key}]")
    elif isinstance(raw, Mapping):
        for op, kinds in raw.items():
            op = str(op).replace(" ", "")
            if isinstance(kinds, Mapping):
                if BUCKET_SEP in op:
                    raise SettingsError(f"{where}.{op}: a per-bucket key takes a list of kinds, "
                                        f"got a mapping {dict(kinds)!r}")
                if not kinds:
                    raise SettingsError(f"{where}.{op}: empty mapping; give bucket: [kinds] "
                                        "entries or a list of kinds")
                for bucket, bkinds in kinds.items():
                    key = f"{op}{BUCKET_SEP}{bucket}"
                    if isinstance(bkinds, str):
                        bkinds = bkinds.replace("|", ",")
                    result[key] = _kind_list(bkinds, f"{where}.{op}.{bucket}")
                continue
            if isinstance(kinds, str):
                kinds = kinds.replace("|", ",")
            result[op] = _kind_list(kinds, f"{where}.{op}")
    else:
        raise SettingsError(f"{where} must be a mapping op -> [kinds] or 'op=kind|kind;...', got {raw!r}")
    ops = {key.split(BUCKET_SEP, 1)[0] for key in result}
    bad = [f"{op!r}{did_you_mean(op)}" for op in sorted(ops) if op not in OP_NAMES]
    if bad:
        raise SettingsError(
            f"{where} names unknown op(s) {', '.join(bad)}; accepted ops: {', '.join(OP_NAMES)}"
        )
    return MappingProxyType(result)


_BUCKET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _token_buckets(raw: Any, where: str) -> tuple[tuple[str, int | None], ...]:
    """Token-count buckets, smallest first: ``decode=64;prefill`` (env) or a YAML mapping
    ``{decode: 64, prefill: null}``. Each bucket but the last names its largest token count
    (inclusive, strictly increasing); the last has none (it takes every larger count)."""
    if isinstance(raw, str):
        items = []
        for chunk in filter(None, (c.strip() for c in raw.split(";"))):
            name, sep, bound = chunk.partition("=")
            items.append((name.strip(), bound.strip() if sep else None))
    elif isinstance(raw, Mapping):
        items = list(raw.items())
    else:
        raise SettingsError(f"{where} must be a mapping bucket -> largest token count (null for the "
                            f"last) or 'decode=64;prefill', got {raw!r}")
    example = "e.g. 'decode=64;prefill' (YAML: {decode: 64, prefill: null})"
    if not items:
        raise SettingsError(f"{where}={raw!r}: no bucket; {example}")
    buckets: list[tuple[str, int | None]] = []
    for i, (name, bound) in enumerate(items):
        name = str(name)
        if not _BUCKET_NAME.match(name):
            raise SettingsError(f"{where}: bucket name {name!r} is not accepted; accepted: a letter "
                                f"or '_' then letters, digits, '_'; {example}")
        if any(name == n for n, _ in buckets):
            raise SettingsError(f"{where}: bucket {name!r} appears twice")
        last = i == len(items) - 1
        if bound in (None, "", "null", "none", "None"):
            if not last:
                raise SettingsError(f"{where}: bucket {name!r} has no largest token count; only the "
                                    f"last bucket may be unbounded; {example}")
            buckets.append((name, None))
            continue
        if last:
            raise SettingsError(f"{where}: the last bucket {name!r} must be unbounded (it takes every "
                                f"count above the previous bucket), got {bound!r}; {example}")
        try:
            value = int(str(bound).strip())
        except ValueError:
            raise SettingsError(f"{where}: bucket {name!r} has largest token count {bound!r}; accepted: "
                                f"a positive integer; {example}") from None
        previous = buckets[-1][1] if buckets else 0
        if value <= previous:
            raise SettingsError(f"{where}: bucket {name!r} ends at {value} tokens, which is not above "
                                f"the previous bucket's {previous}; counts must increase")
        buckets.append((name, value))
    return tuple(buckets)


def format_buckets(buckets) -> str:
    """``decode<=64; prefill>64`` for logs and ``sglang-fl config``."""
    parts, lo = [], 0
    for name, hi in buckets:
        parts.append(f"{name}<={hi}" if hi is not None else (f"{name}>{lo}" if lo else f"{name}(all)"))
        lo = hi if hi is not None else lo
    return "; ".join(parts)


_BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _attention_backend(raw: Any, where: str) -> str | None:
    """A name as ``--attention-backend`` takes it. Whether something registered that name is
    known only once SGLang and the vendor folders are loaded: the server checks it at start-up
    and lists the registered ones (``sglang_fl.sglang_glue.attention``)."""
    text = str(raw).strip() if raw is not None else ""
    if not text:
        return None
    if not _BACKEND_NAME.match(text):
        raise SettingsError(
            f"{where}={raw!r} is not an attention backend name; accepted: lower-case letters, "
            "digits and '_' (e.g. torch_native, triton, or a name a vendor folder registers)")
    return text


def _path(raw: Any, where: str) -> str | None:
    text = str(raw).strip() if raw is not None else ""
    return text or None


@dataclass(frozen=True)
class Field:
    name: str
    env: str | None
    yaml_key: str | None
    parse: Callable[[Any, str], Any]
    default: Any
    help: str


FIELDS: tuple[Field, ...] = (
    # Layer 2 -- fused-op dispatch
    Field("oot_enabled", "SGLANG_FL_OOT_ENABLED", "oot_enabled", _bool, True,
          "Route SGLang fused ops (Layer 2) through sglang-fl dispatch."),
    Field("prefer", "SGLANG_FL_PREFER", "prefer", _choice(BACKEND_KINDS), "flagos",
          "Backend kind tried first for every op."),
    Field("op_backends", "SGLANG_FL_PER_OP", "op_backends", _op_backends, MappingProxyType({}),
          "Per-op ordered backend kinds, for every token bucket (op) or one (op@bucket); kinds "
          "not listed are not used for that op."),
    Field("token_buckets", "SGLANG_FL_TOKEN_BUCKETS", "token_buckets", _token_buckets,
          (("decode", 64), ("prefill", None)),
          "Token-count buckets an op's order may depend on (op_backends 'op@bucket'): each "
          "bucket's largest count, the last unbounded."),
    Field("custom_ops", "SGLANG_FL_CUSTOM_OPS", "custom_ops", _bool, False,
          "Call routed ops through torch.library custom ops (one opaque node for torch.compile "
          "and piecewise CUDA graphs); costs a dispatcher call in eager mode."),
    Field("bound_launch", "SGLANG_FL_BOUND_LAUNCH", "bound_launch", _bool, True,
          "Launch sglang-fl's own Triton kernels through the runner Triton compiled for the "
          "call's specialisation (less host time per eager call) instead of kernel[grid]."),
    Field("oot_blacklist", "SGLANG_FL_OOT_BLACKLIST", "oot_blacklist", _names(ROUTED_CLASSES), (),
          "Layer-2 classes left on SGLang's own forward."),
    Field("oot_whitelist", "SGLANG_FL_OOT_WHITELIST", "oot_whitelist", _names(ROUTED_CLASSES), (),
          "Only these Layer-2 classes are routed (exclusive with the blacklist)."),
    Field("strict", "SGLANG_FL_STRICT", "strict", _bool, False,
          "Only the first backend kind in the order; errors propagate, no fallback."),
    Field("deny_vendors", "SGLANG_FL_DENY_VENDORS", "deny_vendors", _names(), (),
          "Vendor backends never used (e.g. cuda)."),
    Field("allow_vendors", "SGLANG_FL_ALLOW_VENDORS", "allow_vendors", _names(), (),
          "If set, only these vendor backends may be used."),
    Field("enable_vendors", "SGLANG_FL_ENABLE_VENDORS", "enable_vendors", _names(OPT_IN_VENDORS), (),
          "Opt-in vendor folders to load (template: the copy source's example ops and its "
          "attention backend template_native); every other vendor loads where it is installed."),
    Field("dispatch_log", "SGLANG_FL_DISPATCH_LOG", "dispatch_log", _path, None,
          "File that receives the [OOT-DISPATCH] lines (appended)."),
    # Layer 1 -- FlagGems ATen replacement
    Field("use_flaggems", "USE_FLAGGEMS", "use_flaggems", _bool, True,
          "Replace ATen ops with FlagGems kernels (Layer 1)."),
    Field("flagos_whitelist", "SGLANG_FL_FLAGOS_WHITELIST", "flagos_whitelist", _names(), (),
          "Only these FlagGems ATen ops are enabled (beats flagos_blacklist)."),
    Field("flagos_blacklist", "SGLANG_FL_FLAGOS_BLACKLIST", "flagos_blacklist", _names(), (),
          "FlagGems ATen ops that must not replace PyTorch's."),
    Field("flaggems_record", "SGLANG_FLAGGEMS_RECORD", "flaggems_record", _bool, False,
          "Record Layer-1 FlagGems calls to the ATen log."),
    Field("flaggems_log_path", "SGLANG_FLAGGEMS_LOG_PATH", "flaggems_log_path", _path, None,
          "Where the ATen log goes (default: FlagGems' own location)."),
    Field("flaggems_log_once", "SGLANG_FLAGGEMS_LOG_ONCE", "flaggems_log_once", _bool, True,
          "Log each ATen op once instead of every call."),
    # Attention
    Field("attention_backend", "SGLANG_FL_ATTENTION_BACKEND", "attention_backend",
          _attention_backend, None,
          "Attention backend for servers started without --attention-backend, e.g. one a vendor "
          "folder registers (default: torch_native on CPU, triton on CUDA without flashinfer, "
          "else SGLang's choice)."),
    # Layer 3 -- communication
    Field("dist_backend", "SGLANG_FL_DIST_BACKEND", "dist_backend", _choice(DIST_BACKENDS), None,
          "Collectives backend: nccl | hccl | flagcx | gloo (default: flagcx when FLAGCX_PATH is "
          "set, else the platform's native one)."),
    Field("flagcx_path", "FLAGCX_PATH", "flagcx_path", _path, None,
          "FlagCX checkout/install whose build/lib/libflagcx.so is loaded."),
    # System
    Field("platform", "SGLANG_FL_PLATFORM", None, _choice(PLATFORMS), None,
          "Platform whose YAML is loaded (default: auto-detected)."),
    Field("config", "SGLANG_FL_CONFIG", None, _path, None, "User YAML file."),
    Field("log_level", "SGLANG_FL_LOG_LEVEL", "log_level", _choice(LOG_LEVELS, lower=False), "INFO",
          "Log level of the sglang_fl logger."),
    Field("sglang_adapter", "SGLANG_FL_SGLANG_ADAPTER", None, _choice(SUPPORTED_SGLANG), None,
          "Use this SGLang version's adapter whatever SGLang is installed (untested; logged as a "
          "warning). Default: the installed version's adapter; an unsupported version stops "
          "start-up."),
)
FIELDS_BY_NAME = {f.name: f for f in FIELDS}
YAML_KEYS = {f.yaml_key: f for f in FIELDS if f.yaml_key}
ENV_VARS = tuple(f.env for f in FIELDS if f.env)


@dataclass(frozen=True)
class Settings:
    """Effective configuration; immutable. ``origins`` maps field name -> where it came from."""

    oot_enabled: bool
    prefer: str
    op_backends: Mapping[str, tuple[str, ...]]
    token_buckets: tuple[tuple[str, int | None], ...]
    custom_ops: bool
    bound_launch: bool
    oot_blacklist: tuple[str, ...]
    oot_whitelist: tuple[str, ...]
    strict: bool
    deny_vendors: tuple[str, ...]
    allow_vendors: tuple[str, ...]
    enable_vendors: tuple[str, ...]
    dispatch_log: str | None
    use_flaggems: bool
    flagos_whitelist: tuple[str, ...]
    flagos_blacklist: tuple[str, ...]
    flaggems_record: bool
    flaggems_log_path: str | None
    flaggems_log_once: bool
    attention_backend: str | None
    dist_backend: str | None
    flagcx_path: str | None
    platform: str
    config: str | None
    log_level: str
    sglang_adapter: str | None
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for f in FIELDS:
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                value = {k: list(v) for k, v in value.items()}
            elif f.name == "token_buckets":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @property
    def default_order(self) -> tuple[str, ...]:
        """Backend kinds tried for an op without its own ``op_backends`` entry."""
        return (self.prefer,) + tuple(k for k in BACKEND_KINDS if k != self.prefer)

    def backend_order(self, op: str, bucket: str | None = None) -> tuple[str, ...]:
        """Backend kinds to try for ``op`` (in token bucket ``bucket``), first to last."""
        if bucket is not None:
            order = self.op_backends.get(f"{op}{BUCKET_SEP}{bucket}")
            if order is not None:
                return order
        return self.op_backends.get(op, self.default_order)

    @property
    def bucket_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.token_buckets)

    def routes_class(self, class_names: tuple[str, ...]) -> bool:
        """Whether a layer whose routed class names are ``class_names`` goes through Layer 2."""
        if not self.oot_enabled:
            return False
        if self.oot_whitelist:
            return any(n in self.oot_whitelist for n in class_names)
        return not any(n in self.oot_blacklist for n in class_names)


def read_yaml(path: str | os.PathLike, where: str) -> dict[str, Any]:
    """Load a config YAML with ``yaml.safe_load``; the result must be a mapping of known keys."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{where}: config file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise SettingsError(f"{where}: config file {str(p)!r} cannot be read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{where}: {str(p)!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(
            f"{where}: {str(p)!r} must hold a mapping of keys, got {type(data).__name__}"
        )
    unknown = [k for k in data if k not in YAML_KEYS]
    if unknown:
        raise SettingsError(
            f"{where}: {str(p)!r} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"accepted keys: {', '.join(sorted(YAML_KEYS))}"
        )
    return data


def build_settings(
    env: Mapping[str, str] | None = None,
    detect_platform: Callable[[], str] | None = None,
) -> Settings:
    """Build and validate the Settings from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}

    def from_env(f: Field) -> bool:
        raw = env.get(f.env) if f.env else None
        if raw is None or (raw.strip() == "" and f.name not in ("oot_blacklist", "oot_whitelist")):
            return False
        values[f.name] = f.parse(raw, f.env)
        origins[f.name] = f"env {f.env}"
        return True

    for name in ("platform", "config"):
        from_env(FIELDS_BY_NAME[name])
    if "platform" not in values:
        values["platform"] = detect_platform() if detect_platform else "cpu"
        origins["platform"] = "auto-detected"
    if "config" not in values:
        values["config"], origins["config"] = None, "default"

    platform_file = CONFIG_DIR / f"{values['platform']}.yaml"
    layers = []  # lowest precedence first
    if platform_file.exists():
        layers.append((read_yaml(platform_file, f"platform YAML {platform_file.name}"),
                       f"platform {platform_file.name}"))
    if values["config"]:
        layers.append((read_yaml(values["config"], "SGLANG_FL_CONFIG"), f"yaml {values['config']}"))

    for f in FIELDS:
        if f.name in ("platform", "config"):
            continue
        if from_env(f):
            continue
        for data, origin in reversed(layers):
            if data.get(f.yaml_key) is not None:  # null = not set in this file
                values[f.name] = f.parse(data[f.yaml_key], f"{origin}: {f.yaml_key}")
                origins[f.name] = origin
                break
        else:
            values[f.name] = f.default
            origins[f.name] = "default"

    _check_combinations(values, origins, layers[0][0] if platform_file.exists() else {})
    # FLAGCX_PATH beats a *default* backend (code default or platform YAML), not a user's choice.
    if values["flagcx_path"] and (values["dist_backend"] is None
                                  or origins["dist_backend"].startswith("platform ")):
        values["dist_backend"], origins["dist_backend"] = "flagcx", "implied by FLAGCX_PATH"
    return Settings(**values, origins=MappingProxyType(origins))


def _rank(origin: str) -> int:
    """Precedence of an origin string: env > user YAML > platform YAML > default."""
    for rank, prefix in ((3, "env"), (2, "yaml"), (1, "platform")):
        if origin.startswith(prefix):
            return rank
    return 0


def _resolve_lists(values, origins, white: str, black: str, names: str, yaml_white_wins: bool) -> None:
    """A white- and a blacklist from different sources: the higher-precedence source wins and
    the other list is dropped (its origin says so). Both from the same source is an error,
    except that a YAML whitelist may beat the same YAML's blacklist where ``yaml_white_wins``."""
    if not (values[white] and values[black]):
        return
    rw, rb = _rank(origins[white]), _rank(origins[black])
    if rw == rb and (rw == 3 or not yaml_white_wins):
        raise SettingsError(
            f"{names} are mutually exclusive (whitelist from {origins[white]}, blacklist from "
            f"{origins[black]}); set only one")
    loser, winner = (black, white) if rw >= rb else (white, black)
    values[loser] = ()
    origins[loser] = f"ignored: {winner} from {origins[winner]} wins"


def _check_combinations(values: dict[str, Any], origins: dict[str, str],
                        platform_data: dict[str, Any]) -> None:
    buckets = tuple(name for name, _ in values["token_buckets"])
    bad = [k for k in values["op_backends"]
           if BUCKET_SEP in k and k.split(BUCKET_SEP, 1)[1] not in buckets]
    if bad:
        raise SettingsError(
            f"op_backends (from {origins['op_backends']}) names unknown token bucket(s) in "
            f"{', '.join(map(repr, bad))}; accepted buckets: {', '.join(buckets)} (token_buckets "
            f"from {origins['token_buckets']})")
    # The platform YAML's flagos_blacklist names ops known to be wrong on that chip: a user's
    # blacklist adds to it rather than bringing them back (only a whitelist can).
    platform_black = FIELDS_BY_NAME["flagos_blacklist"].parse(
        platform_data.get("flagos_blacklist"), "platform YAML: flagos_blacklist")
    if platform_black and values["flagos_blacklist"] and _rank(origins["flagos_blacklist"]) > 1:
        values["flagos_blacklist"] = tuple(dict.fromkeys(platform_black + values["flagos_blacklist"]))
        origins["flagos_blacklist"] += " + platform YAML"
    _resolve_lists(values, origins, "oot_whitelist", "oot_blacklist",
                   "SGLANG_FL_OOT_WHITELIST and SGLANG_FL_OOT_BLACKLIST", yaml_white_wins=False)
    _resolve_lists(values, origins, "flagos_whitelist", "flagos_blacklist",
                   "SGLANG_FL_FLAGOS_WHITELIST and SGLANG_FL_FLAGOS_BLACKLIST", yaml_white_wins=True)
    if values["allow_vendors"] and values["deny_vendors"]:
        both = set(values["allow_vendors"]) & set(values["deny_vendors"])
        if both:
            raise SettingsError(
                f"vendor(s) {', '.join(sorted(both))} are both allowed (SGLANG_FL_ALLOW_VENDORS) and "
                "denied (SGLANG_FL_DENY_VENDORS)"
            )
