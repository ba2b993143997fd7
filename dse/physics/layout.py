"""Parallel layouts of one serving replica, following wide expert-parallel serving practice.

Within one pipeline stage, attention runs as TP x DP and experts as EP x expert-TP over the same
chips, so chips = chips per stage x PP. Degrees not given default to 1 and DP (attention) or
expert-TP (experts) fills the stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dse.catalog.models import Architecture
from dse.errors import InputError


@dataclass(frozen=True)
class Layout:
    """One replica's parallel degrees."""

    tp: int
    dp: int
    ep: int
    etp: int
    pp: int

    @property
    def chips_per_stage(self) -> int:
        return self.tp * self.dp

    @property
    def chips(self) -> int:
        return self.chips_per_stage * self.pp

    def describe(self) -> str:
        return f"TP{self.tp} DP{self.dp} EP{self.ep} ETP{self.etp} PP{self.pp}"


def _positive(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise InputError(f"--{name} must be a whole number >= 1, got {value!r}")


def check_layout(model: Architecture, layout: Layout) -> None:
    """Raise InputError unless the layout obeys the layout rule and fits the model's shape."""
    tp, dp, ep, etp, pp = layout.tp, layout.dp, layout.ep, layout.etp, layout.pp
    cps = tp * dp
    if ep * etp != cps:
        raise InputError(
            f"impossible layout {layout.describe()}: attention TP x DP = {tp} x {dp} = {cps} chips per stage, "
            f"but experts EP x expert-TP = {ep} x {etp} = {ep * etp}; both must equal the chips per pipeline stage"
        )
    heads = model.spec.attention.n_heads
    if heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise InputError(
            f"impossible layout: --tp {tp} does not divide the {heads} attention heads of {model.id}; "
            f"allowed TP: {', '.join(map(str, divisors))}"
        )
    if not model.is_moe and ep > 1:
        raise InputError(f"impossible layout: {model.id} is dense (no experts), so --ep must be 1, got {ep}")
    if model.is_moe and ep > model.spec.ffn.n_experts:
        raise InputError(
            f"impossible layout: --ep {ep} exceeds the {model.spec.ffn.n_experts} experts of {model.id}; "
            f"allowed EP: 1..{model.spec.ffn.n_experts}"
        )
    if pp > model.spec.n_layers:
        raise InputError(f"impossible layout: --pp {pp} exceeds the {model.spec.n_layers} layers of {model.id}")


def resolve_layout(
    model: Architecture,
    tp: int | None = None,
    ep: int | None = None,
    pp: int | None = None,
    dp: int | None = None,
    etp: int | None = None,
    chips: int | None = None,
) -> Layout:
    """Fill unstated degrees per the layout rule and check the result.

    Chips per stage come from ``chips / pp`` when ``chips`` is given, else from the largest of
    TP x DP and EP x expert-TP as stated; DP and expert-TP then fill the stage.
    """
    for name, value in (("tp", tp), ("ep", ep), ("pp", pp), ("dp", dp), ("etp", etp), ("chips", chips)):
        _positive(name, value)
    tp_, ep_, pp_ = tp or 1, ep or 1, pp or 1
    if chips is not None:
        if chips % pp_:
            raise InputError(f"impossible layout: --chips {chips} is not a multiple of --pp {pp_}")
        cps = chips // pp_
    else:
        cps = max(tp_ * (dp or 1), ep_ * (etp or 1))
    if dp is None:
        if cps % tp_:
            raise InputError(f"impossible layout: {cps} chips per stage is not a multiple of --tp {tp_}")
        dp = cps // tp_
    if etp is None:
        if cps % ep_:
            raise InputError(f"impossible layout: {cps} chips per stage is not a multiple of --ep {ep_}")
        etp = cps // ep_
    layout = Layout(tp=tp_, dp=dp, ep=ep_, etp=etp, pp=pp_)
    if layout.chips_per_stage != cps:
        raise InputError(
            f"impossible layout: TP x DP = {tp_} x {dp} = {tp_ * dp} but the stage has {cps} chips"
        )
    check_layout(model, layout)
    return layout


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts_for(model: Architecture, chips_per_stage: int, pps: tuple[int, ...] = (1,)) -> Iterator[Layout]:
    """Every valid layout with the given chips per stage, built by construction (TP x DP and
    EP x expert-TP are factor pairs of the stage size).
    """
    heads = model.spec.attention.n_heads
    max_ep = model.spec.ffn.n_experts if model.is_moe else 1
    for pp in pps:
        if pp > model.spec.n_layers:
            continue
        for tp in divisors(chips_per_stage):
            if heads % tp:
                continue
            for ep in divisors(chips_per_stage):
                if ep > max_ep:
                    continue
                yield Layout(tp=tp, dp=chips_per_stage // tp, ep=ep, etp=chips_per_stage // ep, pp=pp)
