"""HeteroLoRA (Cho et al. 2024) as compared in FSLoRA (zero-padding + truncation): device i gets the first k_i
columns of B / rows of A, trains them at the global scale, and the server zero-pads the update and averages it over
all N devices. The data flow is FSLoRA's with a fixed prefix for the sketch and no r/k_i factor, so this is only a
constructor of the shared `SubspaceLoRA`."""

from __future__ import annotations

from collabalign.methods.fslora.common import ServerStep
from collabalign.methods.fslora.problems import TorchLoRAProblem
from collabalign.methods.fslora.sketch import SubspaceLoRA


def heterolora(problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, alpha: float = 1.0,
               server: ServerStep | None = None) -> SubspaceLoRA:
    """HeteroLoRA: the first k_i ranks, trained at the global scale; only the block is downloaded."""
    return SubspaceLoRA(problem, ranks, rank, alpha, random_blocks=False, rescale=False, download="submatrix",
                        server=server)
