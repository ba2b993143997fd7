"""Quality of a pre-trained model: the Chinchilla-form loss fits, the data-limited variant in which repeated tokens
are worth less, the pre-training tokens a model needs to reach a target loss, and the first-order condition that
splits lifetime cost between training and inference along a curve of equal loss.

L(N, D) = E + A / N^alpha + B / D'^beta. Constants: Hoffmann et al. 2022 (arXiv:2203.15556, Eq. 10, approach 3)
and the replication of Besiroglu et al. 2024 (arXiv:2404.10102); both in hw_catalog/calibration/cases.yaml
(`scaling_chinchilla_parametric`, `scaling_epoch_replication`). With U unique tokens, D tokens of training
repeat them R = D / U - 1 times and count as D' = U + U R* (1 - exp(-R / R*)) (Muennighoff et al. 2023,
arXiv:2305.16264, Eq. 5; R* = 15.387756 from the fit published with the paper, github.com/huggingface/
datablations, "Parametric Fit"); without repeats D' = D. The paper's parameter-side penalty (parameters beyond the
compute-optimal size for U) is left out: it bites only on models larger than Chinchilla-optimal for their data,
never on an overtrained one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LossFit:
    """One published fit of L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str


LOSS_FITS = {
    "hoffmann": LossFit(1.69, 406.4, 410.7, 0.34, 0.28, "Hoffmann et al. 2022, arXiv:2203.15556, Eq. 10"),
    "epoch": LossFit(1.8172, 482.01, 2085.43, 0.3478, 0.3658, "Besiroglu et al. 2024, arXiv:2404.10102"),
}
REPEAT_HALF_LIFE = 15.387756
"""R*_D of Muennighoff et al. 2023: repeats beyond the first epoch lose value as exp(-R / R*)."""
CHINCHILLA_TOKENS_PER_PARAM = 20.0
"""The lecture's Chinchilla-optimal tokens per (active) parameter, against which overtraining is measured."""


def effective_tokens(d: float, unique: float | None = None) -> float:
    """D': the tokens D is worth when it repeats ``unique`` tokens (D itself when it does not repeat them)."""
    if unique is None or d <= unique:
        return d
    r = d / unique - 1.0
    return unique + unique * REPEAT_HALF_LIFE * (1.0 - math.exp(-r / REPEAT_HALF_LIFE))


def effective_tokens_slope(d: float, unique: float | None = None) -> float:
    """dD'/dD: what one more token of training is worth (1 before the data repeat, exp(-R / R*) after)."""
    if unique is None or d <= unique:
        return 1.0
    return math.exp(-(d / unique - 1.0) / REPEAT_HALF_LIFE)


def loss(n: float, d: float, fit: str = "hoffmann", unique: float | None = None) -> float:
    """The loss of a model of ``n`` (effective) parameters trained on ``d`` tokens drawn from ``unique``."""
    c = LOSS_FITS[fit]
    return c.E + c.A / n ** c.alpha + c.B / effective_tokens(d, unique) ** c.beta


def tokens_for_loss(n: float, target: float, fit: str = "hoffmann", unique: float | None = None) -> float:
    """The fewest pre-training tokens that bring a model of ``n`` (effective) parameters to ``target`` (infinity
    when no number of tokens does: the target is below E + A / n^alpha, or above what repeating ``unique`` tokens
    can ever be worth, U (1 + R*)).
    """
    c = LOSS_FITS[fit]
    room = target - c.E - c.A / n ** c.alpha
    if room <= 0:
        return math.inf
    need = (c.B / room) ** (1.0 / c.beta)  # D' needed
    if unique is None or need <= unique:
        return need
    share = (need / unique - 1.0) / REPEAT_HALF_LIFE
    if share >= 1.0:
        return math.inf
    return unique * (1.0 - REPEAT_HALF_LIFE * math.log(1.0 - share))


def inference_to_training_ratio(n: float, d: float, fit: str = "hoffmann", unique: float | None = None) -> float:
    """C_inf / C_train at the least lifetime cost along a curve of equal loss: the first-order condition.

    Every cost is taken proportional to the parameters N: C = k N D (training, pre-training and RL) + k_inf N D_inf
    (inference). Moving along
    L(N, D) = L*, dD/dN = -(alpha a D') / (beta b N dD'/dD) with a = A / N^alpha and b = B / D'^beta, and dC/dN = 0
    gives

        C_inf / C_train = alpha a D' / (beta b D dD'/dD) - 1      (alpha a / (beta b) - 1 without repeats).

    The lecture's equalization (C_inf = C_train) holds where alpha a D' = 2 beta b D dD'/dD.
    """
    c = LOSS_FITS[fit]
    dp = effective_tokens(d, unique)
    a, b = c.A / n ** c.alpha, c.B / dp ** c.beta
    return c.alpha * a * dp / (c.beta * b * d * effective_tokens_slope(d, unique)) - 1.0
