"""The names behind the physics' integer codes (phase, KV tier, binding resource); import-light."""

from __future__ import annotations

PHASES = ("decode", "prefill")
KV_TIERS = ("hbm", "host")
KV_SHARDS = ("heads", "batch")  # how TP ranks split the KV cache: by KV head, or by sequence (Pope et al.)
BOUNDS = ("compute", "memory", "comm")
