"""How `vllm serve` reads an option's name: the one resolution every recipe reader uses.

vLLM's FlexibleArgumentParser turns `_` into `-` in a `--name` (up to its first `.`), then
argparse (allow_abbrev) takes an exact option string, else the one option a prefix starts, and
refuses a prefix that starts several ("ambiguous option"). Short options and long aliases name
their long option; a single-dash word is a prefix of the short options (`-t`), or a one-letter
option with its value joined (`-n2`), as argparse reads it. The option strings are vLLM
0.32.0's serve parser's (shipped in spark_ops/data/sim/vllm-serve-options.json);
tests/test_recipe_flags.py compares this resolution with the installed vLLM's own parser on a
table of spellings.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from spark_ops.errors import RecipeError

#: Short options and long aliases of vLLM 0.32.0's serve parser -> the long option each names
#: (facts of vLLM's arg_utils: one argparse action holds both strings).
OPTION_ALIASES = {
    "-h": "--help",
    "-asc": "--api-server-count",
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "--device-memory-utilization": "--gpu-memory-utilization",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
}


@functools.cache
def serve_options() -> frozenset[str]:
    """Every option string of vLLM 0.32.0's `vllm serve` parser (the shipped capture)."""
    text = resources.files("spark_ops.data").joinpath("sim", "vllm-serve-options.json")
    return frozenset(json.loads(text.read_text(encoding="utf-8"))["options"])


def dashed(name: str) -> str:
    """An option name as vLLM's parser rewrites it before argparse (`_` -> `-` up to the first
    `.` of a `--name`), a short option or alias as the long option it names; no prefix read."""
    if name.startswith("--"):
        head, dot, tail = name[2:].partition(".")
        name = "--" + head.replace("_", "-") + dot + tail
    head, dot, tail = name.partition(".")
    return OPTION_ALIASES.get(head, head) + dot + tail


def _short_hits(word: str) -> list[tuple[str, str | None]]:
    """argparse's reading of a single-dash word that is no option string: each short option the
    word starts (`-t` -> `-tp`), and the one-letter option it begins with its value joined
    (`-n2`, `-qfp8`), as (option, joined value); `-O…` is vLLM's own (`--optimization-level`)."""
    known = serve_options()
    if word in known or word.startswith(("--", "-O")) or len(word) < 2:
        return []
    hits: list[tuple[str, str | None]] = [
        (o, None) for o in sorted(known) if not o.startswith("--") and o.startswith(word)
    ]
    if len(word) > 2 and word[:2] in known:
        hits.append((word[:2], word[2:]))
    return hits


def joined_value(word: str) -> tuple[str, str] | None:
    """(option, value) of a one-letter option given with its value joined (`-n2`), else None."""
    if "=" in word and word.partition("=")[0] in serve_options():
        return None
    hits = _short_hits(word)
    if len(hits) == 1 and hits[0][1] is not None:
        return hits[0][0], hits[0][1]
    return None


def _refuse_ambiguous(word: str, hits: list[str]) -> RecipeError:
    """vLLM's refusal of an abbreviation several options start."""
    return RecipeError(
        f"{word} is an ambiguous abbreviation: vLLM's parser could match {', '.join(hits)}, "
        "and refuses to start (`ambiguous option`)",
        hint="write the option in full, as `vllm serve --help=all` lists it",
    )


def resolve_flag(name: str) -> str:
    """The option vLLM's serve parser takes `name` for: exact, else the one option a `--prefix`
    (or a `-prefix` of the short options) starts (an unknown name stays as written);
    RecipeError naming the candidates when several."""
    name = dashed(name)
    if name.startswith("-") and not name.startswith("--"):
        head, dot, tail = name.partition(".")
        short = _short_hits(head)
        if len(short) > 1:
            raise _refuse_ambiguous(head, [o for o, _ in short])
        return OPTION_ALIASES.get(short[0][0], short[0][0]) + dot + tail if short else name
    if len(name) == 2:
        return name
    head, dot, tail = name.partition(".")
    known = serve_options()
    if head in known:
        return name
    hits = sorted(o for o in known if o.startswith(head))
    if len(hits) > 1:
        raise _refuse_ambiguous(head, hits)
    return OPTION_ALIASES.get(hits[0], hits[0]) + dot + tail if hits else name


def takes_inline_value(word: str) -> bool:
    """Whether an option word carries its value after `=` (`--flag=v`, or a short `-tp=4`)."""
    name = word.partition("=")[0]
    return "=" in word and (word.startswith("--") or name in OPTION_ALIASES)
