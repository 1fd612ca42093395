"""Diffs of recipe texts (unified, changed-line pairs) and the post-edit verification."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from spark_ops.errors import RecipeError, SparkOpsError
from spark_ops.recipe.changes import Change
from spark_ops.recipe.flags import resolve_flag
from spark_ops.recipe.knobs import KNOBS, LEGACY_MOE_SETTINGS, has_moe_flag
from spark_ops.recipe.render import Rendered, Renderings
from spark_ops.recipe.source import load_recipe_text


def unified_diff(old: str, new: str, path: str) -> str:
    """A unified diff of two texts (a/PATH, b/PATH), empty when equal."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _core(line: str) -> str:
    """A line without its trailing ` \\` continuation."""
    return line.rstrip().removesuffix("\\").rstrip()


def changed_line_pairs(old: str, new: str) -> list[tuple[str, str]]:
    """(old, new) pairs of changed lines ("" when absent); a pure ` \\` change is ignored."""
    a, b = old.split("\n"), new.split("\n")
    pairs: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        olds, news = a[i1:i2], b[j1:j2]
        for k in range(max(len(olds), len(news))):
            pair = (olds[k] if k < len(olds) else "", news[k] if k < len(news) else "")
            if pair[0] and pair[1] and _core(pair[0]) == _core(pair[1]):
                continue
            pairs.append(pair)
    return pairs


def lines_outside(old: str, new: str, words: list[str]) -> list[tuple[str, str]]:
    """Changed line pairs that mention none of `words` (empty when the edit stayed on them)."""
    return [
        (before, after)
        for before, after in changed_line_pairs(old, new)
        if not any(w in before or w in after for w in words)
    ]


def verify_edit(
    old: str,
    new: str,
    changes: Sequence[Change],
    source: str,
    version: str,
    renders: Renderings | None = None,
) -> None:
    """Check the new text keeps every other key and renders with each requested value (each
    text rendered through `renders`, the plan's, when given: once for the whole plan)."""
    before = load_recipe_text(old, source=source)
    after = load_recipe_text(new, source=source)
    for key in set(before) | set(after):
        if key not in ("defaults", "env", "command") and before.get(key) != after.get(key):
            raise RecipeError(f"{source}: internal: edit changed key {key!r}; nothing written")
    renders = Renderings() if renders is None else renders
    try:
        old_rendered = renders.render(old, source=source)
        old_rendered.args()
    except SparkOpsError:
        return
    rendered = renders.render(new, source=source)
    check_rendered(old_rendered, rendered, changes, version, "the rendered command")


def check_rendered(
    before: Rendered, after: Rendered, changes: Sequence[Change], version: str, what: str
) -> None:
    """The edited recipe, rendered (`what` names the rendering), shows every change and nothing
    else moved; RecipeError naming the recipe (nothing written) when not."""
    source = after.source
    args = after.args()
    check_others(before.args(), args, before.env, after.env, changes, source)
    for change in changes:
        if not took_effect(change, args, after.env, dict(after.defaults), version):
            raise RecipeError(
                f"{source}: internal: {change.describe()} did not take effect in {what}; "
                "nothing written"
            )


def check_others(
    old_args: dict[str, object],
    args: dict[str, object],
    old_env: dict[str, str],
    env: dict[str, str],
    changes: Sequence[Change],
    source: str,
) -> None:
    """Check that flags and env vars no change asked for kept their effective values."""
    if any(c.kind == "setting" for c in changes):
        return  # a defaults key may feed any number of flags
    allowed = {KNOBS[c.name].flag if c.kind == "knob" else resolve_flag(c.name) for c in changes}
    allowed |= {"--" + name[5:] for name in allowed if name.startswith("--no-")}
    for key in set(old_args) | set(args):
        if key not in allowed and old_args.get(key) != args.get(key):
            raise RecipeError(f"{source}: internal: edit changed {key} too; nothing written")
    legacy = set(LEGACY_MOE_SETTINGS["auto"]) if "--moe-backend" in allowed else set()
    for key in set(old_env) | set(env):
        if key not in legacy and old_env.get(key) != env.get(key):
            raise RecipeError(f"{source}: internal: edit changed env {key}; nothing written")


def took_effect(
    change: Change, args: dict[str, object], env: dict[str, str], defaults: dict, version: str
) -> bool:
    """Whether a rendered result shows a change (a bare `--no-x` shows as `--x` false)."""
    if change.kind == "setting":
        flag = resolve_flag("--" + change.name)
        if flag in args:
            return args[flag] == str(change.value)
        if change.name in defaults:
            return str(defaults[change.name]) == str(change.value) or _same_number(
                defaults[change.name], str(change.value)
            )
        return args.get(flag) == change.value
    if change.kind == "flag":
        name = resolve_flag(change.name)
        if name.startswith("--no-") and not change.remove and change.value is None:
            return args.get("--" + name[5:]) is False
        if change.remove and name.startswith("--no-"):
            return args.get("--" + name[5:]) is not False
        if change.remove:
            return args.get(name) in (None, False)
        return args.get(name) == (True if change.value is None else str(change.value))
    spec = KNOBS[change.name]
    if spec.boolean:
        return (args.get(spec.flag) is True) == bool(change.value)
    if change.name == "moe_backend" and not has_moe_flag(version):
        wanted = LEGACY_MOE_SETTINGS[str(change.value)]
        return all(env.get(k) == v for k, v in wanted.items() if v is not None)
    return args.get(spec.flag) == str(change.value)


def _same_number(value: object, text: str) -> bool:
    """Whether a YAML-loaded number equals the requested text numerically (0.90 vs 0.9)."""
    try:
        return float(str(value)) == float(text)
    except ValueError:
        return False
