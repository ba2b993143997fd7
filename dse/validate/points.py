"""What a published measurement becomes: a point (one measured figure and the configuration behind it) or a case
skipped with its reason (training runs are `dse.validate.training`'s); the readers (`dse.validate.cases`,
`dse.validate.published`) produce them and `dse.validate.predict` predicts them.

Kinds of prediction of a `Point`:
- ``offline``: maximum output throughput of a replica serving requests of ISL prompt and OSL output
  tokens (benchmarks at infinite request rate): the batch is as large as HBM allows with every
  request's KV reserved at ISL + OSL, decode runs at the mean context ISL + OSL / 2, and each
  request's prefill (in chunks of 8,192 tokens) shares the chips: out = 1 / (ISL / (OSL P) + 1 / D).
- ``static``: end-to-end latency of one batch of B prompts prefilled together and then decoded in lock-step for
  OSL - 1 steps (vLLM ``benchmark_latency``).
- ``decode`` / ``prefill``: tokens per second at a stated batch and context.
- ``dispatch``: time of one MoE dispatch (all-to-all) of one layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("serving_throughput", "latency")
"""The categories a point is scored in."""


@dataclass(frozen=True)
class Point:
    """One measured figure and the configuration behind it."""

    case: str
    category: str
    label: str
    kind: str  # offline | static | decode | prefill | dispatch
    model: str
    system: str
    tp: int
    dp: int
    ep: int
    pp: int
    weights_dtype: str
    kv_dtype: str
    measured: float
    unit: str
    isl: int = 0
    osl: int = 0
    batch: int = 0
    context: int = 0
    divide_by: float = 1.0  # e.g. nodes, for per-node figures
    max_batch: int = 4096
    source: str = ""
    # calibrates its own hardware family only, not the pooled default of the families without data (a lab
    # measurement of one chip and one model, many points of one case, would pull the pool toward that chip)
    family_only: bool = False


@dataclass(frozen=True)
class Skipped:
    case: str
    category: str
    reason: str


@dataclass
class Cases:
    points: list[Point] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
