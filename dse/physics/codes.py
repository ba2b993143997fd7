"""The names behind the physics' integer codes (phase, KV tier, binding resource) and the default chunk budget.

Import-light: the command line reads them at start-up.
"""

from __future__ import annotations

PHASES = ("decode", "prefill")
KV_TIERS = ("hbm", "host")
KV_SHARDS = ("heads", "batch")  # how TP ranks split the KV cache: by KV head, or by sequence (Pope et al.)
BOUNDS = ("compute", "memory", "comm")
DEFAULT_CHUNK = 8192
"""Prefill tokens per DP rank per forward pass when a workload states no budget (vLLM's and SGLang's usual
chunked-prefill budget)."""
