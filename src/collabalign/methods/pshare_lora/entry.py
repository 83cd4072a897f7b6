"""P-ShareLoRA personal reward models, the entry point: preference pairs with a `user` field, any Hugging Face model,
one reward model per user back (its personal LoRA factors with the shared ones, and its score head).

    from collabalign.methods.pshare_lora import PShareLoRAConfig, train_pshare_lora
    result = train_pshare_lora(PShareLoRAConfig(model="minilm-l6", epochs=3), "pairs.jsonl")
    print(result.metrics["accuracy_per_user"])
    result.save("runs/prm")         # adapters/user-<user>: PEFT folder + head.safetensors, one per user
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign.artifacts import Adapter, Result
from collabalign.baselines import compare, probe_pairs
from collabalign.config import LoRASection, Probability, Strict
from collabalign.data.errors import DataError
from collabalign.data.formats import pairs_and_hash
from collabalign.data.preferences import PreferenceSet
from collabalign.lora.targets import default_targets
from collabalign.methods.pshare_lora.text import (
    TextRewardModel,
    TextTraining,
    accuracy_by_user,
    encode,
    fit_model,
    pair_hits,
    prefs_from_pairs,
)
from collabalign.methods.pshare_lora.train import METHODS, Prefs, per_user_mean
from collabalign.models.backbones import Backbone
from collabalign.models.cached import TextCache, frozen_features
from collabalign.models.saved import base_prefix, own_backbone, pooled_adapter
from collabalign.seeding import Seeds
from collabalign.selection import best, held_out_slice

Method = Literal[METHODS]
LR_GRID = (1e-3, 3e-3, 1e-2)  # `lr: auto`'s Adam rates: the low end of the text main form's grid {1e-3 .. 0.1}
SELECT_FRACTION = 0.2  # of each user's training pairs, held out to choose the rate on


class PShareLoRAConfig(Strict):
    """Personalised reward models: P-ShareLoRA (a shared LoRA up-projection B, a down-projection A per user) or one of
    its variants and baselines (`METHODS`), trained on every user's pairs at once (spec §8.4's text training)."""

    model: str = "minilm-l6"
    method: Method = "pshare_si"
    lora: LoRASection = LoRASection(rank=8, alpha=4.0, blocks=2, dropout=0.05)  # blocks: the top N get LoRA
    epochs: PositiveFloat = 3.0  # passes' worth of steps over the training pairs, the same budget for every method
    batch_size: PositiveInt = 32
    lr: PositiveFloat | Literal["auto"] = "auto"  # auto: chosen from LR_GRID on a slice of each user's training pairs
    linear_schedule: bool = True  # the rate decays linearly to 0 over the whole budget
    global_fraction: Probability = 2 / 3  # pshare_g: the global phase's share of the steps
    warmup_fraction: Probability = 0.1  # pshare_wu: the global warm-up's share
    frozen_fraction: Probability = 0.7  # share_rep: the bottom share of the blocks kept frozen
    max_length: PositiveInt = 128  # tokens of prompt + reply (longer texts lose their start)
    micro_batch: NonNegativeInt = 0  # pairs per forward / backward within a batch (0: the whole batch)
    gradient_checkpointing: bool = False
    device: str = "cpu"
    test_fraction: float = Field(0.2, ge=0, lt=1)  # of each user's pairs, held out for the reported accuracy
    seed: NonNegativeInt = 0

    def training(self, targets: list[str]) -> TextTraining:
        """The method package's training settings (`lr: auto` reads as 0 here: `choose_lr` sets it)."""
        lora = self.lora
        return TextTraining(rank=lora.rank, alpha=lora.alpha, dropout=lora.dropout, batch_size=self.batch_size,
                            epochs=self.epochs, lr=0.0 if self.lr == "auto" else self.lr, linear=self.linear_schedule,
                            global_fraction=self.global_fraction, warmup_fraction=self.warmup_fraction,
                            frozen_fraction=self.frozen_fraction, device=self.device, targets=tuple(targets),
                            micro_batch=self.micro_batch, checkpointing=self.gradient_checkpointing)


def train_pshare_lora(config: PShareLoRAConfig, data: str | Path | PreferenceSet,
                      model: Backbone | str | None = None, progress: bool = False) -> Result:
    """Trains every user's reward model; held-out accuracy overall (the mean over users) and per user (by name) are in
    `result.metrics` (when `test_fraction` > 0), user u's model in `result.adapters[f"user-{u}"]`."""
    names, data_hash, prefs, train_rows, test_rows, backbone, base, cache = user_pairs(config, data, model)
    tc = config.training(default_targets(backbone.model, config.lora.targets))
    if progress:
        print(f"pshare-lora: {config.method} on {len(names)} users, {len(train_rows)} training pairs",
              file=sys.stderr)
    selection = None
    if config.lr == "auto":
        selection = choose_lr(backbone, cache, prefs, train_rows, config.method, len(names), tc, config.seed)
        tc = replace(tc, lr=selection["chosen"])
    reward, losses, steps = fit_model(backbone, cache, prefs[train_rows], config.method, len(names), tc, config.seed)
    metrics = {"users": len(names), "train_pairs": len(train_rows), "test_pairs": len(test_rows), "steps": steps,
               "train_loss": round(losses[-1], 6), "lr": tc.lr, **({"lr_selection": selection} if selection else {})}
    if len(test_rows):
        hits = pair_hits(reward, prefs[test_rows])
        held_out = accuracy_by_user(hits, prefs.users[test_rows], len(names))
        metrics.update(accuracy=held_out["accuracy"],
                       accuracy_per_user=dict(zip(names, held_out["accuracy_per_user"], strict=True)),
                       baseline=user_probe_baseline(hits, backbone, base, cache, prefs, train_rows, test_rows,
                                                    config.seed))
        if progress:
            print(f"pshare-lora: held-out accuracy {held_out['accuracy']:.4f}", file=sys.stderr)
    adapters = {f"user-{name}": user_adapter(reward, base_prefix(backbone.model), base, i)
                for i, name in enumerate(names)}
    return Result("pshare-lora", "reward", base, config.model_dump(), data_hash, metrics, adapters,
                  max_length=config.max_length, model=reward)


def choose_lr(backbone: Backbone, cache: TextCache, prefs: Prefs, train_rows: torch.Tensor, method: str,
              n_users: int, tc: TextTraining, seed: int) -> dict[str, Any]:
    """`lr: auto`: `method` fitted once per rate of `LR_GRID` on the training pairs less a held-out `SELECT_FRACTION`
    of each user's (seeded), each scored by the mean over users of their accuracy on that slice; the best kept
    (`selection.best`: ties to the smaller rate). The test pairs are never seen."""
    fit, chosen_on = held_out_slice(prefs.users[train_rows].numpy(), SELECT_FRACTION,
                                    Seeds(seed).numpy("pshare-lora/select"))
    fit_rows, select_rows = train_rows[fit], train_rows[chosen_on]
    users = prefs.users[select_rows]
    present = torch.unique(users)
    scores = {}
    for lr in LR_GRID:
        reward, _, _ = fit_model(backbone, cache, prefs[fit_rows], method, n_users, replace(tc, lr=lr), seed)
        per_user = per_user_mean(users, pair_hits(reward, prefs[select_rows]), n_users)[present]
        scores[lr] = float(per_user.mean())
    return {"grid": list(LR_GRID), "scores": {f"{lr:g}": round(s, 6) for lr, s in scores.items()},
            "chosen": best(scores), "pairs": len(select_rows)}


def user_probe_baseline(hits: torch.Tensor, backbone: Backbone, base: str, cache: TextCache, prefs: Prefs,
                        train_rows: torch.Tensor, test_rows: torch.Tensor, seed: int) -> dict[str, Any]:
    """The personalised reward models against a Bradley-Terry probe per user on the frozen backbone's features, on the
    same held-out pairs, every user weighing the same (`baselines.compare`)."""
    features = frozen_features(backbone.model, backbone.causal, cache).numpy()
    probe = probe_pairs(features, prefs.chosen.numpy(), prefs.rejected.numpy(), train_rows.numpy(), test_rows.numpy(),
                        Seeds(seed).numpy("baseline-probe"), groups=prefs.users.numpy())
    return compare("accuracy", hits.numpy(), probe, f"a Bradley-Terry probe per user on frozen {base} features",
                   groups=prefs.users[test_rows].numpy())


def user_pairs(config: PShareLoRAConfig | Any, data: str | Path | PreferenceSet, model: Backbone | str | None
               ) -> tuple[list[str], str, Prefs, torch.Tensor, torch.Tensor, Backbone, str, TextCache]:
    """A pairs file with users, encoded for the text reward models (`config`: its model, test_fraction, seed,
    max_length and lora.blocks): (user names, data hash, Prefs over every pair with users as indices into the names,
    training rows, held-out rows (`split_per_user`), backbone, base model name, the cached texts)."""
    pairs, data_hash = pairs_and_hash(data, require=("user",))
    names = sorted({p.party for p in pairs})
    index = {name: i for i, name in enumerate(names)}
    users = [index[p.party] for p in pairs]
    train_rows, test_rows = split_per_user(users, config.test_fraction, Seeds(config.seed).numpy("pshare-lora-split"),
                                           names, pairs.source)
    backbone, base = own_backbone(model, config.model, ("max_length", config.max_length))
    texts, prefs = prefs_from_pairs(pairs.pairs, users)
    cache = encode(backbone, texts, config.max_length, config.lora.blocks or 10**6)
    return names, data_hash, prefs, train_rows, test_rows, backbone, base, cache


def split_per_user(users: list[int], test_fraction: float, rng: np.random.Generator,
                   names: list[str], source: str = "data") -> tuple[torch.Tensor, torch.Tensor]:
    """(train rows, test rows), sorted: a random `test_fraction` of each user's pairs held out (at least one when the
    fraction is positive), at least one left to train; a user with too few pairs is a DataError naming the user (in
    `source`)."""
    users_arr = np.asarray(users)
    train, test = [], []
    for u, name in enumerate(names):
        rows = rng.permutation(np.flatnonzero(users_arr == u))
        n_test = max(1, round(test_fraction * len(rows))) if test_fraction > 0 else 0
        if len(rows) - n_test < 1:
            raise DataError(source, None, "user", f"too few pairs: user {name!r} has {len(rows)}, at least "
                            f"{n_test + 1} are needed to hold out {n_test} and train on one (test_fraction "
                            f"{test_fraction})")
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    return torch.from_numpy(np.sort(np.concatenate(train))), torch.from_numpy(np.sort(np.concatenate(test)))


def user_adapter(reward: TextRewardModel, prefix: str, base: str, user: int) -> Adapter:
    """User `user`'s reward model: its personal factors (and the shared ones) and its score head row (or the shared
    head)."""
    head_rows = user if reward.pooled.head.per_user else None
    return pooled_adapter(reward.pooled, prefix, base, user, head_rows)
