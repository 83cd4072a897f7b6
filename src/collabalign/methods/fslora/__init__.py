"""FSLoRA and the heterogeneous-rank federated LoRA family it is compared with (spec: ../shared/specs/fslora.md)."""

from collabalign.methods.fslora.common import PAPER_RATIOS, ServerAdam, device_ranks, lora_scale
from collabalign.methods.fslora.fedstack import FedStackLoRA
from collabalign.methods.fslora.flexlora import FlexLoRA
from collabalign.methods.fslora.sketch import SubspaceLoRA, fedlora, fslora, heterolora, sketch_indices, top_k

__all__ = ["PAPER_RATIOS", "FedStackLoRA", "FlexLoRA", "ServerAdam", "SubspaceLoRA", "device_ranks", "fedlora",
           "fslora", "heterolora", "lora_scale", "sketch_indices", "top_k"]
