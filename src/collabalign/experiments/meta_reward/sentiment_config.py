"""The sentiment part's config: where its domains come from (the Amazon reviews or the user's preference pairs) and
every size and step of the methods."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from collabalign.config import Grid, Strict
from collabalign.data.amazon_reviews import DOMAINS

Beta = Annotated[float, Field(gt=0)]
BETA_METHODS = ("ours", "bt+rwr", "ppo(tr)", "ppo(tr+te)", "dpo", "oracle")  # methods with a β (KL coefficient)


class SentimentData(Strict):
    """The task's data: the Amazon multi-domain reviews of the shared data folder, or preference pairs in JSONL whose
    rows carry a `domain` (data/formats.py); `domains` and `held_out` then name the file's domains."""

    source: Literal["amazon", "jsonl"] = "amazon"
    path: str | None = None  # the JSONL file (source jsonl only)

    @model_validator(mode="after")
    def _path_matches_source(self) -> SentimentData:
        if self.source == "jsonl" and not self.path:
            raise ValueError("data.source jsonl needs data.path (preference pairs with a `domain` field)")
        if self.source == "amazon" and self.path is not None:
            raise ValueError("data.path is for data.source jsonl; the Amazon reviews are read from data_dir")
        return self


class SentimentConfig(Strict):
    """CPU-scale defaults; the main and GPU configs set their own sizes."""

    run: bool = True
    data: SentimentData = SentimentData()
    data_dir: str | None = None  # the shared data folder (Amazon); default ../shared/data or $COLLABALIGN_DATA
    model: str = "tiny-llama"  # smollm2-135m on CPU; any causal LM name on a GPU
    device: str = "cpu"
    encoder: str = "minilm-l6"  # the reward models' frozen sentence encoder
    domains: Grid[str] = list(DOMAINS)  # the domains used: Amazon's, or (data.source jsonl) the file's
    held_out: Grid[str] = list(DOMAINS)  # leave-one-domain-out over these
    train_domains: list[str] | None = None  # default: every domain but the held-out one
    seeds: int = Field(5, ge=1)
    opening_words: int = Field(2, ge=1)  # Amazon: the prompt is a review's first words
    response_words: int = Field(20, ge=5)  # Amazon: the response's words; the judge's window on any data
    max_examples: int | None = Field(None, ge=1)  # fine-tuning examples per domain (pair reviews always kept)
    max_pairs: int | None = Field(None, ge=4)  # pairs per domain, a seeded subset (small runs)
    validation_fraction: float = Field(0.2, gt=0, lt=1)  # of each training domain's pairs, for model selection
    rank: int = Field(8, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lr_grid: Grid[Annotated[float, Field(gt=0)]] = [1e-3, 3e-3, 1e-2]  # α of every SGD stage on the policy (SFT,
    # inner loop, meta-test, DPO, HPL): the one whose SFT has the lowest held-out NLL on unlabelled fine-tuning text
    weight_norm: Literal["none", "batch"] = "batch"  # RWR weights exp(r/β) as they are, or over their batch mean
    batch: int = Field(8, ge=1)  # B_in, and the minibatch of SFT, DPO and HPL
    sft_steps: int = Field(100, ge=1)
    inner_steps: int = Field(5, ge=1)  # D
    outer_steps: int = Field(30, ge=1)  # K
    outer_batch: int = Field(16, ge=1)
    outer_lr: float = Field(0.05, gt=0)  # Adam on φ
    clip: float = Field(1.0, gt=0)
    select_every: int = Field(10, ge=1)
    test_steps: int = Field(50, ge=1)  # Algorithm 2 "converged" (the "matched" variant runs D steps)
    pair_steps: int = Field(50, ge=1)  # DPO and HPL
    bt_c: float = Field(1.0, gt=0)
    ppo_iterations: int = Field(8, ge=1)
    ppo_batch: int = Field(8, ge=1)
    ppo_lr: float = Field(1e-3, gt=0)
    max_new_tokens: int = Field(28, ge=1)
    beta: Beta = 1.0  # the shared-β protocol
    beta_grid: Grid[Beta] = [0.1, 1.0, 2.0, 4.0, 8.0]  # tuned protocol and the sweep of ours (one grid for all)
    eval_prompts: int = Field(8, ge=1)
    temperatures: Grid[Annotated[float, Field(gt=0)]] = [0.25, 0.5, 0.75, 1.0]
    repetitions: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SentimentConfig:
        if self.data.source == "amazon":
            unknown = sorted(set(self.domains + self.held_out) - set(DOMAINS))
            if unknown:
                raise ValueError(f"unknown domains {unknown}; known: {list(DOMAINS)}")
        elif self.data_dir is not None:
            raise ValueError("data_dir is the Amazon reviews' folder; with data.source jsonl the pairs are read from "
                             "data.path")
        missing = sorted(set(self.held_out) - set(self.domains))
        if missing:
            raise ValueError(f"held-out domains {missing} are not among the domains {self.domains}")
        if self.train_domains is not None:
            shared = sorted(set(self.train_domains) & set(self.held_out))
            if shared:
                raise ValueError(f"held-out domain(s) {shared} are also training domains: a held-out domain's "
                                 "preference pairs must never be trained on")
            if not set(self.train_domains) <= set(self.domains) or not self.train_domains:
                raise ValueError(f"train_domains {self.train_domains} must be a non-empty subset of {self.domains}")
        if len(self.domains) < 2:
            raise ValueError("need at least two domains: one held out, at least one to train on")
        if self.beta not in self.beta_grid:
            raise ValueError(f"the shared β {self.beta} must be on beta_grid {self.beta_grid}")
        return self

