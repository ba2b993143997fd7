"""The names behind the physics' integer codes (phase, KV tier, binding resource); import-light."""

from __future__ import annotations

PHASES = ("decode", "prefill")
KV_TIERS = ("hbm", "host")
BOUNDS = ("compute", "memory", "comm")
