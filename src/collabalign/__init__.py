"""collabalign: collaborative alignment of language models (reward models, policies, LoRA adapters)."""

__version__ = "0.1.0"
