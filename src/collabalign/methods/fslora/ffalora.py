"""FFA-LoRA (Sun et al. 2024, "Improving LoRA in privacy-preserving federated learning"): every device at rank r, A
frozen at its random start (drawn once by the server), only B trained, sent and averaged. The average of the devices'
products is then exact, s B̄ A = (1/N) sum_i s B_i A, and the upload is B's alone. The data flow is Federated LoRA's
with A held still, so this is only a constructor of the shared `SubspaceLoRA`."""

from __future__ import annotations

from collabalign.methods.fslora.common import ServerStep
from collabalign.methods.fslora.problems import TorchLoRAProblem
from collabalign.methods.fslora.sketch import SubspaceLoRA


def ffalora(problem: TorchLoRAProblem, device_ids: list[str], rank: int, alpha: float = 1.0,
            server: ServerStep | None = None) -> SubspaceLoRA:
    """FFA-LoRA at rank r on every device: A frozen, B trained and averaged."""
    return SubspaceLoRA(problem, {cid: rank for cid in device_ids}, rank, alpha, server=server, train_a=False)
