"""The model, engine, latency and tool-call option groups: one frozen attrs class per part of
llmsim (see :mod:`llmsim.options`; the server's group is in :mod:`.server`, the operator's in
:mod:`.control`)."""

from __future__ import annotations

import hashlib

import attrs

from llmsim.latency_profiles import PROFILE_NAMES
from llmsim.lora_modules import LoraModule, parse_lora_module
from llmsim.options.fields import (
    DEFAULT_MODEL,
    ConfigError,
    check_at_least_minus_one,
    check_at_least_one,
    check_block_size,
    check_latency_profile,
    check_non_negative,
    check_non_negative_or_unset,
    check_percent,
    check_positive,
    check_positive_or_unset,
    check_ranges,
    option,
)

__all__ = [
    "MAX_STD_DEV_FRACTION",
    "EngineOptions",
    "LatencyOptions",
    "ModelOptions",
    "ToolCallOptions",
]


@attrs.frozen(kw_only=True)
class ModelOptions:
    """The simulated model: its names, its context window, what it says."""

    name: str = option(
        DEFAULT_MODEL,
        key="model",
        metavar="NAME",
        help="base model name (the `root` of /v1/models); also read from SIM_MODEL",
    )
    served_model_name: tuple[str, ...] = option(
        (),
        metavar="NAME",
        shown_default="the --model name",
        help="names requests may use; the first is the one reported in responses",
    )
    max_model_len: int = option(
        32768,
        metavar="TOKENS",
        validator=check_positive,
        help="context window; max tokens are clamped to what the prompt leaves (400 if either alone exceeds it)",
    )
    max_logprobs: int = option(
        20,
        metavar="N",
        llmd=False,
        validator=check_at_least_minus_one,
        help="most logprobs a request may ask for per token (completions logprobs, top_logprobs); -1: the vocabulary",
    )
    max_output_volume: int = option(
        1_000_000,
        metavar="N",
        llmd=False,
        validator=check_positive,
        help="most n x max_tokens x (1 + top_logprobs) a request may ask for (max_tokens: what the prompt "
        "leaves when unset); beyond it, 400, so a small request cannot ask for a body of hundreds of MB",
    )
    mode: str = option(
        "random",
        choices=("random", "echo"),
        help="random: text from a built-in corpus; echo: the last user message back",
    )
    seed: int | None = option(
        None, metavar="INT", shown_default="unset, so each run differs", help="makes every output reproducible"
    )
    tokenizer: str | None = option(
        None,
        metavar="PATH",
        shown_default="the built-in simulated tokenizer",
        llmd=False,
        help="a local HF tokenizer.json, or a directory holding one (and the chat template beside it); "
        "never fetched from the network",
    )
    default_embedding_dimensions: int = option(
        384,
        metavar="N",
        validator=check_positive,
        help="/v1/embeddings: the model's embedding size (a vector's length without `dimensions`, and its maximum)",
    )

    vllm_version: str = option(
        "0.33.0",
        metavar="VERSION",
        llmd=False,
        help="the vLLM version simulated: /version and system_fingerprint report it",
    )
    enable_prompt_tokens_details: bool = option(
        False,
        llmd=False,
        help="usage.prompt_tokens_details ({cached_tokens, ...}), as vLLM's flag; null without it",
    )
    dataset_path: str | None = option(
        None,
        metavar="PATH",
        shown_default="unset: corpus text",
        help="answers from a SQLite dataset in llm-d-inference-sim's format (llmsim dataset build makes one)",
    )
    dataset_url: str | None = option(
        None,
        metavar="URL",
        shown_default="unset",
        help="where to download the dataset from when --dataset-path does not exist yet",
    )
    dataset_in_memory: bool = option(False, help="copy the whole dataset into memory at start-up")
    dataset_table_name: str = option("llmd", metavar="NAME", help="the dataset's table")
    enable_responses_store: bool = option(
        True,
        llmd=False,
        help="keep /v1/responses responses for GET and previous_response_id (vLLM: VLLM_ENABLE_RESPONSES_API_STORE=1)",
    )
    enable_scale_out: bool = option(
        True,
        llmd=False,
        help="serve the */render endpoints and POST /inference/v1/generate (llm-d serves them always; "
        "vLLM only with --enable-scale-out, else 403)",
    )
    lora_modules: tuple[str, ...] = option(
        (),
        metavar="MODULE",
        shown_default="none",
        help='LoRA adapters served from start-up: name=path or JSON {"name", "path", "base_model_name"}',
    )
    enable_lora: bool = option(
        False, llmd=False, help="LoRA support (vLLM's flag); on by itself with --lora-modules, as in llm-d"
    )

    def __attrs_post_init__(self) -> None:
        if not all(self.served_model_name):
            raise ConfigError("served-model-name", "names must not be empty")
        if self.dataset_url is not None and self.dataset_path is None:  # llm-d: pkg/common/config.go:633-639
            raise ConfigError("dataset-url", "dataset-path is required when dataset-url is set")
        if self.mode == "echo" and self.dataset_path is not None:
            raise ConfigError("dataset-path", "a dataset cannot be used in echo mode")
        names: set[str] = set(self.model_names)
        for text in filter(None, self.lora_modules):  # vLLM skips empty entries (cli_args.py:53-54)
            try:
                name = parse_lora_module(text).name
            except ValueError as exc:
                raise ConfigError("lora-modules", str(exc)) from None
            if name in names:  # what vLLM's init_static_loras refuses (models/serving.py:255-275)
                raise ConfigError("lora-modules", f"{name!r} is a served model name or another adapter's")
            names.add(name)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Names a request may use; the first is the one reported in responses."""
        return self.served_model_name or (self.name,)

    @property
    def display_model(self) -> str:
        return self.model_names[0]

    @property
    def lora_adapters(self) -> tuple[LoraModule, ...]:
        """The ``--lora-modules`` entries, read (checked at construction)."""
        return tuple(parse_lora_module(text) for text in self.lora_modules if text)

    @property
    def lora_enabled(self) -> bool:
        """vLLM needs ``--enable-lora``; llm-d-inference-sim has LoRA whenever adapters are given."""
        return self.enable_lora or any(self.lora_modules)

    @property
    def system_fingerprint(self) -> str:
        """vLLM's default (``--fingerprint-mode full``, one GPU) ``vllm-<version>-<hash8>``
        (vllm/entrypoints/serve/utils/fingerprint.py:48-84): ``hash8`` there is the
        head of the engine config's hash; here of the model's name and context window."""
        digest = hashlib.sha256(f"{self.name}:{self.max_model_len}".encode()).hexdigest()
        return f"vllm-{self.vllm_version}-{digest[:8]}"


@attrs.frozen(kw_only=True)
class EngineOptions:
    """Running slots, the waiting queue and the token budget of one engine step."""

    max_num_seqs: int = option(
        256, metavar="N", validator=check_positive, help="running slots: requests decoded together, one token per step"
    )
    max_waiting_queue_length: int = option(
        1000, metavar="N", validator=check_non_negative, help="requests that may wait for a slot; beyond that, 429"
    )
    max_num_queued_reqs: int | None = option(
        None,
        metavar="N",
        shown_default="unset, no cap",
        llmd=False,
        validator=check_non_negative_or_unset,
        help="vLLM's cap on requests in flight (running plus waiting); a request beyond it gets 503",
    )
    max_num_batched_tokens: int | None = option(
        None,
        metavar="TOKENS",
        shown_default="8192 or max-num-seqs if larger",
        llmd=False,
        validator=check_positive_or_unset,
        help="token budget of one engine step; long prompts prefill in chunks",
    )
    max_loras: int = option(
        1, metavar="N", validator=check_positive, help="LoRA adapters among the running requests at once; others wait"
    )
    max_cpu_loras: int | None = option(
        None,
        metavar="N",
        shown_default="max-loras",
        validator=check_positive_or_unset,
        help="adapters kept in CPU memory; checked (>= max-loras), otherwise unused",
    )
    enable_kvcache: bool = option(
        False, help="simulate the KV cache: prefix hits skip prefill, admission waits for free blocks"
    )
    kv_cache_size: int = option(1024, metavar="BLOCKS", validator=check_positive, help="KV blocks in the cache")
    block_size: int = option(
        16, metavar="TOKENS", validator=check_block_size, help="tokens per KV block: 8, 16, 32, 64 or 128"
    )
    hash_seed: str = option(
        "",
        metavar="SEED",
        shown_default="PYTHONHASHSEED, else empty",
        help="seed of the KV block hashes (routers must use the same one)",
    )
    mm_encoder_only: bool = option(
        False,
        help="P/E disaggregation's encoder pod: every answer is '!' x max_tokens (finish length) and chat and "
        "generate answers carry ec_transfer_params for their multimodal items",
    )
    global_cache_hit_threshold: float = option(
        0.0,
        metavar="RATE",
        validator=check_non_negative,
        help="with --enable-kvcache: requests whose prefix hit rate is below it (0..1) end at once, "
        "finish_reason cache_threshold; a request's cache_hit_threshold wins",
    )

    def __attrs_post_init__(self) -> None:
        if self.global_cache_hit_threshold > 1.0:  # llm-d-inference-sim config.go:647-649
            raise ConfigError("global-cache-hit-threshold", f"must be in [0, 1], got {self.global_cache_hit_threshold}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max-num-batched-tokens",
                f"({self.max_num_batched_tokens}) must be >= max-num-seqs ({self.max_num_seqs}), as vLLM requires: "
                "every running sequence needs one token of each step's budget",
            )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:  # vllm/config/lora.py:121-127
            raise ConfigError(
                "max-cpu-loras", f"({self.max_cpu_loras}) must be >= max-loras ({self.max_loras}), as vLLM requires"
            )

    @property
    def batched_token_budget(self) -> int:
        """Tokens per engine step: max-num-batched-tokens, or by default
        max(8192, max-num-seqs) so that decoding never starves prefill."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(8192, self.max_num_seqs)


#: A standard deviation may be at most this fraction of its mean (llm-d-inference-sim's rule).
MAX_STD_DEV_FRACTION = 0.3


@attrs.frozen(kw_only=True)
class LatencyOptions:
    """llm-d-inference-sim's latency model: TTFT calculators, inter-token latency, jitter, load."""

    latency_profile: str = option(
        "",
        metavar="NAME",
        shown_default="none",
        llmd=False,
        validator=check_latency_profile,
        help="preset latency values (and max-num-seqs) of llm-d-inference-sim's manifests/latency-profiles, "
        "under every explicit setting: " + ", ".join(PROFILE_NAMES),
    )
    latency_calculator: str = option(
        "",
        choices=("", "constant", "per-token"),
        shown_default="automatic",
        help="how TTFT is computed; empty: per-token when --time-to-first-token and its std-dev are 0, else constant",
    )
    time_to_first_token: float = option(0.0, duration=True, help="mean time to the first token (constant calculator)")
    time_to_first_token_std_dev: float = option(
        0.0, duration=True, help="Gaussian jitter of the TTFT, at most 30% of it"
    )
    inter_token_latency: float = option(
        0.0, duration=True, help="mean time between two tokens of a stream (one engine step)"
    )
    inter_token_latency_std_dev: float = option(
        0.0, duration=True, help="Gaussian jitter of the inter-token latency, at most 30% of it"
    )
    prefill_overhead: float = option(0.0, duration=True, help="fixed part of the prefill time (per-token calculator)")
    prefill_time_per_token: float = option(
        0.0, duration=True, help="prefill time per uncached prompt token (per-token calculator)"
    )
    prefill_time_std_dev: float = option(0.0, duration=True, help="Gaussian jitter of the whole prefill time")
    kv_cache_transfer_latency: float = option(
        0.0, duration=True, help="TTFT of a request with do_remote_prefill (constant calculator)"
    )
    kv_cache_transfer_latency_std_dev: float = option(
        0.0, duration=True, help="Gaussian jitter of the KV-cache transfer latency, at most 30% of it"
    )
    kv_cache_transfer_time_per_token: float = option(
        0.0, duration=True, help="KV-cache transfer time per prompt token with do_remote_prefill (per-token calculator)"
    )
    kv_cache_transfer_time_std_dev: float = option(
        0.0, duration=True, help="Gaussian jitter of the per-token KV-cache transfer time"
    )
    time_factor_under_load: float = option(
        1.0,
        metavar="FACTOR",
        validator=check_at_least_one,
        help="latency multiplier at max-num-seqs running requests, rising linearly from 1 at one (>= 1)",
    )

    def __attrs_post_init__(self) -> None:
        for mean_name, sd_name in (
            ("time_to_first_token", "time_to_first_token_std_dev"),
            ("inter_token_latency", "inter_token_latency_std_dev"),
            ("kv_cache_transfer_latency", "kv_cache_transfer_latency_std_dev"),
        ):
            mean, sd = getattr(self, mean_name), getattr(self, sd_name)
            if sd > MAX_STD_DEV_FRACTION * mean + 1e-12:
                raise ConfigError(
                    sd_name.replace("_", "-"),
                    f"must be at most {MAX_STD_DEV_FRACTION:.0%} of {mean_name.replace('_', '-')} ({mean}s), got {sd}s",
                )


@attrs.frozen(kw_only=True)
class ToolCallOptions:
    """llm-d-inference-sim's tool-call knobs, with its defaults.

    They steer what :mod:`llmsim.model.tools` plans (how many calls) and what
    :mod:`llmsim.schema.jsonschema` generates (optional properties, number ranges,
    array lengths); explicit schema bounds always win over them.
    """

    min_tool_call_integer_param: int = option(
        0, metavar="N", help="smallest generated integer argument, unless the schema sets it"
    )
    max_tool_call_integer_param: int = option(
        100, metavar="N", help="largest generated integer argument, unless the schema sets it"
    )
    min_tool_call_number_param: float = option(
        0.0, metavar="X", help="smallest generated number argument, unless the schema sets it"
    )
    max_tool_call_number_param: float = option(
        100.0, metavar="X", help="largest generated number argument, unless the schema sets it"
    )
    min_tool_call_array_param_length: int = option(
        1,
        metavar="N",
        validator=check_non_negative,
        help="shortest generated array argument, unless the schema sets it",
    )
    max_tool_call_array_param_length: int = option(
        5, metavar="N", validator=check_non_negative, help="longest generated array argument, unless the schema sets it"
    )
    tool_call_not_required_param_probability: int = option(
        50, metavar="PERCENT", validator=check_percent, help="chance that an optional top-level argument is generated"
    )
    object_tool_call_not_required_field_probability: int = option(
        50,
        metavar="PERCENT",
        validator=check_percent,
        help="chance that an optional field of a nested object is generated",
    )
    tool_call_extra_call_probability: int = option(
        45,
        metavar="PERCENT",
        validator=check_percent,
        help="chance of one more tool call after each one (tool_choice auto/required)",
    )

    def __attrs_post_init__(self) -> None:
        check_ranges(
            self,
            (
                ("min_tool_call_integer_param", "max_tool_call_integer_param"),
                ("min_tool_call_number_param", "max_tool_call_number_param"),
                ("min_tool_call_array_param_length", "max_tool_call_array_param_length"),
            ),
        )
