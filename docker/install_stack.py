#!/usr/bin/env python3
"""Install the sglang-fl software stack for one platform.

This is the one install script behind every image (docker/<vendor>/Dockerfile) and behind the
CPU test environment (`nox -s tests`), so the image recipe is exercised on every CI run. What
differs per platform is data, in ``docker/stacks/<platform>.ini``; this file only knows the steps:

1. python        the target interpreter is a version the stack supports
2. vendor        optionally install the vendor's PyTorch pair (Ascend), then freeze what the
                 vendor stack provides (torch, torch_npu, torch_musa, triton) as pip constraints,
                 so no later step can replace the vendor's torch
3. requirements  SGLang's runtime dependencies, installed under those constraints
4. empty-mode    SGLang, FlagGems and the vendor op package with ``--no-deps`` (their own pins
                 would pull a CUDA torch, flashinfer, ...)
5. plugin        sglang_fl itself, from the project directory
6. flagcx        FlagCX cloned at a pinned tag (no submodules: nlohmann-json comes from the
                 distribution's package) and built with the vendor's make flag
7. verify        distributions present, vendor packages unchanged, safe imports succeed

``--sglang VERSION`` picks one of the SGLang versions a stack supports (``[stack] sglang``, the
first is the default); a ``[sglang VERSION]`` section replaces the ``[python]`` keys it names
(``requirements``, ``no_deps``, ``python``) for that version. Images pass it from their
``SGLANG_VERSION`` build argument.
``--dry-run`` resolves and prints the plan without running anything (``--json`` for machines).
``--phase deps`` runs steps 1-4 and 6, ``--phase plugin`` steps 1-2 (freeze only), 5 and 7: an
image installs the slow, rarely changing part in one layer before it copies the source tree, so
a change to the plugin rebuilds only the last layer.
Standard library only: it runs on the bare Python of every vendor base image (3.10+).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = Path(__file__).resolve().parent / "stacks"
DEFAULT_FLAGCX_DIR = "/opt/flagcx"

# Every key a stack file may hold, per section; anything else is a typo and fails loudly.
_SCHEMA = {
    "stack": {"description", "python", "sglang"},
    "vendor": {"install", "index_url", "provided"},
    "python": {"requirements", "no_deps", "verify_dists", "verify_imports"},
    "flagcx": {"repo", "tag", "make", "env"},
}
_REQUIRED = {"stack": {"python"}, "python": {"no_deps"}}
#: Keys a ``[sglang VERSION]`` section may replace.
_PER_SGLANG = {"requirements", "no_deps", "python"}
_SGLANG_SECTION = re.compile(r"^sglang (\d+\.\d+\.\d+)$")
_PLACEHOLDER = re.compile(r"\{pkgdir:([A-Za-z0-9_.]+)\}")
_TAG = re.compile(r"^v\d+\.\d+\.\d+([.-][A-Za-z0-9.]+)?$")


class StackError(RuntimeError):
    """A bad stack file, a bad option or a failed step; the message says which and why."""


def available_platforms() -> list[str]:
    return sorted(p.stem for p in STACKS_DIR.glob("*.ini"))


@dataclass
class Stack:
    platform: str
    sglang: str
    sglang_versions: tuple[str, ...]
    description: str
    python_versions: tuple[str, ...]
    vendor_install: tuple[str, ...]
    vendor_index_url: str
    provided: tuple[str, ...]
    requirements: tuple[Path, ...]
    no_deps: tuple[str, ...]
    verify_dists: tuple[str, ...]
    verify_imports: tuple[str, ...]
    flagcx_repo: str | None = None
    flagcx_tag: str | None = None
    flagcx_make: tuple[str, ...] = ()
    flagcx_env: dict[str, str] = field(default_factory=dict)


def load_stack(platform: str, project: Path = PROJECT_ROOT, sglang: str | None = None) -> Stack:
    path = STACKS_DIR / f"{platform}.ini"
    if not path.is_file():
        raise StackError(
            f"unknown platform {platform!r}: no {path}; available: {', '.join(available_platforms())}"
        )
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    for section in parser.sections():
        if _SGLANG_SECTION.match(section):
            unknown = set(parser[section]) - _PER_SGLANG
            if unknown:
                raise StackError(f"{path}: unknown key(s) {sorted(unknown)} in [{section}]; "
                                 f"accepted: {sorted(_PER_SGLANG)}")
            continue
        if section not in _SCHEMA:
            raise StackError(f"{path}: unknown section [{section}]; accepted: {sorted(_SCHEMA)}")
        unknown = set(parser[section]) - _SCHEMA[section]
        if unknown:
            raise StackError(
                f"{path}: unknown key(s) {sorted(unknown)} in [{section}]; "
                f"accepted: {sorted(_SCHEMA[section])}"
            )
    for section, keys in _REQUIRED.items():
        for key in keys:
            if not parser.get(section, key, fallback="").strip():
                raise StackError(f"{path}: [{section}] {key} is required")

    pinned = [w.split("==", 1)[1] for w in parser.get("python", "no_deps", fallback="").split()
              if w.startswith("sglang==")]
    versions = tuple(parser.get("stack", "sglang", fallback="").split()) or tuple(pinned[:1])
    chosen = sglang or (versions[0] if versions else None)
    if sglang is not None and sglang not in versions:
        raise StackError(f"the {platform} stack supports SGLang {', '.join(versions) or '(none)'}, "
                         f"not {sglang} ({path}: [stack] sglang)")
    override = f"sglang {chosen}"
    if chosen != (versions[0] if versions else None) and not parser.has_section(override):
        raise StackError(f"{path}: [stack] sglang lists {chosen} but there is no [{override}]")

    def words(section: str, key: str) -> tuple[str, ...]:
        if section in ("python", "stack") and key in _PER_SGLANG and parser.has_option(override, key):
            section = override
        return tuple(parser.get(section, key, fallback="").split())

    requirements = []
    for rel in words("python", "requirements"):
        req = (project / rel).resolve()
        if not req.is_file():
            raise StackError(f"{path}: [python] requirements names {rel}, which does not exist")
        requirements.append(req)
    for version in words("stack", "python"):
        if not re.fullmatch(r"3\.\d+", version):
            raise StackError(f"{path}: [stack] python lists {version!r}; expected e.g. '3.11'")

    stack = Stack(
        platform=platform,
        sglang=chosen or "",
        sglang_versions=versions,
        description=parser.get("stack", "description", fallback="").strip(),
        python_versions=words("stack", "python"),
        vendor_install=words("vendor", "install"),
        vendor_index_url=parser.get("vendor", "index_url", fallback="").strip(),
        provided=words("vendor", "provided"),
        requirements=tuple(requirements),
        no_deps=words("python", "no_deps"),
        verify_dists=words("python", "verify_dists"),
        verify_imports=words("python", "verify_imports"),
    )
    for spec in stack.no_deps + stack.vendor_install:
        if "==" not in spec:
            raise StackError(f"{path}: {spec!r} is not pinned; empty-mode and vendor packages need '=='")
    if parser.has_section("flagcx"):
        stack.flagcx_repo = parser.get("flagcx", "repo", fallback="").strip()
        stack.flagcx_tag = parser.get("flagcx", "tag", fallback="").strip()
        stack.flagcx_make = words("flagcx", "make")
        if not stack.flagcx_repo or not _TAG.match(stack.flagcx_tag or ""):
            raise StackError(
                f"{path}: [flagcx] needs repo and a release tag like v0.13.0, got tag={stack.flagcx_tag!r}"
            )
        if not any(re.fullmatch(r"USE_[A-Z_]+=1", w) for w in stack.flagcx_make):
            raise StackError(f"{path}: [flagcx] make must set the vendor flag (USE_<VENDOR>=1)")
        for item in words("flagcx", "env"):
            key, sep, value = item.partition("=")
            if not sep:
                raise StackError(f"{path}: [flagcx] env entry {item!r} is not NAME=value")
            stack.flagcx_env[key] = value
    return stack


# ---------------------------------------------------------------------------------------------
# The plan: an ordered list of steps, each a list of commands (argv lists) and checks.
# ---------------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    why: str
    commands: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Options:
    python: str
    project: Path
    flagcx_dir: str | None
    editable: bool = False
    pip_args: tuple[str, ...] = ()
    jobs: int = os.cpu_count() or 2
    phase: str = "all"
    #: Replaces the stack's [vendor] index_url when not None ("" = pip's own settings only).
    vendor_index_url: str | None = None
    #: Replaces the stack's [flagcx] repo when set (a mirror; the tag must be there).
    flagcx_repo: str | None = None


def _pip(opts: Options, *args: str) -> list[str]:
    return [opts.python, "-m", "pip", "install", *opts.pip_args, *args]


def constraints_path(opts: Options) -> str:
    # One file per run: concurrent installs (parallel CI jobs) must not share it.
    return str(Path(tempfile.gettempdir()) / f"sglang-fl-vendor-constraints-{os.getpid()}.txt")


#: Steps of each --phase ("all" is every step).
PHASES = {
    "deps": ("python", "vendor", "requirements", "empty-mode", "flagcx"),
    "plugin": ("python", "vendor", "plugin", "verify"),
}


def build_plan(stack: Stack, opts: Options) -> list[Step]:
    steps = _all_steps(stack, opts)
    if opts.phase == "all":
        return steps
    keep = [s for s in steps if s.name in PHASES[opts.phase]]
    if opts.phase == "plugin":
        for step in keep:
            if step.name == "vendor":  # installed by the deps phase: only freeze it again
                step.commands = []
    return keep


def _all_steps(stack: Stack, opts: Options) -> list[Step]:
    cons = constraints_path(opts)
    steps = [
        Step("python", f"interpreter must be Python {' or '.join(stack.python_versions)}"),
    ]
    vendor = Step(
        "vendor",
        "freeze the vendor's packages ("
        + (" ".join(stack.provided) or "none")
        + f") at their installed versions into {cons}",
    )
    if stack.vendor_install:
        index = stack.vendor_index_url if opts.vendor_index_url is None else opts.vendor_index_url
        extra = ["--extra-index-url", index] if index else []
        vendor.commands.append(_pip(opts, *extra, *stack.vendor_install))
    steps.append(vendor)
    if stack.requirements:
        cmd = _pip(opts, "-c", cons)
        for req in stack.requirements:
            cmd += ["-r", str(req)]
        steps.append(Step("requirements", "runtime dependencies, vendor packages held", [cmd]))
    steps.append(
        Step(
            "empty-mode",
            "SGLang / FlagGems / vendor op packages without their dependency pins",
            [_pip(opts, "--no-deps", *stack.no_deps)],
        )
    )
    plugin = _pip(opts, "-c", cons) + (["-e"] if opts.editable else []) + [str(opts.project)]
    steps.append(Step("plugin", "sglang_fl and its entry points", [plugin]))
    if stack.flagcx_tag and opts.flagcx_dir:
        dest = opts.flagcx_dir
        make = [_resolve_placeholders(w, opts) for w in stack.flagcx_make]
        steps.append(
            Step(
                "flagcx",
                f"FlagCX {stack.flagcx_tag} built for this vendor; set FLAGCX_PATH={dest}",
                [
                    # Submodules are left out: googletest is for FlagCX's own tests, and
                    # <nlohmann/json.hpp> is found in /usr/include (nlohmann-json3-dev).
                    ["git", "clone", "--depth", "1", "--branch", stack.flagcx_tag,
                     opts.flagcx_repo or stack.flagcx_repo, dest],
                    ["make", "-C", dest, f"-j{opts.jobs}", *make],
                    ["rm", "-rf", f"{dest}/.git", f"{dest}/third-party/googletest"],
                ],
                env=dict(stack.flagcx_env),
            )
        )
    steps.append(
        Step(
            "verify",
            "installed: " + " ".join(stack.verify_dists)
            + "; unchanged: " + (" ".join(stack.provided) or "-")
            + "; import: " + (" ".join(stack.verify_imports) or "-")
            + (f"; exists: {opts.flagcx_dir}/build/lib/libflagcx.so"
               if stack.flagcx_tag and opts.flagcx_dir else ""),
        )
    )
    return steps


def _resolve_placeholders(word: str, opts: Options, dry_run: bool = True) -> str:
    """`{pkgdir:nvidia.nccl}` becomes that package's directory in the target interpreter."""

    def repl(m: re.Match) -> str:
        name = m.group(1)
        code = (
            "import importlib.util, sys\n"
            f"s = importlib.util.find_spec({name!r})\n"
            "sys.exit(1) if s is None else print(list(s.submodule_search_locations or [])[0])"
        )
        try:
            out = subprocess.run([opts.python, "-c", code], capture_output=True, text=True)
        except OSError:
            out = None
        if out is not None and out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
        if dry_run:
            return f"<directory of python package {name}>"
        raise StackError(f"python package {name} is not installed in {opts.python}; "
                         "the vendor base image should provide it")

    return _PLACEHOLDER.sub(repl, word)


def format_plan(stack: Stack, steps: list[Step], opts: Options) -> str:
    lines = [f"sglang-fl install plan: platform={stack.platform} sglang={stack.sglang}",
             f"  {stack.description}",
             f"  python: {opts.python}", f"  project: {opts.project}"]
    for i, step in enumerate(steps, 1):
        lines.append(f"[{i}] {step.name}: {step.why}")
        for key, value in step.env.items():
            lines.append(f"    env {key}={value}")
        for cmd in step.commands:
            lines.append("    $ " + shlex.join(cmd))
    return "\n".join(lines)


def plan_as_dict(stack: Stack, steps: list[Step], opts: Options) -> dict:
    return {
        "platform": stack.platform,
        "sglang": stack.sglang,
        "phase": opts.phase,
        "python": opts.python,
        "python_versions": list(stack.python_versions),
        "provided": list(stack.provided),
        "no_deps": list(stack.no_deps),
        "flagcx": {"tag": stack.flagcx_tag, "path": opts.flagcx_dir} if stack.flagcx_tag else None,
        "steps": [
            {"name": s.name, "why": s.why, "env": s.env, "commands": s.commands} for s in steps
        ],
    }


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------


def _probe(python: str, code: str) -> str:
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise StackError(f"{python} -c ... failed:\n{out.stderr.strip()}")
    return out.stdout.strip()


def _versions(python: str, dists: tuple[str, ...]) -> dict[str, str | None]:
    code = (
        "import json, importlib.metadata as m\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        f"print(json.dumps({{n: v(n) for n in {list(dists)!r}}}))"
    )
    return json.loads(_probe(python, code))


def _run(cmd: list[str], env: dict[str, str]) -> None:
    print("+ " + shlex.join(cmd), flush=True)
    result = subprocess.run(cmd, env={**os.environ, **env} if env else None)
    if result.returncode != 0:
        raise StackError(f"command failed with exit status {result.returncode}: {shlex.join(cmd)}")


def execute(stack: Stack, steps: list[Step], opts: Options) -> None:
    frozen: dict[str, str] = {}
    for step in steps:
        print(f"==> {step.name}: {step.why}", flush=True)
        if step.name == "python":
            version = _probe(opts.python, "import sys; print('%d.%d' % sys.version_info[:2])")
            if version not in stack.python_versions:
                raise StackError(
                    f"{opts.python} is Python {version}; the {stack.platform} stack supports "
                    f"{', '.join(stack.python_versions)}"
                )
            continue
        if step.name == "flagcx":
            step.commands[1] = [_resolve_placeholders(w, opts, dry_run=False) for w in step.commands[1]]
        for cmd in step.commands:
            _run(cmd, step.env)
        if step.name == "vendor":
            found = _versions(opts.python, stack.provided)
            missing = [name for name, version in found.items() if version is None]
            if missing:
                raise StackError(
                    f"the {stack.platform} stack expects the vendor base to provide "
                    f"{', '.join(missing)}, but {opts.python} has none of it"
                )
            frozen = {k: v for k, v in found.items() if v}
            Path(constraints_path(opts)).write_text(
                "".join(f"{k}=={v}\n" for k, v in frozen.items()), encoding="utf-8"
            )
            print(f"    frozen: {frozen or 'nothing'}")
        if step.name == "verify":
            _verify(stack, opts, frozen)


def _verify(stack: Stack, opts: Options, frozen: dict[str, str]) -> None:
    found = _versions(opts.python, stack.verify_dists + tuple(frozen))
    missing = [name for name in stack.verify_dists if not found.get(name)]
    if missing:
        raise StackError(f"not installed after the install: {', '.join(missing)}")
    changed = {k: (v, found.get(k)) for k, v in frozen.items() if found.get(k) != v}
    if changed:
        raise StackError(f"vendor packages changed during the install: {changed}")
    if stack.verify_imports:
        _probe(opts.python, "".join(f"import {m}\n" for m in stack.verify_imports))
    if stack.flagcx_tag and opts.flagcx_dir:
        lib = Path(opts.flagcx_dir) / "build" / "lib" / "libflagcx.so"
        if not lib.is_file():
            raise StackError(f"FlagCX build did not produce {lib}")
    print("    ok: " + ", ".join(f"{k} {found[k]}" for k in stack.verify_dists))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--platform", required=True, help="one of: " + ", ".join(available_platforms()))
    ap.add_argument("--sglang", metavar="VERSION", default=None,
                    help="SGLang version of the stack (default: the stack's first [stack] sglang)")
    ap.add_argument("--python", default=sys.executable, help="target interpreter (default: this one)")
    ap.add_argument("--project", default=str(PROJECT_ROOT), help="sglang-fl source directory")
    ap.add_argument("--flagcx-dir", default=DEFAULT_FLAGCX_DIR,
                    help=f"where FlagCX is cloned and built, i.e. FLAGCX_PATH (default {DEFAULT_FLAGCX_DIR})")
    ap.add_argument("--skip-flagcx", action="store_true", help="leave FlagCX out")
    ap.add_argument("--editable", action="store_true", help="install the plugin in editable mode")
    ap.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for every pip install (repeatable), e.g. --pip-arg=--no-cache-dir")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="make -j for FlagCX")
    ap.add_argument("--vendor-index-url", metavar="URL", default=None,
                    help="index for the vendor packages instead of the stack's (a mirror); "
                         "'' leaves them to pip's own settings (find-links, PIP_INDEX_URL)")
    ap.add_argument("--flagcx-repo", metavar="URL", default=None,
                    help="clone FlagCX from this mirror instead of the stack's repo")
    ap.add_argument("--phase", choices=("all", *PHASES), default="all",
                    help="all steps (default), or deps / plugin for a layered image build")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved plan, run nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    args = ap.parse_args(argv)
    try:
        project = Path(args.project).resolve()
        if not (project / "pyproject.toml").is_file():
            raise StackError(f"--project {project} has no pyproject.toml")
        stack = load_stack(args.platform, project, args.sglang or None)
        opts = Options(
            python=args.python,
            project=project,
            flagcx_dir=None if args.skip_flagcx else args.flagcx_dir,
            editable=args.editable,
            pip_args=tuple(args.pip_arg),
            jobs=args.jobs,
            phase=args.phase,
            vendor_index_url=args.vendor_index_url,
            flagcx_repo=args.flagcx_repo,
        )
        steps = build_plan(stack, opts)
        if args.dry_run:
            if args.json:
                print(json.dumps(plan_as_dict(stack, steps, opts), indent=2))
            else:
                print(format_plan(stack, steps, opts))
            return 0
        print(format_plan(stack, steps, opts), flush=True)
        execute(stack, steps, opts)
    except StackError as exc:
        print(f"install_stack: error: {exc}", file=sys.stderr)
        return 2
    done = "installed" if args.phase == "all" else f"phase {args.phase} installed"
    print(f"install_stack: {stack.platform} stack {done} (SGLang {stack.sglang})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
