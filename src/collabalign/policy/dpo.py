"""Direct preference optimisation (Rafailov et al. 2023), sigmoid loss, with the adapters-off model as reference."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def dpo_loss(pi_chosen: Tensor, pi_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float) -> tuple[Tensor, Tensor]:
    """Per-pair -log sigmoid(margin) and the implicit-reward margin beta((pi_c - ref_c) - (pi_r - ref_r)), from
    sequence log-probs (B,)."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    return -F.logsigmoid(margin), margin

