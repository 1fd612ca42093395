"""Render a recipe as run-recipe does: one str.format pass, then the command split as bash would."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spark_ops.errors import KnobError, RecipeError, SparkOpsError, UnsupportedRecipe
from spark_ops.recipe.dialect import Dialect, detect_dialect
from spark_ops.recipe.flags import joined_value, resolve_flag, takes_inline_value
from spark_ops.recipe.knobs import (
    backend_from_legacy_env,
    parse_kv_cache_memory,
    parse_max_num_seqs,
)
from spark_ops.recipe.source import (
    SECOND_COMMAND_HINT,
    Token,
    load_recipe_text,
    prelude_end,
    scan_shell,
)
from spark_ops.recipe.sparkrun_render import IncludeReader, build_command, load_chain

_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


@dataclass
class Option:
    """One option of a `vllm serve` command: canonical name, its words and value."""

    name: str
    spelled: str
    flag: Token
    value: str | None  # None for a bare flag
    value_token: Token | None  # the separate value word (`--flag value`)
    inline: bool  # `--flag=value` (or a one-letter option's joined value, `-n2`)


def serve_index(words: list[str]) -> int | None:
    """Index of the word after `vllm serve` (skipping `exec` and VAR=value), else None."""
    i = 0
    while i < len(words) and (words[i] == "exec" or re.match(r"^[A-Za-z_]\w*=", words[i])):
        i += 1
    if i + 1 < len(words) and words[i].rsplit("/", 1)[-1] == "vllm" and words[i + 1] == "serve":
        return i + 2
    return None


def is_option(word: str) -> bool:
    """Whether a word is an option (starts with '-', not a negative number)."""
    return len(word) > 1 and word.startswith("-") and not _NUMBER.match(word)


def parse_options(tokens: list[Token], start: int) -> list[Option]:
    """Options after index `start`: `--f=v`, `--f v`, bare `--f` (positionals skipped), each
    named as vLLM's parser resolves it (flags.resolve_flag; RecipeError naming an ambiguous one)."""
    options: list[Option] = []
    i = start
    while i < len(tokens):
        tok = tokens[i]
        if not is_option(tok.value):
            i += 1
            continue
        joined = joined_value(tok.value)
        if joined is not None:  # `-n2`: a one-letter option and its value in one word
            options.append(Option(resolve_flag(joined[0]), joined[0], tok, joined[1], None, True))
        elif takes_inline_value(tok.value):
            name, value = tok.value.split("=", 1)
            options.append(Option(resolve_flag(name), name, tok, value, None, True))
        elif i + 1 < len(tokens) and not is_option(tokens[i + 1].value):
            nxt = tokens[i + 1]
            options.append(Option(resolve_flag(tok.value), tok.value, tok, nxt.value, nxt, False))
            i += 1
        else:
            options.append(Option(resolve_flag(tok.value), tok.value, tok, None, None, False))
        i += 1
    return options


def effective_args(options: list[Option]) -> dict[str, object]:
    """Effective flags, last wins: values as strings, bare flags True, `--no-x` as `--x`: False."""
    args: dict[str, object] = {}
    for opt in options:
        if opt.value is None and opt.name.startswith("--no-"):
            args["--" + opt.name[5:]] = False
        else:
            args[opt.name] = True if opt.value is None else opt.value
    return args


@dataclass
class Rendered:
    """A recipe rendered for launch: argv of the command, env, model and container."""

    source: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    container: str | None = None
    defaults: dict[str, object] = field(default_factory=dict)
    dialect: str = Dialect.EUGR.value
    runtime: str = "vllm"
    chain: list[str] = field(default_factory=list)  # include bases, outermost first
    notes: list[str] = field(default_factory=list)

    def is_vllm_serve(self) -> bool:
        """Whether the command is a `vllm serve` invocation."""
        return serve_index(self.argv) is not None

    def options(self) -> list[Option]:
        """The options of the `vllm serve` command; UnsupportedRecipe for other commands."""
        start = serve_index(self.argv)
        if start is None and self.runtime != "vllm":
            raise UnsupportedRecipe(
                f"{self.source}: runtime {self.runtime!r}: its command is not `vllm serve`; "
                "spark-ops reads and edits vLLM flags only"
            )
        if start is None:
            raise UnsupportedRecipe(
                f"{self.source}: command is not `vllm serve` (it starts "
                f"{' '.join(self.argv[:2])!r}); spark-ops cannot read or edit its flags"
            )
        tokens = [Token(word, word, 0, 0) for word in self.argv]
        try:
            return parse_options(tokens, start)
        except RecipeError as exc:
            raise type(exc)(f"{self.source}: {exc.message}", hint=exc.hint) from None

    def args(self) -> dict[str, object]:
        """Effective flags of the `vllm serve` command (last wins)."""
        return effective_args(self.options())

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json output."""
        return {
            "source": self.source,
            "argv": self.argv,
            "env": self.env,
            "model": self.model,
            "container": self.container,
            "dialect": self.dialect,
            "runtime": self.runtime,
            "include_chain": self.chain,
            "notes": self.notes,
        }


def format_command(command: str, defaults: dict[str, object], *, source: str) -> str:
    """Fill `{placeholders}` from defaults with one str.format pass; RecipeError naming the key."""
    try:
        return command.format(**{str(k): v for k, v in defaults.items()})
    except KeyError as exc:
        key = exc.args[0]
        raise RecipeError(
            f"{source}: command uses placeholder {{{key}}} but 'defaults' has no key {key!r}",
            hint=f"add `{key}: <value>` under defaults, or write literal braces as {{{{ }}}}",
        ) from exc
    except (IndexError, ValueError) as exc:
        raise RecipeError(
            f"{source}: command cannot be formatted ({exc}); placeholders must be named "
            "({name}) and literal braces doubled ({{ }})"
        ) from exc


def env_value(value: object) -> str:
    """An env mapping value as the process would see it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def prelude_notes(command: str, source: str) -> list[str]:
    """A note naming the fixed lines a command runs before its `vllm serve`, if any."""
    at = prelude_end(command)
    if not at:
        return []
    lines = [line.strip() for line in command[:at].splitlines() if line.strip()]
    return [
        f"{source}: the command runs {len(lines)} line(s) before `vllm serve` as written "
        f"(first: {lines[0][:60]!r}); spark-ops reads and edits the `vllm serve` command only"
    ]


def render_recipe(text: str, *, source: str, includes: IncludeReader | None = None) -> Rendered:
    """Render a recipe of either dialect into argv as bash would split it; env, model, image.

    `includes` reads a sparkrun `include:` base (none given: such a recipe is refused)."""
    data = load_recipe_text(text, source=source)
    if detect_dialect(data, source=source) is Dialect.SPARKRUN:
        return render_sparkrun(text, source=source, includes=includes)
    defaults = data.get("defaults") or {}
    command = format_command(str(data["command"]), defaults, source=source).rstrip()
    if command.endswith("\\"):
        # run-recipe drops a trailing continuation (and the blank it would join) before it runs
        command = command.rstrip("\\\n").rstrip()
    notes = prelude_notes(command, source)
    try:
        scan = scan_shell(command, prelude_end(command))
    except RecipeError as exc:
        raise type(exc)(f"{source}: {exc.message}", hint=exc.hint) from None
    if scan.rest_start is not None:
        why = scan.second_command(lambda at: command.count("\n", 0, at) + 1, "command line")
        raise UnsupportedRecipe(f"{source}: {why}", hint=SECOND_COMMAND_HINT)
    env = {str(k): env_value(v) for k, v in (data.get("env") or {}).items()}
    model = data.get("model")
    container = data.get("container")
    rendered = Rendered(
        source=source,
        argv=[tok.value for tok in scan.tokens],
        env=env,
        model=None if model is None else str(model),
        container=None if container is None else str(container),
        defaults=dict(defaults),
        notes=notes,
    )
    rendered.notes += option_notes(rendered)
    return rendered


def render_sparkrun(text: str, *, source: str, includes: IncludeReader | None) -> Rendered:
    """A sparkrun v2 recipe rendered as sparkrun's loader does for a solo launch."""
    chain = load_chain(text, source=source, reader=includes)
    data = chain.merged
    built = build_command(data, source=source)
    scan = scan_shell(built.text, prelude_end(built.text))
    if scan.rest_start is not None:
        why = scan.second_command(lambda at: built.text.count("\n", 0, at) + 1, "command line")
        raise UnsupportedRecipe(
            f"{source}: {why}; sparkrun would run only the first as the server",
            hint=SECOND_COMMAND_HINT,
        )
    notes = prelude_notes(built.text, source) + [
        f"{source}: placeholder {{{name}}} has no value; sparkrun passes it literally"
        for name in built.literal_placeholders
    ]
    if data.get("overrides"):
        notes.append(
            f"{source}: 'overrides:' layers apply at launch when their conditions match; "
            "shown are the declared values"
        )
    model, container = data.get("model"), data.get("container")
    rendered = Rendered(
        source=source,
        argv=[tok.value for tok in scan.tokens],
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        model=None if model is None else str(model),
        container=None if container is None else str(container),
        defaults=dict(data.get("defaults") or {}),
        dialect=Dialect.SPARKRUN.value,
        runtime=built.family,
        chain=[layer.source for layer in chain.layers[:-1]],
        notes=notes,
    )
    rendered.notes += option_notes(rendered)
    return rendered


def option_notes(rendered: Rendered) -> list[str]:
    """Notes on options vLLM reads other than they look: one given several times (under any
    spelling; the last wins), or an abbreviation of several options (vLLM refuses to start)."""
    if rendered.runtime != "vllm" or not rendered.is_vllm_serve():
        return []
    try:
        options = rendered.options()
    except RecipeError as exc:
        return [exc.message]
    seen: dict[str, list[Option]] = {}
    for opt in options:
        negated = opt.value is None and opt.name.startswith("--no-")
        base = "--" + opt.name[5:] if negated else opt.name
        seen.setdefault(base, []).append(opt)
    notes = []
    for name, given in seen.items():
        if len(given) > 1:
            words = ", ".join(
                opt.spelled
                if opt.value is None
                else f"{opt.spelled}{'=' if opt.inline else ' '}{opt.value}"
                for opt in given
            )
            notes.append(
                f"{rendered.source}: {name} is given {len(given)} times ({words}); vLLM takes "
                f"the last: {rendered.args().get(name)}"
            )
    return notes


def knob_values(
    text: str, *, source: str, includes: IncludeReader | None = None
) -> dict[str, object]:
    """Current values of the four knobs as vLLM would see them (None: not set, vLLM default)."""
    return rendered_knobs(render_recipe(text, source=source, includes=includes))


class Renderings:
    """Each distinct recipe text rendered once: the rendering, or the error it raised, kept by
    text. A plan holds one (Plan.rendered); the edit's check, the knobs, preflight and the KV
    warning all take their commands from it, so no text of a plan is rendered twice."""

    def __init__(self) -> None:
        """Nothing rendered yet."""
        self._done: dict[str, Rendered | SparkOpsError] = {}

    def render(self, text: str, *, source: str) -> Rendered:
        """The text rendered (the first time it is asked for; `source` names it then)."""
        found = self._done.get(text)
        if found is None:
            try:
                found = render_recipe(text, source=source)
            except SparkOpsError as exc:
                found = exc
            self._done[text] = found
        if isinstance(found, SparkOpsError):
            raise found
        return found

    def knobs(self, text: str, *, source: str) -> dict[str, object]:
        """The four knobs of the text (knob_values), from its one rendering."""
        return rendered_knobs(self.render(text, source=source))


def rendered_knobs(rendered: Rendered) -> dict[str, object]:
    """The four knobs of a recipe rendered once already (errors name its source)."""
    source = rendered.source
    if rendered.runtime != "vllm":
        raise UnsupportedRecipe(
            f"{source}: runtime {rendered.runtime!r}: max_num_seqs, kv_cache_memory, "
            "moe_backend and enforce_eager are vLLM knobs; spark-ops does not read them here"
        )
    args = rendered.args()
    seqs = args.get("--max-num-seqs")
    kv = args.get("--kv-cache-memory-bytes")
    moe = args.get("--moe-backend")
    try:
        values: dict[str, object] = {
            "max_num_seqs": None
            if not isinstance(seqs, str)
            else parse_max_num_seqs(seqs, check_range=False),
            "kv_cache_memory_bytes": None
            if not isinstance(kv, str)
            else parse_kv_cache_memory(kv, check_range=False),
        }
    except KnobError as exc:
        raise KnobError(f"{source}: {exc.message}", hint=exc.hint) from exc
    values["moe_backend"] = moe if isinstance(moe, str) else backend_from_legacy_env(rendered.env)
    values["enforce_eager"] = args.get("--enforce-eager") is True
    return values
