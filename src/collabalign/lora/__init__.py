"""LoRA: the one layer behind every adapter variant, its injection and its PEFT export."""

from collabalign.lora.inject import inject_lora, lora_layers, lora_parameters, routed
from collabalign.lora.layer import Blocks, LoRALinear
from collabalign.lora.peft_io import save_peft

__all__ = ["Blocks", "LoRALinear", "inject_lora", "lora_layers", "lora_parameters", "routed", "save_peft"]
