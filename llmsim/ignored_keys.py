"""The vLLM and llm-d-inference-sim keys llmsim accepts, notes and ignores.

Listed one by one so that launch commands and YAML files written for vLLM or
llm-d-inference-sim keep working, while a misspelt key still stops start-up.  The loader
(:mod:`llmsim.config`) and the CLI read :data:`IGNORED_KEYS`.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["IGNORED_KEYS", "IgnoredKey"]


@attrs.frozen
class IgnoredKey:
    """A vLLM or llm-d-inference-sim key that llmsim accepts, notes and ignores.

    Listed one by one so that launch commands and YAML files written for vLLM or
    llm-d-inference-sim keep working, while a misspelt key still stops start-up.
    """

    arity: str = attrs.field(validator=attrs.validators.in_(("switch", "value", "values")))
    reason: str


_NOTHING_TO_SIMULATE = "a vLLM engine setting with nothing to simulate"
_NOT_SIMULATED_YET = "an llm-d-inference-sim feature llmsim does not simulate yet"
_RETIRED = "an llm-d-inference-sim setting of earlier releases"

_VLLM_ONLY: dict[str, str] = {
    "tensor-parallel-size": "value",
    "pipeline-parallel-size": "value",
    "gpu-memory-utilization": "value",
    "dtype": "value",
    "enforce-eager": "switch",
    "enable-prefix-caching": "switch",
    "trust-remote-code": "switch",
    "disable-log-requests": "switch",
    "mm-processor-kwargs": "value",
    "ec-transfer-config": "value",
    "force-dummy-tokenizer": "switch",
    "render-url": "value",
    "render-timeout": "value",
    "mm-render-timeout": "value",
}

_LLMD_NOT_YET: dict[str, str] = {
    "enable-request-id-headers": "switch",
    "log-http": "switch",
    "skip-tool-validation": "switch",
    "omni": "switch",
    "image-emission-rate": "value",
    "time-to-generate-image": "value",
    "time-to-generate-image-std-dev": "value",
}

#: Keys of earlier llm-d-inference-sim releases (v0.3 to v0.8) that it no longer reads.
_LLMD_RETIRED: dict[str, str] = {
    "tokenizers-cache-dir": "value",
    "zmq-max-connect-attempts": "value",
    "uds-socket-path": "value",
}

IGNORED_KEYS: Mapping[str, IgnoredKey] = {
    key: IgnoredKey(arity, reason)
    for table, reason in (
        (_VLLM_ONLY, _NOTHING_TO_SIMULATE),
        (_LLMD_NOT_YET, _NOT_SIMULATED_YET),
        (_LLMD_RETIRED, _RETIRED),
    )
    for key, arity in table.items()
}
