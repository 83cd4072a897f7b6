"""Federated LoRA (FedIT) at rank r on every device, the paper's "FSLoRA without sketching": it is FSLoRA with
k_i = r (every sketch is the identity, the r/k_i factor is 1), so this is only a constructor."""

from __future__ import annotations

from collabalign.methods.fslora.common import ServerStep
from collabalign.methods.fslora.problems import TorchLoRAProblem
from collabalign.methods.fslora.sketch import SubspaceLoRA


def fedlora(problem: TorchLoRAProblem, device_ids: list[str], rank: int, alpha: float = 1.0,
            upload_top_k: float | None = None, server: ServerStep | None = None) -> SubspaceLoRA:
    """Federated LoRA at rank r on every device: FSLoRA at ratio 1."""
    return SubspaceLoRA(problem, {cid: rank for cid in device_ids}, rank, alpha, upload_top_k=upload_top_k,
                        server=server)
