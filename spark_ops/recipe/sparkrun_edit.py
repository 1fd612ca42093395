"""Minimal-diff edits of sparkrun v2 recipes, with the file that holds each knob named.

A recipe with `command:` is edited as a run-recipe one is (the flag in the command, or the
`defaults` key its `{placeholder}` reads). A recipe without `command:` is edited through
`defaults`, for keys sparkrun's flag map renders; any other key is refused by name, since
sparkrun would drop it without a word. With `include:`, the edit lands in the file whose
value wins in the merge (the including file, or a base), and the merged recipe is rendered
to check it. SGLang recipes refuse the vLLM knobs, naming SGLang's own flag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spark_ops.errors import KnobError, UnsupportedRecipe
from spark_ops.recipe.changes import Change
from spark_ops.recipe.command import (
    CommandView,
    Edit,
    apply_edits,
    entry_edit,
    mapping_insert,
    yaml_scalar,
)
from spark_ops.recipe.diff import check_rendered
from spark_ops.recipe.editor import Editor, RecipeEdit, placeholder_of, version_for
from spark_ops.recipe.flags import dashed, resolve_flag
from spark_ops.recipe.knobs import (
    KNOBS,
    validate_moe_backend,
)
from spark_ops.recipe.render import Rendered, Renderings, render_recipe
from spark_ops.recipe.source import RecipeText
from spark_ops.recipe.sparkrun_maps import (
    KNOB_DEFAULTS_KEYS,
    SGLANG_KNOB_FLAGS,
    VLLM_BOOL_KEYS,
    VLLM_FLAG_MAP,
    VLLM_NEGATABLE_KEYS,
)
from spark_ops.recipe.sparkrun_render import Chain, IncludeReader, Layer, load_chain, runtime_family

#: Command-less keys spark-ops leaves to the user: they choose sparkrun's runtime, not a flag.
_HAND_ONLY = {"distributed_executor_backend": "it selects sparkrun's runtime (vllm-ray or not)"}


@dataclass
class FileEdit:
    """An edit of one file of a recipe's include chain: which file, why, and the edit."""

    target: str
    edit: RecipeEdit
    reasons: list[str]

    def to_dict(self) -> dict[str, object]:
        """Serialize for --json output."""
        return {"file": self.target, "why": self.reasons, **self.edit.to_dict()}


def edit_sparkrun(
    text: str,
    changes: Sequence[Change],
    *,
    source: str,
    vllm_version: str | None = None,
    includes: IncludeReader | None = None,
    renders: Renderings | None = None,
) -> FileEdit:
    """Apply changes to a sparkrun recipe (and its bases); the edit lands in one file
    (`renders`: the plan's renderings, used for a recipe without bases)."""
    chain = load_chain(text, source=source, reader=includes)
    family = runtime_family(chain.merged)
    for change in changes:
        _refuse_other_runtime(change, family, source)
    version, version_warnings = version_for(chain.merged.get("container"), source, vllm_version)
    targets: dict[str, list[str]] = {}
    keys: dict[Change, str] = {}
    for change in changes:
        layer, why, key = _landing(chain, change, source)
        targets.setdefault(layer.source, []).append(why)
        if key is not None:
            keys[change] = key
    if len(targets) > 1:
        listed = "; ".join(f"{name}: {', '.join(why)}" for name, why in targets.items())
        raise UnsupportedRecipe(
            f"{source}: these changes land in {len(targets)} files ({listed}); spark-ops writes "
            "one file per edit",
            hint="run one `recipe set` per file",
        )
    target_source = next(iter(targets))
    layer = next(lay for lay in chain.layers if lay.source == target_source)
    editor = _SparkrunEditor(layer.text, layer.source, version, chain, keys)
    image = str(chain.merged.get("container") or "")
    editor.apply_all(changes, image, bool(vllm_version), version_warnings)
    _verify(chain, layer, editor.text, changes, source, version, renders)
    edit = RecipeEdit(editor.text, layer.text, editor.warnings, version)
    return FileEdit(layer.source, edit, targets[target_source])


def _refuse_other_runtime(change: Change, family: str, source: str) -> None:
    """The vLLM knobs (and any flag edit) are refused for a non-vLLM runtime, by name."""
    if family == "vllm":
        return
    if change.kind == "knob":
        theirs = SGLANG_KNOB_FLAGS.get(change.name) if family == "sglang" else None
        known = f"; SGLang's own flag is {theirs}" if theirs else ""
        raise UnsupportedRecipe(
            f"{source}: runtime {family!r}: {change.name} ({KNOBS[change.name].flag}) is a vLLM "
            f"knob, not a {family} flag{known}",
            hint="edit the recipe by hand for a non-vLLM runtime",
        )
    raise UnsupportedRecipe(
        f"{source}: runtime {family!r}: spark-ops edits vLLM recipes only ({change.describe()})"
    )


def _key_of(change: Change) -> str | None:
    """The sparkrun defaults key a change means, when it means one."""
    if change.kind == "knob":
        return KNOB_DEFAULTS_KEYS[change.name]
    if change.kind == "setting":
        return change.name
    name = resolve_flag(change.name)
    canon = name if not name.startswith("--no-") else "--" + name[5:]
    for key, flag in VLLM_FLAG_MAP.items():
        if dashed(flag) == canon:
            return key
    return None


def _landing(chain: Chain, change: Change, source: str) -> tuple[Layer, str, str | None]:
    """The layer a change is written to, why (the file that holds the knob), and the defaults
    key to set when that layer holds a placeholder's value but not the command."""
    data = chain.merged
    key = _key_of(change)
    if not data.get("command"):
        _check_structured(change, key, source)
        assert key is not None
        holder = chain.holder("defaults", key)
        if holder is not None:
            return holder, f"defaults.{key} is set in {holder.source}", None
        return chain.top, f"defaults.{key} added to {chain.top.source} (no command:)", None
    command_layer = chain.holder("command")
    assert command_layer is not None
    if change.kind == "setting":
        holder = chain.holder("defaults", change.name)
        if holder is not None:
            return holder, f"defaults.{change.name} is set in {holder.source}", change.name
    else:
        placeholder = _placeholder_key(command_layer, change)
        holder = chain.holder("defaults", placeholder) if placeholder else None
        if placeholder and holder is not None:
            why = f"{_flag_of(change)} reads {{{placeholder}}}, set in {holder.source}"
            return holder, why, placeholder if holder is not command_layer else None
    return command_layer, f"{_flag_of(change)} is in the command of {command_layer.source}", None


def _flag_of(change: Change) -> str:
    """The command-line flag a change is about."""
    if change.kind == "knob":
        return KNOBS[change.name].flag
    if change.kind == "setting":
        return resolve_flag("--" + change.name)
    return resolve_flag(change.name)


def _placeholder_key(layer: Layer, change: Change) -> str | None:
    """The `{key}` a flag's value reads in the command (only when every use is that key)."""
    view = CommandView(RecipeText(layer.text, source=layer.source), loose=True)
    names = (
        set(KNOBS[change.name].aliases) | {KNOBS[change.name].flag}
        if (change.kind == "knob")
        else {resolve_flag(change.name)}
    )
    keys: set[str | None] = set()
    found = view.find(sorted(names))
    for opt in found:
        keys.add(placeholder_of(opt))
    key = next(iter(keys)) if len(keys) == 1 else None
    uses = view.placeholder_uses(key) if key is not None else 0
    if key is not None and uses != len(found):
        raise UnsupportedRecipe(
            f"{layer.source}: {{{key}}} feeds other words of the command too ({uses} uses, "
            f"{len(found)} of them the value of {_flag_of(change)}): changing its value changes "
            "those words as well; spark-ops will not change both",
            hint="set the flag literally in the command by hand",
        )
    return key


def _check_structured(change: Change, key: str | None, source: str) -> None:
    """A command-less recipe takes only keys sparkrun's flag map renders; others refused."""
    what = change.describe()
    if key is None:
        raise UnsupportedRecipe(
            f"{source}: {what}: this recipe has no 'command:', so sparkrun builds the serve "
            f"command from its fixed flag map, which has no {change.name}: sparkrun would drop it",
            hint="add a `command:` template to the recipe to pass arbitrary flags",
        )
    if key not in VLLM_FLAG_MAP:
        raise UnsupportedRecipe(
            f"{source}: defaults.{key}: this recipe has no 'command:', and sparkrun's vLLM flag "
            f"map has no key {key!r}: sparkrun would drop it silently; nothing written",
            hint="add a `command:` template, or use a key of the flag map (docs/sparkrun.md)",
        )
    if key in _HAND_ONLY:
        raise UnsupportedRecipe(f"{source}: defaults.{key}: edit it by hand ({_HAND_ONLY[key]})")
    bare = change.kind == "flag" and change.value is None and not change.remove
    if bare and key not in VLLM_BOOL_KEYS:
        raise KnobError(f"{source}: {change.name} needs a value (defaults.{key})")


class _SparkrunEditor(Editor):
    """The run-recipe editor, with sparkrun's rules: no literal braces; command-less recipes."""

    loose = True

    def __init__(
        self, text: str, source: str, version: str, chain: Chain, keys: dict[Change, str]
    ) -> None:
        """Edit one layer of a chain; `keys`: changes that set a defaults key of this layer."""
        super().__init__(text, source, version)
        self.structured = not chain.merged.get("command")
        self.keys = keys

    def apply(self, change: Change) -> None:
        """Apply one change: defaults when the recipe (or this layer) has no command."""
        if isinstance(change.value, str) and ("{" in change.value or "}" in change.value):
            raise KnobError(
                f"{self.source}: {change.describe()}: braces in a value would be read as "
                "sparkrun placeholders; put the value under defaults and reference it",
            )
        rt = RecipeText(self.text, source=self.source)
        if self.structured:
            edits = self._structured(rt, change)
        elif change in self.keys and "command" not in rt:
            if change.kind == "knob" and change.name == "moe_backend":
                validate_moe_backend(change.value, self.version)
            entry = rt.entry("defaults", self.keys[change])
            assert entry is not None
            edits = [entry_edit(rt, entry, yaml_scalar(_text_value(change), entry.raw))]
        else:
            super().apply(change)
            return
        self.text = apply_edits(self.text, edits)

    def _structured(self, rt: RecipeText, change: Change) -> list[Edit]:
        """A command-less recipe: set, add or remove the defaults key sparkrun maps."""
        key = _key_of(change)
        assert key is not None
        if change.kind == "knob" and change.name == "moe_backend":
            validate_moe_backend(change.value, self.version)
        entry = rt.entry("defaults", key)
        if change.kind == "flag" and change.remove:
            if entry is None:
                return []
            return [(rt.offsets[entry.line], rt.offsets[entry.line + 1], "")]
        value = _text_value(change)
        if entry is not None:
            return [entry_edit(rt, entry, _scalar(value, entry.raw))]
        if value == "false" and key in VLLM_BOOL_KEYS and key not in VLLM_NEGATABLE_KEYS:
            return []  # absent is already off (sparkrun omits a false default-off boolean)
        line = f"{key}: {_scalar(value, None)}"
        return [mapping_insert(rt, "defaults", [line], before_command=False)]


def _text_value(change: Change) -> str:
    """A change's value as the text written into defaults."""
    if change.kind == "flag" and change.value is None:
        return "false" if change.name.startswith("--no-") else "true"
    if isinstance(change.value, bool):
        return "true" if change.value else "false"
    return str(change.value)


def _scalar(value: str, old_raw: str | None) -> str:
    """A YAML scalar for a defaults value: true/false stay booleans, else yaml_scalar."""
    if value in ("true", "false") and (old_raw is None or old_raw[:1] not in "'\""):
        return value
    return yaml_scalar(value, old_raw)


def _verify(
    chain: Chain,
    layer: Layer,
    new_text: str,
    changes: Sequence[Change],
    source: str,
    version: str,
    renders: Renderings | None,
) -> None:
    """Render the merged chain before and after: every change took effect, nothing else moved.

    A recipe without bases is its own text: rendered through `renders` (once per plan)."""
    if renders is not None and len(chain.layers) == 1:
        before = renders.render(layer.text, source=layer.source)
        after = renders.render(new_text, source=layer.source)
    else:
        before = _render(chain, layer, layer.text, source)
        after = _render(chain, layer, new_text, source)
    check_rendered(before, after, changes, version, "the command sparkrun renders")


def _render(chain: Chain, layer: Layer, text: str, source: str) -> Rendered:
    """Render the chain with one layer's text replaced."""
    texts = {lay.source: (text if lay is layer else lay.text) for lay in chain.layers}

    def reader(name: str, including: str) -> tuple[str, str]:
        """Serve the chain's own (possibly edited) texts."""
        index = [lay.source for lay in chain.layers].index(including)
        base = chain.layers[index - 1]
        return texts[base.source], base.source

    top = chain.top
    return render_recipe(texts[top.source], source=top.source, includes=reader)
