"""The programs preflight sends to the head, bare or inside the engine's container.

Two sh programs, run as an argument list (`argv`) wrapped in `env K=V …` or `docker exec …
CONTAINER`: PROBE finds the `vllm` the engine runs, PICK runs the program on its stdin with the
first interpreter that imports a module. Then the Python program PICK runs: `PRELUDE`, the
caller's `ARGS` (the arguments after `serve`) and `KNOWN` (None: check ARGS; else the versions
whose option strings the caller holds: answer the parser's option strings), then `VLLM` (vLLM's
own `serve` parser, config bounds and validators) or `SIM` (the simulated engine's parser). The
program prints one JSON line after `MARK`. Exit status 47 (NO_PYTHON_EXIT) means "nothing to ask
on this node".
"""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, result, text

MARK = "SPARK-OPS-PREFLIGHT "
NO_PYTHON_EXIT = 47
SIM_MODULE = "spark_ops.sim.engine"  # what the embedded cluster's `vllm` shim runs

# Finds the `vllm` the engine is started with; prints its path, resolved path and first 4 KiB.
PROBE_SH = r"""
v=$(command -v "$1" 2>/dev/null) || { echo "no $1 on PATH ($PATH)" >&2; exit 47; }
r=$(readlink -f "$v" 2>/dev/null) || r=$v
printf '%s\n%s\n' "$v" "$r"
head -c 4096 "$r" 2>/dev/null | LC_ALL=C tr -d '\000'
"""

# Runs the program on stdin with the first candidate interpreter that can import the module (not
# from the working directory, the SSH user's home: the probe and the program both take it off the
# import path first, so a stray ~/vllm/ or ~/json.py is neither found nor run; an empty or relative
# entry of the recipe's PYTHONPATH, which Python reads as the working directory, is dropped too).
PICK_SH = r"""
m=$1; shift
if [ -n "${PYTHONPATH+x}" ]; then  # the recipe's env: keep its absolute entries only
  set -f; old_ifs=$IFS; IFS=:; kept=
  for d in $PYTHONPATH; do case $d in /*) kept=${kept:+$kept:}$d ;; esac; done
  IFS=$old_ifs; set +f
  if [ -n "$kept" ]; then PYTHONPATH=$kept; export PYTHONPATH; else unset PYTHONPATH; fi
fi
for py in "$@"; do
  case $py in
    */*) [ -x "$py" ] || continue ;;
    *) command -v "$py" >/dev/null 2>&1 || continue ;;
  esac
  if "$py" -c 'import sys; sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import importlib.util as u; sys.exit(0 if u.find_spec(sys.argv[1]) else 1)' \
      "$m" </dev/null >/dev/null 2>&1; then
    exec "$py" -
  fi
done
echo "no Python here imports $m (tried: $*)" >&2
exit 47
"""

PROBE = RemoteProgram("find vllm", PROBE_SH, (text("vllm"),), result)
PICK = RemoteProgram(
    "pick interpreter",
    PICK_SH,
    (text("module"), text("interpreters", many=True)),
    result,
)

# The head of both programs: report one JSON line after MARK, argparse error extraction. Its
# first line takes the working directory (the SSH user's home, where `python -` looks first)
# off the import path before anything is imported: a stray ~/json.py must not run as this.
PRELUDE = r'''
import sys; sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import contextlib, importlib, io, json, os, time, warnings
MARK = "SPARK-OPS-PREFLIGHT "
T0 = time.monotonic()


def answer(**kw):
    """Print the one result line and stop."""
    kw.setdefault("python", sys.executable)
    kw["program_seconds"] = time.monotonic() - T0
    sys.stdout.write("\n" + MARK + json.dumps(kw, default=str) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of torch & co (seconds, and nothing to keep)


def error_text(text):
    """argparse's own error line(s) without the usage block."""
    lines = text.strip().splitlines()
    for i, line in enumerate(lines):
        if ": error:" in line:
            return "\n".join(lines[i:]).strip()
    return "\n".join(lines[-5:]).strip() or "refused without a message"


def parse(parser, args, **extra):
    """Parse like the engine would; a refusal is answered with argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args)
    except SystemExit as exc:
        if exc.code in (0, None):
            answer(ok=None, error="the command line makes vLLM exit before serving (--help?)")
        answer(ok=False, stage="parse", error=error_text(err.getvalue()), **extra)
'''

# vLLM's own serve parser and config checks.
VLLM = r'''

def relative_missing(template):
    """True for a chat template that looks like a relative file path absent from here."""
    looks_like_path = "{" not in template and ("/" in template or template.endswith(".jinja"))
    return looks_like_path and not template.startswith("/") and not os.path.exists(template)


def field_problems(parser, ns):
    """Numbers outside the bounds (ge/gt/le/lt) of vLLM's config fields, checked at engine start.

    Only bounds: a field's type is not re-validated, since config classes convert some values
    (e.g. an attention backend name) in validators this check would not run.
    """
    try:
        import typing

        import pydantic
        import vllm.config as vc
    except Exception:
        return []
    bound_names = ("Ge", "Gt", "Le", "Lt")
    owners = {}
    for name in dir(vc):
        cls = getattr(vc, name, None)
        fields = getattr(cls, "__pydantic_fields__", None)
        if isinstance(cls, type) and name.endswith("Config") and isinstance(fields, dict):
            for key, info in fields.items():
                bounds = [m for m in info.metadata if type(m).__name__ in bound_names]
                owners.setdefault(key, []).append((name, bounds))
    problems = []
    for action in parser._actions:
        dest, flags = action.dest, [o for o in action.option_strings if o.startswith("--")]
        value = getattr(ns, dest, None)
        if not flags or dest not in owners or value == action.default:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        failures = []
        for cls_name, bounds in owners[dest]:
            if not bounds:
                break  # a field of that name without bounds: not ours to judge
            try:
                adapter = pydantic.TypeAdapter(typing.Annotated[(type(value), *bounds)])
                adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                failures.append(f"{exc.errors()[0].get('msg', exc)} ({cls_name}.{dest})")
            except Exception:
                break
        if failures and len(failures) == len(owners[dest]):
            problems.append(f"{flags[0]} {value!r}: " + "; ".join(failures))
    return problems


def config_rule(exc):
    """`Class: rule` when exc is a vLLM config class refusing its values (pydantic's error
    titled with the class), else None (the construction stopped for another reason)."""
    title = getattr(exc, "title", None)
    errors = getattr(exc, "errors", None)
    if not isinstance(title, str) or not title.endswith("Config") or not callable(errors):
        return None
    try:
        first = errors()[0]
        msg = str(first.get("msg") or exc).removeprefix("Value error, ")
    except Exception:
        msg = str(exc)
    return f"{title}: {msg}"


def given(parser, ns):
    """The dests the command line set to something else than the parser's default."""
    return {a.dest for a in parser._actions if getattr(ns, a.dest, a.default) != a.default}


def engine_config_problem(parser, ns, notes):
    """vLLM's own config construction and validators, as far as they go without weights.

    First the whole engine config (EngineArgs.create_engine_config: reads the model's config
    when it is at hand, loads no weights); a config class refusing its values is the answer.
    When that stops earlier (the model's config not here, no device), the config classes that
    need no model are built from the values given, and only a rule naming given values counts.
    """
    try:
        from vllm.engine.arg_utils import EngineArgs
        import vllm.config as vc
    except Exception as exc:
        notes.append(f"vLLM's config validators not run (cannot import them: {exc!r})")
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            EngineArgs.from_cli_args(ns).create_engine_config()
        return None
    except Exception as exc:
        rule = config_rule(exc)
        if rule is not None:
            return rule
        stopped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    dests = given(parser, ns)
    checked = []
    for name in ("SchedulerConfig", "CacheConfig"):
        cls = getattr(vc, name, None)
        fields = getattr(cls, "__dataclass_fields__", None)
        if cls is None or not isinstance(fields, dict):
            continue
        kwargs = {k: getattr(ns, k) for k in fields if k in dests and k != "max_model_len"}
        if not kwargs:
            continue
        if "max_model_len" in fields:
            kwargs["max_model_len"] = getattr(ns, "max_model_len", None) or 1
        if "is_encoder_decoder" in fields:
            kwargs["is_encoder_decoder"] = False
        checked.append(name)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                cls(**kwargs)
        except Exception as exc:
            rule = config_rule(exc)
            named = {k for k in fields if k in (rule or "")}
            if rule is not None and named and named <= dests:
                return rule
    notes.append(
        "vLLM's engine config was not built whole (" + stopped + "); checked without the model: "
        + (", ".join(checked) or "no config class had a value given")
    )
    return None


# Where vLLM keeps its serve parser, newest layout first; `vllm serve`'s own module imports all
# three names from wherever the installed version keeps them, so it is the last resort.
PARSER_HOMES = (
    "vllm.entrypoints.launchers.cli_args",
    "vllm.entrypoints.openai.cli_args",
    "vllm.entrypoints.cli.serve",
)
FLEXIBLE_HOMES = ("vllm.utils.argparse_utils", "vllm.utils", "vllm.entrypoints.cli.serve")


def find(name, homes):
    """The first module of homes that defines name: (object, module name), else (None, None)."""
    for home in homes:
        try:
            found = getattr(importlib.import_module(home), name, None)
        except ImportError:
            continue
        if found is not None:
            return found, home
    return None, None


def dist_version():
    """`<distribution> <version>` of what provides the vllm package, without importing it."""
    try:
        import importlib.metadata as md

        for name in sorted(md.packages_distributions().get("vllm") or []):
            return f"{name} {md.version(name)}"
    except Exception:
        pass
    return None


def main():
    """Build vLLM's serve parser as the installed version does and check ARGS with it; asked for
    its option strings instead, answer those (a KNOWN version at once, from the package metadata,
    without importing vLLM)."""
    version = None if KNOWN is None else dist_version()
    metadata = version is not None  # a version the package metadata names (cacheable)
    if metadata and version in KNOWN:
        answer(ok=True, version=version, cached=True, metadata=True)
    try:
        import vllm

        release = getattr(vllm, "__version__", None)
        version = version or (release if KNOWN is None else f"vllm {release or '?'}")
        make, home = find("make_arg_parser", PARSER_HOMES)
        flexible, _ = find("FlexibleArgumentParser", FLEXIBLE_HOMES)
        module = importlib.import_module(home) if home else None
        validate = getattr(module, "validate_parsed_serve_args", None)
    except Exception as exc:
        answer(ok=None, version=version, error=f"cannot import vLLM's serve parser: {exc!r}")
    if make is None or flexible is None:
        named = f"vLLM {version}" if KNOWN is None else version
        answer(ok=None, version=version, error=f"{named} has no make_arg_parser here")
    imported = time.monotonic() - T0
    info = {"version": version, "import_seconds": imported, "parser_module": home}
    parser = make(flexible(prog="vllm serve"))
    if KNOWN is not None:
        options = sorted({o for a in parser._actions for o in a.option_strings})
        abbrev = bool(parser.allow_abbrev)
        answer(ok=True, options=options, abbrev=abbrev, metadata=metadata, **info)
    ns = parse(parser, ARGS, **info)
    if getattr(ns, "model_tag", None):
        ns.model = ns.model_tag  # as `vllm serve` does before it validates
    template = getattr(ns, "chat_template", None)
    if isinstance(template, str) and relative_missing(template):
        info["notes"] = [
            f"--chat-template {template}: a relative path not found from {os.getcwd()}; "
            "not checked (the engine resolves it from its own working directory)"
        ]
        ns.chat_template = None
    if validate is not None:
        try:
            validate(ns)
        except Exception as exc:
            answer(ok=False, stage="validate", error=f"{type(exc).__name__}: {exc}", **info)
    problems = field_problems(parser, ns)
    if problems:
        answer(ok=False, stage="config", error="; ".join(problems), **info)
    notes = info.setdefault("notes", [])
    rule = engine_config_problem(parser, ns, notes)
    if rule is not None:
        answer(ok=False, stage="engine-config", error=rule, **info)
    answer(ok=True, **info)


main()
'''

# The simulated engine's parser (the embedded cluster's `vllm`).
SIM = r'''

def main():
    """Check ARGS with the simulated engine's own `vllm serve` parser; asked for its option
    strings instead, answer those (a KNOWN version at once)."""
    try:
        from spark_ops.sim.engine_args import parse_serve_args, serve_options
        from spark_ops.sim.engine_config import cfg_get, load_config
    except Exception as exc:
        answer(ok=None, error=f"cannot import the sim engine: {type(exc).__name__}: {exc}")
    path = None
    for i, tok in enumerate(ARGS):
        if tok == "--sim-config" and i + 1 < len(ARGS):
            path = ARGS[i + 1]
        elif tok.startswith("--sim-config="):
            path = tok.split("=", 1)[1]
    try:
        cfg = load_config(path)
        version = str(cfg_get(cfg, "vllm_version"))
    except Exception as exc:
        answer(ok=None, error=f"the sim engine's config: {getattr(exc, 'message', exc)}")
    if KNOWN is not None:
        version = "sim " + version
        if version in KNOWN:
            answer(ok=True, version=version, cached=True)
        answer(ok=True, version=version, options=serve_options(cfg), abbrev=True)
    info = {"version": version, "import_seconds": time.monotonic() - T0}

    class Parser:
        """Adapter: parse_args runs the sim engine's full argument handling."""

        def parse_args(self, args):
            """Parse like `python -m spark_ops.sim.engine serve` does."""
            return parse_serve_args(cfg, args)

    parse(Parser(), ARGS, **info)
    answer(ok=True, **info)


main()
'''
