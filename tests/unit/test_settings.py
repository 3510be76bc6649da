"""Settings: precedence env > user YAML > platform YAML > defaults, provenance, and every
bad-input message."""

from __future__ import annotations

import pytest

from sglang_fl.config import _CONFIG_DIR, FIELDS, SettingsError, build_settings
from sglang_fl.config.settings import YAML_KEYS


def build(env=None, platform="cpu"):
    return build_settings(env=env or {}, detect_platform=lambda: platform)


def test_config_dir_holds_every_platform_yaml_and_the_sample():
    for name in ("cuda", "ascend", "musa", "cpu", "sample"):
        assert (_CONFIG_DIR / f"{name}.yaml").is_file()


def test_sample_yaml_documents_every_key_and_loads():
    text = (_CONFIG_DIR / "sample.yaml").read_text()
    for key in YAML_KEYS:
        assert f"{key}:" in text, key
    s = build({"SGLANG_FL_CONFIG": str(_CONFIG_DIR / "sample.yaml")})
    assert s.origins["prefer"].startswith("yaml ")


def test_cuda_yaml_keeps_broken_flaggems_ops_out_of_layer1():
    s = build(platform="cuda")
    assert s.flagos_whitelist and not {"mul", "pow_scalar"} & set(s.flagos_whitelist)
    assert s.origins["flagos_whitelist"] == "platform cuda.yaml"


def test_defaults_without_any_source(tmp_path):
    s = build(platform="nonexistent-platform-without-yaml") if False else build()
    assert s.oot_enabled is True and s.strict is False
    assert s.origins["strict"] == "default"
    assert s.platform == "cpu" and s.origins["platform"] == "auto-detected"


@pytest.mark.parametrize("field", [f for f in FIELDS if f.env and f.yaml_key], ids=lambda f: f.name)
def test_env_beats_user_yaml_beats_platform_yaml(field, tmp_path):
    samples = {
        "oot_enabled": ("0", True, None), "prefer": ("vendor", "flagos", None),
        "op_backends": ("rms_norm=vendor|flagos", {"rms_norm": ["reference"]}, None),
        "oot_blacklist": ("RMSNorm", ["SiluAndMul"], None),
        "oot_whitelist": ("RMSNorm", ["SiluAndMul"], None),
        "strict": ("1", False, None), "deny_vendors": ("cuda", ["ascend"], None),
        "allow_vendors": ("cuda", ["ascend"], None), "enable_vendors": ("template", [], None),
        "dispatch_log": ("/tmp/a", "/tmp/b", None),
        "use_flaggems": ("1", False, None), "flagos_whitelist": ("mm", ["add"], None),
        "flagos_blacklist": ("mm", ["add"], None), "flaggems_record": ("1", False, None),
        "flaggems_log_path": ("/tmp/x", "/tmp/y", None), "flaggems_log_once": ("0", True, None),
        "dist_backend": ("flagcx", "nccl", None), "flagcx_path": ("/opt/a", "/opt/b", None),
        "log_level": ("DEBUG", "WARNING", None),
        "attention_backend": ("triton", "my_chip_attn", None),
        "token_buckets": ("small=8;big", {"decode": 32, "prefill": None}, None),
        "custom_ops": ("1", False, None), "bound_launch": ("0", True, None),
    }
    env_value, yaml_value, _ = samples[field.name]
    cfg = tmp_path / "user.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump({field.yaml_key: yaml_value}))
    from_yaml = build({"SGLANG_FL_CONFIG": str(cfg)})
    assert from_yaml.origins[field.name] == f"yaml {cfg}"
    from_env = build({"SGLANG_FL_CONFIG": str(cfg), field.env: env_value})
    assert from_env.origins[field.name] == f"env {field.env}"
    assert getattr(from_env, field.name) != getattr(from_yaml, field.name)


def test_user_yaml_beats_platform_yaml(tmp_path):
    cfg = tmp_path / "u.yaml"
    cfg.write_text("prefer: vendor\n")
    assert build(platform="cpu").prefer == "reference"  # cpu.yaml
    s = build({"SGLANG_FL_CONFIG": str(cfg)}, platform="cpu")
    assert s.prefer == "vendor" and s.origins["prefer"] == f"yaml {cfg}"


def test_platform_env_selects_platform_yaml():
    s = build({"SGLANG_FL_PLATFORM": "cuda"}, platform="cpu")
    assert s.platform == "cuda" and s.origins["platform"] == "env SGLANG_FL_PLATFORM"
    assert s.dist_backend == "nccl"


def test_per_op_parsing_and_order():
    s = build({"SGLANG_FL_PER_OP": "rms_norm=vendor|flagos; silu_and_mul=reference"})
    assert s.op_backends["rms_norm"] == ("vendor", "flagos")
    assert s.backend_order("rms_norm") == ("vendor", "flagos")
    assert s.backend_order("rotary_embedding")[0] == s.prefer


def test_per_op_orders_per_token_bucket_env_and_yaml_forms(tmp_path):
    s = build({"SGLANG_FL_PER_OP": "rms_norm=vendor|flagos;silu_and_mul@decode=flagos|vendor;"
                                   " silu_and_mul @ prefill = vendor"})
    assert s.token_buckets == (("decode", 64), ("prefill", None))  # the default buckets
    assert s.backend_order("silu_and_mul", "decode") == ("flagos", "vendor")
    assert s.backend_order("silu_and_mul", "prefill") == ("vendor",)
    assert s.backend_order("silu_and_mul") == s.default_order  # no op-wide order given
    assert s.backend_order("rms_norm", "decode") == ("vendor", "flagos")  # op-wide: every bucket
    cfg = tmp_path / "u.yaml"
    cfg.write_text("token_buckets: {tiny: 4, mid: 512, large: null}\n"
                   "op_backends:\n  silu_and_mul: {tiny: [flagos], large: 'vendor|reference'}\n"
                   "  silu_and_mul@mid: [reference]\n  rms_norm: [vendor]\n")
    s = build({"SGLANG_FL_CONFIG": str(cfg)})
    assert s.token_buckets == (("tiny", 4), ("mid", 512), ("large", None))
    assert [s.backend_order("silu_and_mul", b) for b in s.bucket_names] == [
        ("flagos",), ("reference",), ("vendor", "reference")]
    assert s.as_dict()["token_buckets"] == {"tiny": 4, "mid": 512, "large": None}
    s = build({"SGLANG_FL_TOKEN_BUCKETS": "a=1;b=100;c"})
    assert s.token_buckets == (("a", 1), ("b", 100), ("c", None))


@pytest.mark.parametrize("env, needles", [
    ({"SGLANG_FL_PER_OP": "silu_and_mul@dcode=flagos"},
     ["unknown token bucket", "'silu_and_mul@dcode'", "decode, prefill"]),
    ({"SGLANG_FL_PER_OP": "silu_and_mul@decode=gpu"}, ["[silu_and_mul@decode]", "'gpu'", "flagos, vendor"]),
    ({"SGLANG_FL_PER_OP": "silu_and_mul@=flagos"}, ["malformed", "op@bucket"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "decode=64;prefill=512"}, ["SGLANG_FL_TOKEN_BUCKETS", "'prefill'",
                                                            "must be unbounded"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "decode;prefill"}, ["'decode'", "only the last bucket"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "decode=many;prefill"}, ["'many'", "positive integer"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "a=64;b=32;c"}, ["'b'", "32", "not above", "64"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "a=0;c"}, ["'a'", "0", "not above"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "a=4;a"}, ["'a'", "twice"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "1x=4;b"}, ["'1x'", "not accepted"]),
    ({"SGLANG_FL_TOKEN_BUCKETS": "small=8;big", "SGLANG_FL_PER_OP": "rms_norm@decode=vendor"},
     ["'rms_norm@decode'", "accepted buckets: small, big", "env SGLANG_FL_TOKEN_BUCKETS"]),
    ({"SGLANG_FL_CUSTOM_OPS": "sometimes"}, ["SGLANG_FL_CUSTOM_OPS", "'sometimes'"]),
    ({"SGLANG_FL_BOUND_LAUNCH": "fast"}, ["SGLANG_FL_BOUND_LAUNCH", "'fast'"]),
])
def test_bad_bucket_settings_name_the_value_and_the_accepted_ones(env, needles):
    with pytest.raises(SettingsError) as err:
        build(env)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_flagcx_path_implies_flagcx_backend():
    s = build({"FLAGCX_PATH": "/opt/flagcx"}, platform="cuda")  # beats cuda.yaml's nccl default
    assert s.dist_backend == "flagcx" and s.origins["dist_backend"] == "implied by FLAGCX_PATH"
    s = build({"FLAGCX_PATH": "/opt/flagcx"}, platform="no-yaml")
    assert s.dist_backend == "flagcx"
    s = build({"FLAGCX_PATH": "/opt/flagcx", "SGLANG_FL_DIST_BACKEND": "nccl"}, platform="cuda")
    assert s.dist_backend == "nccl"  # an explicit choice stays


@pytest.mark.parametrize("env, needles", [
    ({"SGLANG_FL_PREFER": "gpu"}, ["SGLANG_FL_PREFER", "'gpu'", "flagos, vendor, reference"]),
    ({"SGLANG_FL_PER_OP": "rms_norm"}, ["SGLANG_FL_PER_OP", "malformed", "'rms_norm'"]),
    ({"SGLANG_FL_PER_OP": "rms_norm=cuda"}, ["SGLANG_FL_PER_OP[rms_norm]", "'cuda'", "flagos, vendor, reference"]),
    ({"SGLANG_FL_PER_OP": "rmsnorm=vendor"}, ["unknown op", "'rmsnorm'", "rms_norm"]),
    ({"SGLANG_FL_OOT_WHITELIST": "RMSNorm", "SGLANG_FL_OOT_BLACKLIST": "SiluAndMul"},
     ["SGLANG_FL_OOT_WHITELIST", "SGLANG_FL_OOT_BLACKLIST", "mutually exclusive"]),
    ({"SGLANG_FL_FLAGOS_WHITELIST": "mm", "SGLANG_FL_FLAGOS_BLACKLIST": "add"}, ["mutually exclusive"]),
    ({"SGLANG_FL_OOT_BLACKLIST": "LayerNorm"}, ["SGLANG_FL_OOT_BLACKLIST", "'LayerNorm'", "RMSNorm"]),
    ({"SGLANG_FL_STRICT": "maybe"}, ["SGLANG_FL_STRICT", "'maybe'", "true/false"]),
    ({"SGLANG_FL_DIST_BACKEND": "mpi"}, ["SGLANG_FL_DIST_BACKEND", "'mpi'", "nccl, hccl, flagcx"]),
    ({"SGLANG_FL_PLATFORM": "tpu"}, ["SGLANG_FL_PLATFORM", "'tpu'", "cuda, ascend, musa, cpu"]),
    ({"SGLANG_FL_LOG_LEVEL": "LOUD"}, ["SGLANG_FL_LOG_LEVEL", "'LOUD'", "DEBUG"]),
    ({"SGLANG_FL_CONFIG": "/nonexistent/x.yaml"}, ["SGLANG_FL_CONFIG", "/nonexistent/x.yaml", "does not exist"]),
    ({"SGLANG_FL_ALLOW_VENDORS": "cuda", "SGLANG_FL_DENY_VENDORS": "cuda"}, ["cuda", "allowed", "denied"]),
    ({"SGLANG_FL_ATTENTION_BACKEND": "My Attn"}, ["SGLANG_FL_ATTENTION_BACKEND", "'My Attn'",
                                                  "lower-case letters, digits and '_'"]),
])
def test_bad_env_values_name_the_variable_the_value_and_the_choices(env, needles):
    with pytest.raises(SettingsError) as err:
        build(env)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


@pytest.mark.parametrize("text, needles", [
    ("preferr: flagos\n", ["unknown key", "'preferr'", "prefer"]),
    ("- a\n- b\n", ["must hold a mapping", "list"]),
    ("prefer: [flagos\n", ["not valid YAML"]),
    ("op_backends:\n  rms_norm: [gpu]\n", ["op_backends.rms_norm", "'gpu'", "flagos, vendor, reference"]),
    ("oot_whitelist: [RMSNorm]\noot_blacklist: [SiluAndMul]\n", ["mutually exclusive"]),
    ("!!python/object/apply:os.system ['echo pwned']\n", ["not valid YAML"]),
    ("attention_backend: torch-native\n", ["attention_backend", "'torch-native'", "lower-case"]),
    ("op_backends:\n  silu_and_mul: {decode: [gpu]}\n",
     ["op_backends.silu_and_mul.decode", "'gpu'", "flagos, vendor, reference"]),
    ("op_backends:\n  silu_and_mul: {}\n", ["op_backends.silu_and_mul", "empty mapping"]),
    ("token_buckets: [64]\n", ["token_buckets", "must be a mapping"]),
])
def test_bad_yaml_names_the_key_and_the_file(tmp_path, text, needles):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(SettingsError) as err:
        build({"SGLANG_FL_CONFIG": str(cfg)})
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_unreadable_config_file(tmp_path):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    with pytest.raises(SettingsError, match="cannot be read"):
        build({"SGLANG_FL_CONFIG": str(d)})


def test_flagos_whitelist_beats_yaml_blacklist(tmp_path):
    cfg = tmp_path / "blacklist.yaml"
    cfg.write_text("flagos_blacklist: [mul, pow_scalar]\n")
    s = build({"SGLANG_FL_FLAGOS_WHITELIST": "mm,addmm", "SGLANG_FL_CONFIG": str(cfg)})
    assert s.flagos_whitelist == ("mm", "addmm") and s.flagos_blacklist == ()
    assert "whitelist" in s.origins["flagos_blacklist"]


def test_platform_flagos_lists_yield_to_the_user_but_known_bad_ops_stay_out(tmp_path):
    # cuda.yaml: a Layer-1 whitelist. A user's blacklist (higher precedence) replaces that mode,
    # and the ops cuda.yaml marks as wrong stay blacklisted on top of the user's own.
    platform_yaml = build(platform="cuda")
    assert platform_yaml.flagos_whitelist
    s = build({"SGLANG_FL_FLAGOS_BLACKLIST": "count_nonzero"}, platform="cuda")
    assert s.flagos_whitelist == () and "ignored" in s.origins["flagos_whitelist"]
    assert s.flagos_blacklist[-1] == "count_nonzero"
    assert {"mul", "pow_scalar"} <= set(s.flagos_blacklist)
    assert s.origins["flagos_blacklist"] == "env SGLANG_FL_FLAGOS_BLACKLIST + platform YAML"
    s = build({"SGLANG_FL_FLAGOS_WHITELIST": "mm,mul"}, platform="cuda")
    assert s.flagos_whitelist == ("mm", "mul")  # an explicit whitelist is the user's call


def test_oot_lists_from_different_sources_follow_precedence(tmp_path):
    cfg = tmp_path / "u.yaml"
    cfg.write_text("oot_blacklist: [RotaryEmbedding]\n")
    s = build({"SGLANG_FL_CONFIG": str(cfg), "SGLANG_FL_OOT_WHITELIST": "RMSNorm"})
    assert s.oot_whitelist == ("RMSNorm",) and s.oot_blacklist == ()
    assert s.routes_class(("RMSNorm", "RMSNorm")) and not s.routes_class(("SiluAndMul", "SiluAndMul"))


def test_settings_are_immutable():
    s = build()
    with pytest.raises(AttributeError):
        s.prefer = "vendor"
    with pytest.raises(TypeError):
        s.op_backends["rms_norm"] = ("vendor",)


def test_routes_class_lists():
    assert build({"SGLANG_FL_OOT_BLACKLIST": "RotaryEmbedding"}).routes_class(("RotaryEmbedding", "Llama3RotaryEmbedding")) is False
    assert build({"SGLANG_FL_OOT_WHITELIST": "RMSNorm"}).routes_class(("SiluAndMul", "SiluAndMul")) is False
    assert build({"SGLANG_FL_OOT_ENABLED": "0"}).routes_class(("RMSNorm", "RMSNorm")) is False
    assert build().routes_class(("RMSNorm", "RMSNorm")) is True


def test_cuda_yaml_per_bucket_orders_load_as_per_bucket_keys():
    """cuda.yaml is tune's output, which orders some ops per token bucket: Settings holds those
    as ``op@bucket`` keys, every bucket of the YAML's own ``token_buckets``, with no op-wide
    order left to hide them."""
    import yaml

    doc = yaml.safe_load((_CONFIG_DIR / "cuda.yaml").read_text())
    s = build(platform="cuda")
    buckets = set(doc["token_buckets"])
    split = {op: order for op, order in doc["op_backends"].items() if isinstance(order, dict)}
    assert split  # tune split at least the ops whose decode and prefill winners differ
    for op, order in split.items():
        assert op not in s.op_backends, op
        assert set(order) <= buckets, op
        for bucket, kinds in order.items():
            assert s.op_backends[f"{op}@{bucket}"] == tuple(kinds), (op, bucket)


def test_cuda_yaml_orders_start_with_a_kind_that_implements_the_op():
    """A default CUDA install resolves every op to the first kind of its order (a doctor that
    warns 'preferred flagos unavailable' on a default install teaches operators to ignore it):
    every op the CUDA platform orders, FlagGems' ops included, starts with a backend class that
    defines it (FlagGems has no GDN gating, conv1d or gated RMSNorm: those start with vendor)."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend
    from sglang_fl.dispatch.ops import OP_NAMES

    s = build(platform="cuda")
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    classes = {"flagos": FlagGemsBackend, "vendor": CudaBackend, "reference": ReferenceBackend}
    for key, order in s.op_backends.items():
        op = key.split("@")[0]
        assert op in OP_NAMES, key
        assert callable(getattr(classes[order[0]], op, None)), f"{key}: {order[0]} has no {op}"
    for op in ("gdn_gating", "causal_conv1d", "causal_conv1d_update", "rms_norm_gated",
               "chunk_gated_delta_rule", "recurrent_gated_delta_rule",
               "packed_recurrent_gated_delta_rule"):
        assert any(key.split("@")[0] == op for key in s.op_backends), \
            f"cuda.yaml gives {op} no order of its own"
