"""Named latency presets: llm-d-inference-sim's ``manifests/latency-profiles``.

Each profile is the latency part of one of its YAML files (and ``max-num-seqs``, which
the load factor of ``time-factor-under-load`` depends on), spelt as those files spell
the values.  The files' ``port``, ``model`` and ``mode`` are left out: they say where
and as what the simulator serves, not how fast.  ``--latency-profile NAME`` lays a
profile under every other source (flags > environment > YAML > profile > defaults;
see :mod:`llmsim.config`).

This module is data only, so that :mod:`llmsim.options` can name the profiles.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LATENCY_PROFILES", "PROFILE_NAMES"]

#: Profile name -> kebab-case key -> value as the manifest writes it
#: (llm-d-inference-sim ``manifests/latency-profiles/<name>.yaml``).
LATENCY_PROFILES: Mapping[str, Mapping[str, str]] = {
    "8b-h100-balanced-constant": {
        "max-num-seqs": "16",
        "latency-calculator": "constant",
        "time-to-first-token": "100ms",
        "time-to-first-token-std-dev": "20ms",
        "inter-token-latency": "12ms",
        "inter-token-latency-std-dev": "2ms",
        "kv-cache-transfer-latency": "2ms",
        "kv-cache-transfer-latency-std-dev": "400us",
        "time-factor-under-load": "2.0",
    },
    "8b-h100-balanced-per-token": {
        "max-num-seqs": "16",
        "latency-calculator": "per-token",
        "inter-token-latency": "12ms",
        "inter-token-latency-std-dev": "2ms",
        "prefill-overhead": "30ms",
        "prefill-time-per-token": "250us",
        "prefill-time-std-dev": "5ms",
        "kv-cache-transfer-time-per-token": "3us",
        "kv-cache-transfer-time-std-dev": "200us",
        "time-factor-under-load": "2.0",
    },
    "70b-h100-tp8-throughput-constant": {
        "max-num-seqs": "64",
        "latency-calculator": "constant",
        "time-to-first-token": "200ms",
        "time-to-first-token-std-dev": "40ms",
        "inter-token-latency": "25ms",
        "inter-token-latency-std-dev": "4ms",
        "kv-cache-transfer-latency": "2ms",
        "kv-cache-transfer-latency-std-dev": "400us",
        "time-factor-under-load": "3.0",
    },
    "70b-h100-tp8-throughput-per-token": {
        "max-num-seqs": "64",
        "latency-calculator": "per-token",
        "inter-token-latency": "25ms",
        "inter-token-latency-std-dev": "4ms",
        "prefill-overhead": "80ms",
        "prefill-time-per-token": "500us",
        "prefill-time-std-dev": "15ms",
        "kv-cache-transfer-time-per-token": "8us",
        "kv-cache-transfer-time-std-dev": "500us",
        "time-factor-under-load": "3.0",
    },
    "small-l40s-edge-constant": {
        "max-num-seqs": "4",
        "latency-calculator": "constant",
        "time-to-first-token": "110ms",
        "time-to-first-token-std-dev": "15ms",
        "inter-token-latency": "15ms",
        "inter-token-latency-std-dev": "2ms",
        "kv-cache-transfer-latency": "5ms",
        "kv-cache-transfer-latency-std-dev": "1ms",
        "time-factor-under-load": "1.5",
    },
    "small-l40s-edge-per-token": {
        "max-num-seqs": "4",
        "latency-calculator": "per-token",
        "inter-token-latency": "15ms",
        "inter-token-latency-std-dev": "2ms",
        "prefill-overhead": "20ms",
        "prefill-time-per-token": "350us",
        "prefill-time-std-dev": "3ms",
        "kv-cache-transfer-time-per-token": "12us",
        "kv-cache-transfer-time-std-dev": "500us",
        "time-factor-under-load": "1.5",
    },
}

#: The profile names, in the order ``--help`` lists them.
PROFILE_NAMES: tuple[str, ...] = tuple(LATENCY_PROFILES)
