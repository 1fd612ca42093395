"""Knob validation as vLLM parses it, and what each vLLM version knows (flags, MoE backends)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_ops.errors import KnobError, excerpt
from spark_ops.sizes import parse_human_int

#: Newest vLLM version whose knob facts are encoded here; assumed when no version is known.
NEWEST_KNOWN = "0.33"


@dataclass(frozen=True)
class KnobSpec:
    """How one knob is spelled on the command line (`aliases`: the names `--flag` input takes)."""

    name: str
    flag: str
    aliases: tuple[str, ...]
    boolean: bool = False


KNOBS: dict[str, KnobSpec] = {
    "max_num_seqs": KnobSpec("max_num_seqs", "--max-num-seqs", ("--max-num-seqs",)),
    "kv_cache_memory": KnobSpec(
        "kv_cache_memory",
        "--kv-cache-memory-bytes",
        ("--kv-cache-memory-bytes", "--kv-cache-memory"),
    ),
    "moe_backend": KnobSpec("moe_backend", "--moe-backend", ("--moe-backend",)),
    "enforce_eager": KnobSpec(
        "enforce_eager", "--enforce-eager", ("--enforce-eager",), boolean=True
    ),
}

#: Spellings of a knob's name accepted by `--set` and by knob_values.
KNOB_KEYS = {
    "max_num_seqs": "max_num_seqs",
    "kv_cache_memory": "kv_cache_memory",
    "kv_cache_memory_bytes": "kv_cache_memory",
    "moe_backend": "moe_backend",
    "enforce_eager": "enforce_eager",
}

_MOE_018 = (
    "auto",
    "triton",
    "deep_gemm",
    "cutlass",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
    "flashinfer_cutedsl",
    "marlin",
    "aiter",
)
_MOE_022 = (*_MOE_018, "flashinfer_b12x", "emulation")
_MOE_033 = (*_MOE_022, "b12x")

#: Environment variables that chose MoE kernels before `--moe-backend` (0.18).
LEGACY_MOE_ENV = (
    "VLLM_USE_FLASHINFER_MOE_FP4",
    "VLLM_NVFP4_GEMM_BACKEND",
    "VLLM_MXFP4_USE_MARLIN",
    "VLLM_TEST_FORCE_FP8_MARLIN",
)

#: Backend name -> the legacy env settings that select it (None: remove the variable).
LEGACY_MOE_SETTINGS: dict[str, dict[str, str | None]] = {
    "marlin": {
        "VLLM_USE_FLASHINFER_MOE_FP4": "0",
        "VLLM_NVFP4_GEMM_BACKEND": "marlin",
        "VLLM_MXFP4_USE_MARLIN": "1",
        "VLLM_TEST_FORCE_FP8_MARLIN": "1",
    },
    "cutlass": {
        "VLLM_USE_FLASHINFER_MOE_FP4": "0",
        "VLLM_NVFP4_GEMM_BACKEND": "cutlass",
        "VLLM_MXFP4_USE_MARLIN": "0",
        "VLLM_TEST_FORCE_FP8_MARLIN": "0",
    },
    "flashinfer_cutlass": {
        "VLLM_USE_FLASHINFER_MOE_FP4": "1",
        "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
        "VLLM_MXFP4_USE_MARLIN": "0",
        "VLLM_TEST_FORCE_FP8_MARLIN": "0",
    },
    "flashinfer_trtllm": {
        "VLLM_USE_FLASHINFER_MOE_FP4": "1",
        "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-trtllm",
        "VLLM_MXFP4_USE_MARLIN": "0",
        "VLLM_TEST_FORCE_FP8_MARLIN": "0",
    },
    "auto": dict.fromkeys(LEGACY_MOE_ENV),
}

# spark-ops writes sizes only in this plain form (no sign, space, underscore or non-ASCII digit).
_KV_RE = re.compile(r"^[0-9]+(?:\.[0-9]+)?[kKmMgGtT]?$")
_KV_ACCEPTED = (
    "a plain integer (bytes), or a number with one suffix: uppercase K M G T are binary "
    "(60G = 64424509440), lowercase k m g t decimal (60g = 60000000000); decimals only "
    "with a lowercase suffix (1.5g)"
)


#: No accelerator holds more than this per GPU (today's largest hold under 300 GB): a larger
#: KV cache size is a typo (a unit too many), refused before anything is written.
MAX_KV_CACHE_BYTES = 2 * 1024**4  # 2 TiB
#: vLLM's scheduler counts sequences in an int32; far below that no node has memory for them.
MAX_NUM_SEQS = 65536


def parse_kv_cache_memory(value: str, *, check_range: bool = True) -> int:
    """Parse a --kv-cache-memory-bytes value as vLLM does; KnobError shows the accepted forms.

    0 is refused (vLLM takes a falsy size as "unset" and sizes the cache itself, which is not
    what was asked), and so is a size above MAX_KV_CACHE_BYTES, which no node can hold.
    """
    size = _parse_kv_size(value)
    if not check_range:  # reading a recipe as it is (a 0 written before is shown, then fixed)
        return size
    if size <= 0:
        raise KnobError(
            f"--kv-cache-memory-bytes: {excerpt(value)} is 0 bytes; vLLM takes 0 as unset and "
            "sizes the cache itself",
            hint="give a size such as 60G, or --unset-flag --kv-cache-memory-bytes for vLLM's "
            "own sizing",
        )
    if size > MAX_KV_CACHE_BYTES:
        raise KnobError(
            f"--kv-cache-memory-bytes: {excerpt(value)} is {size:.3g} bytes, more than the "
            f"{MAX_KV_CACHE_BYTES // 1024**4} TiB any GPU holds",
            hint="e.g. 60G (binary) or 60g (decimal) per GPU",
        )
    return size


def _parse_kv_size(value: str) -> int:
    """The byte count a --kv-cache-memory-bytes value names (no range check)."""
    text = str(value).strip()
    if len(text) > 40:
        raise KnobError(
            f"--kv-cache-memory-bytes: {excerpt(value)} is not accepted; use {_KV_ACCEPTED}"
        )
    try:
        if not _KV_RE.match(text):
            raise ValueError(text)
        return parse_human_int(text)
    except ValueError:
        raise KnobError(
            f"--kv-cache-memory-bytes: {excerpt(value)} is not accepted; use {_KV_ACCEPTED}",
            hint="e.g. 60G, 60g, 1.5g or 64424509440",
        ) from None


def parse_max_num_seqs(value: object, *, check_range: bool = True) -> int:
    """Validate --max-num-seqs: a positive integer."""
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"\d{1,12}", text) or int(text) <= 0:
        raise KnobError(f"--max-num-seqs: {excerpt(value)} is not allowed; use a positive integer")
    if check_range and int(text) > MAX_NUM_SEQS:
        raise KnobError(
            f"--max-num-seqs: {int(text):,} is more than {MAX_NUM_SEQS:,}; no node holds the "
            "KV cache for so many sequences"
        )
    return int(text)


def parse_version(version: str) -> tuple[int, int, int]:
    """Parse '0.19.1', 'v0.26.0', '0.23.1rc1' or '0.26-dgfix' into (major, minor, patch)."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if not match:
        raise KnobError(f"vLLM version {version!r} is not understood; use e.g. 0.19.1")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def version_from_container(container: str) -> str | None:
    """Return the vLLM version a container tag names (vllm/vllm-openai:v0.19.1), else None."""
    if not container or "@" in container:
        return None
    name, _, tag = container.rpartition(":")
    if not name or "/" in tag or "vllm" not in name.lower():
        return None
    match = re.match(r"^v?(\d+\.\d+(?:\.\d+)?)(?:$|[-+._a-z])", tag)
    return match.group(1) if match else None


#: Images whose tag is the vLLM release itself (vLLM's own builds); any other tag is a guess.
_OFFICIAL_IMAGES = ("vllm/vllm-openai", "docker.io/vllm/vllm-openai")


def version_is_guessed(container: str) -> bool:
    """Whether a version read from this image's tag is only a guess (not vLLM's own image)."""
    name = container.rpartition(":")[0] if ":" in container.rpartition("/")[2] else container
    return name.lower() not in _OFFICIAL_IMAGES


def moe_backends(version: str) -> tuple[str, ...]:
    """Names `--moe-backend` accepts in this vLLM version (empty before 0.18)."""
    parsed = parse_version(version)
    if parsed < (0, 18, 0):
        return ()
    if parsed < (0, 22, 0):
        return _MOE_018
    if parsed < (0, 33, 0):
        return _MOE_022
    return _MOE_033


def has_moe_flag(version: str) -> bool:
    """Whether this vLLM version has the --moe-backend flag (0.18 and later)."""
    return parse_version(version) >= (0, 18, 0)


def validate_moe_backend(value: object, version: str) -> str:
    """Check a MoE backend name against what vLLM `version` knows; return it."""
    name = str(value).strip()
    if has_moe_flag(version):
        known = moe_backends(version)
        if name not in known:
            raise KnobError(
                f"--moe-backend: {name!r} is not a backend vLLM {version} knows; "
                f"allowed: {', '.join(known)}"
            )
        return name
    if name not in LEGACY_MOE_SETTINGS:
        raise KnobError(
            f"moe backend {name!r}: vLLM {version} has no --moe-backend flag and the legacy "
            f"environment variables can only select: {', '.join(LEGACY_MOE_SETTINGS)}"
        )
    return name


def legacy_env_warnings(env_keys: list[str], version: str) -> list[str]:
    """Warn about legacy MoE environment variables the given vLLM version deprecates or drops."""
    present = [key for key in LEGACY_MOE_ENV if key in env_keys]
    parsed = parse_version(version)
    if not present or parsed < (0, 22, 0):
        return []
    names = ", ".join(present)
    if parsed >= (0, 33, 0):
        return [
            f"env {names}: removed in vLLM 0.33; vLLM {version} only warns about "
            "unknown VLLM_* variables and ignores them (use --moe-backend)"
        ]
    return [f"env {names}: deprecated since vLLM 0.22 (server is {version}); use --moe-backend"]


def backend_from_legacy_env(env: dict[str, str]) -> str | None:
    """Best-effort reverse of LEGACY_MOE_SETTINGS: which backend the env selects, if clear."""
    for name, settings in LEGACY_MOE_SETTINGS.items():
        if name == "auto":
            continue
        if all(env.get(key) == val for key, val in settings.items()):
            return name
    if env.get("VLLM_MXFP4_USE_MARLIN") == "1" or env.get("VLLM_TEST_FORCE_FP8_MARLIN") == "1":
        return "marlin"
    if env.get("VLLM_USE_FLASHINFER_MOE_FP4") == "1":
        return "flashinfer_cutlass"
    return None
