"""sparkrun 0.4.2's flag maps (facts): how a recipe without `command:` becomes a serve command.

A sparkrun recipe without `command:` is built from `defaults` through a fixed map of keys to
engine flags; a key the map lacks is dropped without a word. These tables are the maps of
sparkrun 0.4.2 (runtimes/_vllm_common.py, runtimes/sglang.py); tests/test_sparkrun_oracle.py
checks them against the installed sparkrun.
"""

from __future__ import annotations

#: sparkrun's vLLM map, in its order (the order flags are emitted in).
VLLM_FLAG_MAP: dict[str, str] = {
    "port": "--port",
    "host": "--host",
    "tensor_parallel": "-tp",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "served_model_name": "--served-model-name",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "enforce_eager": "--enforce-eager",
    "enable_prefix_caching": "--enable-prefix-caching",
    "trust_remote_code": "--trust-remote-code",
    "distributed_executor_backend": "--distributed-executor-backend",
    "pipeline_parallel": "-pp",
    "data_parallel": "--data-parallel-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "otlp_traces_endpoint": "--otlp-traces-endpoint",
    "api_key": "--api-key",
    "attention_backend": "--attention-backend",
    "load_format": "--load-format",
    "reasoning_parser": "--reasoning-parser",
    "tool_call_parser": "--tool-call-parser",
    "chat_template": "--chat-template",
    "speculative_config": "--speculative-config",
    "tokenizer_mode": "--tokenizer-mode",
    "mm_encoder_tp_mode": "--mm-encoder-tp-mode",
    "block_size": "--block-size",
    "seed": "--seed",
    "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "enable_chunked_prefill": "--enable-chunked-prefill",
    "async_scheduling": "--async-scheduling",
    "generation_config": "--generation-config",
    "hf_overrides": "--hf-overrides",
    "compilation_config": "--compilation-config",
    "attention_config": "--attention-config",
    "model_loader_extra_config": "--model-loader-extra-config",
    "default_chat_template_kwargs": "--default-chat-template-kwargs",
    "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "mm_processor_cache_gb": "--mm-processor-cache-gb",
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "max_cudagraph_capture_size": "--max-cudagraph-capture-size",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "mamba_cache_mode": "--mamba-cache-mode",
    "mamba_cache_dtype": "--mamba-cache-dtype",
    "mamba_ssm_cache_dtype": "--mamba-ssm-cache-dtype",
    "reasoning_parser_plugin": "--reasoning-parser-plugin",
    "media_io_kwargs": "--media-io-kwargs",
    "video_pruning_rate": "--video-pruning-rate",
    "allowed_local_media_path": "--allowed-local-media-path",
    "prefix_match_unit": "--prefix-match-unit",
    "enable_mamba_shared_prefix_checkpoint": "--enable-mamba-shared-prefix-checkpoint",
    "safetensors_load_strategy": "--safetensors-load-strategy",
    "moe_backend": "--moe-backend",
    "enable_prompt_tokens_details": "--enable-prompt-tokens-details",
    "enable_force_include_usage": "--enable-force-include-usage",
    "enable_request_id_headers": "--enable-request-id-headers",
    "enable_flashinfer_autotune": "--enable-flashinfer-autotune",
    "linear_backend": "--linear-backend",
    "gdn_prefill_backend": "--gdn-prefill-backend",
    "gdn_decode_kernel": "--gdn-decode-kernel",
    "kda_prefill_backend": "--kda-prefill-backend",
    "mamba_backend": "--mamba-backend",
    "recurrent_checkpoint_policy": "--recurrent-checkpoint-policy",
    "prefix_cache_retention_interval": "--prefix-cache-retention-interval",
    "engram_config": "--engram-config",
    "dcp_comm_backend": "--dcp-comm-backend",
    "prefill_policy": "--prefill-policy",
    "prefill_compute_share": "--prefill-compute-share",
    "prefill_compute_half_life": "--prefill-compute-half-life",
    "prefill_schedule_interval": "--prefill-schedule-interval",
    "max_parallel_prefills": "--max-parallel-prefills",
    "decode_refill_target": "--decode-refill-target",
    "scheduler_reserve_full_isl": "--scheduler-reserve-full-isl",
    "jit_monitor_mode": "--jit-monitor-mode",
    "disable_custom_all_reduce": "--disable-custom-all-reduce",
}

#: Keys rendered as a bare flag when true (omitted when false).
VLLM_BOOL_KEYS = frozenset(
    {
        "async_scheduling",
        "disable_custom_all_reduce",
        "enable_auto_tool_choice",
        "enable_chunked_prefill",
        "enable_flashinfer_autotune",
        "enable_force_include_usage",
        "enable_mamba_shared_prefix_checkpoint",
        "enable_prefix_caching",
        "enable_prompt_tokens_details",
        "enable_request_id_headers",
        "enforce_eager",
        "scheduler_reserve_full_isl",
        "trust_remote_code",
    }
)

#: Boolean keys whose false renders as `--no-<flag>` (the engine turns them on by default).
VLLM_NEGATABLE_KEYS = frozenset(
    {
        "async_scheduling",
        "enable_chunked_prefill",
        "enable_flashinfer_autotune",
        "enable_prefix_caching",
        "scheduler_reserve_full_isl",
    }
)

#: Keys the structured builder emits itself (not through the map loop).
VLLM_SKIPPED_IN_LOOP = frozenset({"tensor_parallel", "distributed_executor_backend"})

#: sparkrun runtime names that run vLLM (the bare name resolves to one of the first two).
VLLM_RUNTIMES = frozenset({"vllm", "vllm-distributed", "vllm-ray", "eugr-vllm", "eugr-vllm-ray"})

#: The four spark-ops knobs: the sparkrun `defaults` key of each.
KNOB_DEFAULTS_KEYS = {
    "max_num_seqs": "max_num_seqs",
    "kv_cache_memory": "kv_cache_memory_bytes",
    "moe_backend": "moe_backend",
    "enforce_eager": "enforce_eager",
}

#: The four knobs on SGLang: its own flag where it has one (None: no counterpart).
SGLANG_KNOB_FLAGS: dict[str, str | None] = {
    "max_num_seqs": "--max-running-requests",
    "kv_cache_memory": None,
    "moe_backend": "--moe-runner-backend",
    "enforce_eager": "--disable-cuda-graph",
}


def parse_bool(value: object) -> bool:
    """A defaults value as sparkrun reads a boolean key: empty is false, else any 1, t or y."""
    if isinstance(value, bool):
        return value
    if not value:
        return False
    text = str(value).lower()
    return "1" in text or "t" in text or "y" in text
