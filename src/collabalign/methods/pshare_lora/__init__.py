"""P-ShareLoRA (spec docs/methods/pshare-lora.md): personalised reward models whose LoRA updates share the
up-projection B (column space) with personal down-projections A_i, its G / WU variants and the baselines."""

from collabalign.methods.pshare_lora.entry import PShareLoRAConfig, train_pshare_lora
from collabalign.methods.pshare_lora.sharing import configure, project_, user_deltas
from collabalign.methods.pshare_lora.train import (
    LABELS,
    METHODS,
    VARIANTS,
    Phase,
    Prefs,
    pair_loss,
    prepare,
    schedule,
    train,
)

__all__ = ["LABELS", "METHODS", "VARIANTS", "PShareLoRAConfig", "Phase", "Prefs", "configure", "pair_loss", "prepare",
           "project_", "schedule", "train", "train_pshare_lora", "user_deltas"]
