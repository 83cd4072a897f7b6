"""FSLoRA and the heterogeneous-rank federated LoRA family it is compared with (spec: docs/methods/fslora.md):
one module per method (sketch.py: FSLoRA; fedlora.py, heterolora.py, flexlora.py, fedstack.py; the LoRA variants
built for averaging: ffalora.py, fedsa.py, fedex.py), the pieces they share (common.py; local_steps.py, the client
side), what a device trains (problems.py) on GLUE (glue.py) or commonsense QA (commonsense.py), and the entry point
(entry.py: `train_fslora`). The synthetic teacher-student problem is the reproduction's (experiments/fslora)."""

from collabalign.methods.fslora.common import PAPER_RATIOS, ServerAdam, ServerRule, device_ranks, lora_scale
from collabalign.methods.fslora.entry import FSLoRAConfig, train_fslora
from collabalign.methods.fslora.fedex import FedExLoRA
from collabalign.methods.fslora.fedlora import fedlora
from collabalign.methods.fslora.fedsa import FedSALoRA
from collabalign.methods.fslora.fedstack import FedStackLoRA
from collabalign.methods.fslora.ffalora import ffalora
from collabalign.methods.fslora.flexlora import FlexLoRA
from collabalign.methods.fslora.heterolora import heterolora
from collabalign.methods.fslora.sketch import SubspaceLoRA, fslora, sketch_indices, top_k

__all__ = ["PAPER_RATIOS", "FSLoRAConfig", "FedExLoRA", "FedSALoRA", "FedStackLoRA", "FlexLoRA", "ServerAdam",
           "ServerRule", "SubspaceLoRA", "device_ranks", "fedlora", "ffalora", "fslora", "heterolora", "lora_scale",
           "sketch_indices", "top_k", "train_fslora"]
