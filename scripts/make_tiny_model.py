#!/usr/bin/env python3
"""Build a tiny causal LM (random weights, fixed seed) with a local byte-level BPE tokenizer.

No hub access: the config comes from `transformers` classes, the tokenizer is trained with
`tokenizers` on text generated here. Run it with the ground venv's Python (torch, transformers,
tokenizers):

    /opt/spark-ops-vllm/bin/python scripts/make_tiny_model.py --kind llama --out DIR
    /opt/spark-ops-vllm/bin/python scripts/make_tiny_model.py --kind moe --out DIR
    /opt/spark-ops-vllm/bin/python scripts/make_tiny_model.py --kind llama --layers 8 --out DIR

Kinds: `llama` (dense LlamaForCausalLM: hidden 128, 2 layers, 4 heads, 2 KV heads, head_dim 32)
and `moe` (Qwen3MoeForCausalLM: same attention, 4 experts, 2 active per token). `--layers 8`
makes a deeper model whose decode step costs more per step and about as much per sequence: the
throughput test uses it, so that batching shows on a CPU (see docs/test-ground.md). The directory is
built beside `DIR` and renamed into place, so a finished `DIR/config.json` means a complete model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIAL_TOKENS = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, PAD = "<|begin_of_text|>", "<|im_end|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SYLLABLES = [
    "ka", "ro", "mi", "tel", "spa", "rk", "no", "de", "vel", "lum", "gra", "phi", "ton", "qu", "ex",
    "ba", "zi", "or", "un", "che", "sto", "ne", "wa", "fy", "lo", "tri", "dan", "ve", "is", "ma",
]  # fmt: skip
TOPICS = [
    "node",
    "cluster",
    "token",
    "cache",
    "restart",
    "kernel",
    "batch",
    "recipe",
    "model",
    "seq",
]


def corpus(seed: int, lines: int = 4000) -> Iterator[str]:
    """Yield deterministic pseudo-text: invented words, numbers, punctuation, chat-shaped lines."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(600)] + TOPICS
    for i in range(lines):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 16)))
        if i % 7 == 0:
            sentence += f" {rng.randint(0, 99999)} {rng.random():.3f}"
        sentence = sentence.capitalize() + rng.choice([".", "?", "!", ",", ":"])
        if i % 5 == 0:
            role = rng.choice(["user", "assistant", "system"])
            sentence = f"<|im_start|>{role}\n{sentence}<|im_end|>"
        yield sentence


def train_tokenizer(seed: int, vocab_size: int) -> Any:
    """Train a byte-level BPE tokenizer on generated text; return a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def model_config(kind: str, vocab_size: int, ids: dict[str, int], layers: int = 2) -> Any:
    """Return the transformers config of the tiny model of this kind."""
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
    }
    if kind == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if kind == "moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    raise SystemExit(f"--kind {kind!r} not allowed: llama or moe")


def build(kind: str, out: Path, *, seed: int, vocab_size: int, layers: int = 2) -> Path:
    """Build the model directory out (tokenizer, config, safetensors weights); return it."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = train_tokenizer(seed, vocab_size)
    ids = {
        "bos": tokenizer.convert_tokens_to_ids(BOS),
        "eos": tokenizer.convert_tokens_to_ids(EOS),
        "pad": tokenizer.convert_tokens_to_ids(PAD),
    }
    config = model_config(kind, len(tokenizer), ids, layers)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    provenance = {
        "kind": kind,
        "layers": layers,
        "seed": seed,
        "vocab_size": len(tokenizer),
        "parameters": params,
    }
    (tmp / "spark-ground.json").write_text(json.dumps(provenance, indent=2) + "\n")
    for path in [tmp, *tmp.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and build one tiny model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kind", choices=["llama", "moe"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2, choices=range(1, 33), metavar="1..32")
    args = parser.parse_args(argv)
    out = build(
        args.kind,
        args.out.resolve(),
        seed=args.seed,
        vocab_size=args.vocab_size,
        layers=args.layers,
    )
    info = json.loads((out / "spark-ground.json").read_text())
    sys.stderr.write(f"built {out}: {info}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
