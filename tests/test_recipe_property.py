"""Property: for random recipe shapes and valid knob values, edits are minimal and take effect."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ops.recipe import Change, edit_recipe, knob_values, parse_kv_cache_memory
from spark_ops.recipe.diff import lines_outside
from spark_ops.recipe.knobs import NEWEST_KNOWN, moe_backends

WORDS = {
    "max_num_seqs": ["max-num-seqs", "max_num_seqs"],
    "kv_cache_memory": ["kv-cache-memory", "kv_cache"],
    "moe_backend": ["moe-backend"],
    "enforce_eager": ["enforce-eager"],
}

SHAPES = {
    "max_num_seqs": [
        "",
        "--max-num-seqs {max_num_seqs}",
        "--max-num-seqs 5",
        "--max-num-seqs=5",
        "--max_num_seqs 5",
    ],
    "kv_cache_memory": [
        "",
        "--kv-cache-memory-bytes {kv_cache_memory_bytes}",
        "--kv-cache-memory 10G",
        "--kv-cache-memory-bytes=0.5g",
    ],
    "moe_backend": ["", "--moe-backend marlin", "--moe-backend=auto"],
    "enforce_eager": ["", "--enforce-eager", "--no-enforce-eager"],
}
FILLERS = [
    "--trust-remote-code",
    "--port {port}",
    "-tp 4 --distributed-executor-backend ray",
    '--compilation-config \'{{"cudagraph_mode":"piecewise"}}\'',
    "--default-chat-template-kwargs.thinking=true",
    "--enable-prefix-caching",
]

kv_values = st.one_of(
    st.integers(min_value=1, max_value=10**12).map(str),
    st.tuples(st.integers(1, 999), st.sampled_from("KMG")).map(lambda t: f"{t[0]}{t[1]}"),
    st.integers(1, 2).map(lambda n: f"{n}T"),  # past 2 TiB per GPU is refused
    st.tuples(st.integers(0, 999), st.integers(0, 99), st.sampled_from("kmgt"))
    .map(lambda t: f"{t[0]}.{t[1]}{t[2]}" if t[0] or t[1] else f"1{t[2]}")
    .filter(lambda v: parse_kv_cache_memory(v, check_range=False) <= 2 * 1024**4),
)


@st.composite
def recipes(draw: st.DrawFn) -> str:
    """A recipe with each knob in a random shape, random filler flags and comments."""
    lines = [draw(st.sampled_from(SHAPES[k])) for k in SHAPES]
    lines += draw(st.lists(st.sampled_from(FILLERS), max_size=4))
    lines = [line for line in draw(st.permutations(lines)) if line]
    indent = draw(st.sampled_from(["  ", "    ", "      "]))
    body = "".join(f"  {indent}{line} \\\n" for line in lines)
    last = draw(st.sampled_from(["--host {host}", "--served-model-name m"]))
    tail = draw(st.sampled_from(["", f"  {indent}# --max-num-seqs 1 (old)\n", "# end\n"]))
    head = draw(st.sampled_from(["", "# a recipe — with a comment\n"]))
    seqs_comment = draw(st.sampled_from(["", "   # tuned"]))
    return (
        f"{head}name: prop\ncontainer: vllm-node\ndefaults:\n  port: 8000\n  host: 0.0.0.0\n"
        f'  max_num_seqs: 6{seqs_comment}\n  kv_cache_memory_bytes: "2G"\n'
        f"command: |\n  vllm serve org/M \\\n{body}  {indent}{last}\n{tail}"
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=recipes(),
    knob=st.sampled_from(sorted(SHAPES)),
    seqs=st.integers(1, 4096),
    kv=kv_values,
    moe=st.sampled_from(moe_backends(NEWEST_KNOWN)),
    eager=st.booleans(),
)
def test_edit_is_minimal_and_takes_effect(
    text: str, knob: str, seqs: int, kv: str, moe: str, eager: bool
) -> None:
    """One knob edit touches only its lines and reads back as the requested value."""
    value: object = {"max_num_seqs": seqs, "kv_cache_memory": kv, "moe_backend": moe}.get(
        knob, eager
    )
    result = edit_recipe(text, [Change.knob(knob, value)], source="prop.yaml")
    assert lines_outside(text, result.text, WORDS[knob]) == []
    got = knob_values(result.text, source="prop.yaml")
    before = knob_values(text, source="prop.yaml")
    if knob == "kv_cache_memory":
        assert got["kv_cache_memory_bytes"] == parse_kv_cache_memory(kv)
    else:
        assert got[knob] == value
    for other in got:
        if other not in (knob, "kv_cache_memory_bytes" if knob == "kv_cache_memory" else knob):
            assert got[other] == before[other], other
