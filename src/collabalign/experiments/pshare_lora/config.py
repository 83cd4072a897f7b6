"""The P-ShareLoRA reproduction's config: the §8.1 problem and recipe, the §8.2 sweeps, the §8.3 bandit, the
federated variant and the §8.4 text reward models."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from collabalign.config import Distinct, Fraction, Grid, Probability, Strict
from collabalign.experiments.pshare_lora.problems.synthetic import SYNTHETIC_METHODS, ProblemConfig, TrainConfig
from collabalign.federation.engine import EngineOptions
from collabalign.methods.pshare_lora import METHODS, VARIANTS
from collabalign.methods.pshare_lora.text import TextTraining

Zeta = NonNegativeFloat | Literal["theory", "oracle"]
Source = Literal["tldr_like", "hh", "tldr", "jsonl"]
SyntheticMethod = Literal[SYNTHETIC_METHODS]  # the same-head variant needs a score head: text only
TextMethod = Literal[METHODS + VARIANTS]


class SweepConfig(Strict):
    seeds: Grid[NonNegativeInt] | None = None  # None: the main comparison's seeds
    methods: Grid[SyntheticMethod] = ["global", "local", "pshare_si", "pshare_g", "full"]
    n_train: Grid[PositiveInt] = [25, 50, 100, 200, 400, 800, 1600]  # N_p at the problem's defaults
    users: Distinct[PositiveInt] = []  # N at the problem's N_p
    spectrum_decay: Distinct[PositiveFloat] = []  # c: the k-th direction of every W*_i scaled by c (smaller ν)
    tail: Distinct[NonNegativeFloat] = []  # η, each at every tail_n_train
    tail_n_train: Grid[PositiveInt] = [100, 800]
    target_fraction: Fraction = 0.85  # crossover: pairs per user to reach this fraction of the oracle accuracy


class BanditConfig(Strict):
    run: bool = False
    prompts: PositiveInt = 20  # S
    candidates: int = Field(10, ge=2)  # K
    coverage: Fraction = 0.5  # fraction of each prompt's candidates that mu_0 = mu_1 cover
    n_train: Grid[PositiveInt] = [25, 50, 100, 200]  # N_p, comparisons per user (nested: the first N_p of one draw)
    zetas: Grid[Zeta] = [0.0, 0.01, 0.1, "theory", "oracle"]  # "theory": `bandit.theory_zeta`; "oracle": ||D^-D*||^2
    methods: Grid[SyntheticMethod] = ["global", "local", "pshare_si", "pshare_g", "full"]
    train: TrainConfig = TrainConfig(steps=600)  # the main run's recipe, fewer steps
    iters: PositiveInt = 200  # exponentiated-gradient iterations of the policy solver
    step: PositiveFloat = 1.0  # its largest step, in reward units per prompt

    @field_validator("zetas")
    @classmethod
    def _has_zero(cls, zetas: list[Zeta]) -> list[Zeta]:
        if 0.0 not in zetas:
            raise ValueError("zetas must include 0 (vanilla RLHF), the reference of every claim")
        return zetas


class FederatedConfig(Strict):
    run: bool = False
    rounds: PositiveInt = 150
    local_steps: PositiveInt = 10  # H; the centralised methods get rounds * H full steps, the same per user
    lr: PositiveFloat = 0.02
    optimizer: Literal["adam", "sgd"] = "adam"  # local optimiser, fresh each round (the centralised runs use Adam)
    batch_size: NonNegativeInt = 0  # per client; 0: full batch. Centralised: batch_size * users mixed-user batches
    fraction: Fraction = 1.0  # clients sampled per round
    norm_projection: bool = True  # as the centralised runs: ||Delta Theta_i||_F <= norm_slack * max_i ||Delta*_i||
    norm_slack: PositiveFloat = 1.1
    global_fraction: Probability = 2 / 3  # G: rounds of FedAvg-LoRA first, then personal at lr / 3
    warmup_fraction: Probability = 0.1  # WU: rounds of FedAvg-LoRA first
    methods: Grid[str] = ["fed_pshare_si", "fed_pshare_wu", "fedavg_lora", "fed_local", "central_pshare_si",
                          "central_global"]
    equivalence_band: PositiveFloat = 0.01  # fixed before running: federated vs centralised SI within ±1 accuracy point
    eval_every: PositiveInt = 10


class PairsData(Strict):
    """Preference pairs JSONL with a `user` field in every row: its users are the labelers."""

    source: Literal["jsonl"] = "jsonl"
    path: str
    test_fraction: float = Field(0.2, gt=0, lt=1)  # of each user's pairs held out, drawn per seed


class TextConfig(Strict):
    run: bool = False
    # "tldr": the real comparisons with their top labelers (spec §5); "jsonl": the pairs of `data`
    sources: Grid[Source] = ["tldr_like", "hh"]
    data: PairsData | None = None
    data_root: str | None = None  # tldr: a folder with {train,validation}.jsonl[.gz] in the hub schema; None: the hub
    seeds: Grid[NonNegativeInt] | None = None  # None: the experiment's seeds (text runs cost far more than synthetic)
    backbone: str = "minilm-l6"
    users: PositiveInt = 5
    n_train: NonNegativeInt = 300  # pairs per labeler (tldr: a cap; 0 = every balanced pair, 5,373 in the paper)
    n_test: NonNegativeInt = 300  # (tldr: 0 = 1,238 validation pairs per labeler)
    rho: Probability = 0.6  # agreement of the labelers' attribute weights
    tail: NonNegativeFloat = 0.0  # eta: individual deviations of the weights
    camps: bool = False  # the odd-numbered labelers negate their weights: two camps that disagree
    oracle_accuracy: float = Field(0.77, gt=0.5, lt=1)  # beta is calibrated to this agreement with the own reward
    hh_pool: NonNegativeInt = 0  # HH pairs used (the file's first ones); 0: all 2,312
    max_length: PositiveInt = 96
    truncation_side: Literal["left", "right"] = "left"  # left keeps the summary of a long post (the paper: right, 2048)
    lora_blocks: PositiveInt = 2  # the top blocks with LoRA; the ones below are cached (>= every block: no cache)
    targets: Grid[str] = ["query", "key"]  # the paper's Q/K (q_proj / k_proj on Llama)
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16"] = "float32"  # the backbone's; LoRA factors and heads stay float32
    gradient_checkpointing: bool = False
    micro_batch: NonNegativeInt = 0  # pairs per forward / backward inside a batch (0: the whole batch)
    rank: PositiveInt = 8
    alpha: PositiveFloat = 4.0
    dropout: float = Field(0.05, ge=0, lt=1)
    batch_size: PositiveInt = 32
    epochs: PositiveFloat = 3.0
    # One lr grid for every method, each method's lr chosen per source on a held-out slice of the first seed's
    # training pairs (select_fraction of each labeler's); a one-value grid runs no selection fits
    lr_grid: Grid[PositiveFloat] = [3e-3]
    select_fraction: float = Field(0.2, gt=0, lt=1)
    linear_schedule: bool = True
    methods: Grid[TextMethod] = ["global", "frozen", "frozen_per_user", "local", "share_rep", "share_rep_same_head",
                                 "pshare_si", "pshare_g", "pshare_wu", "share_a"]  # the phased Share Rep: when listed

    @model_validator(mode="after")
    def _data_iff_jsonl(self) -> TextConfig:
        if ("jsonl" in self.sources) != (self.data is not None):
            raise ValueError("text.data (the pairs JSONL) and the source 'jsonl' in text.sources go together")
        return self

    def training(self, lr: float) -> TextTraining:
        """The method package's training settings at learning rate `lr`."""
        return TextTraining(rank=self.rank, alpha=self.alpha, dropout=self.dropout, batch_size=self.batch_size,
                            epochs=self.epochs, lr=lr, linear=self.linear_schedule, device=self.device,
                            targets=tuple(self.targets), micro_batch=self.micro_batch,
                            checkpointing=self.gradient_checkpointing)


class Config(Strict):
    seeds: Grid[NonNegativeInt] = [0, 1, 2]
    problem: ProblemConfig = ProblemConfig()
    train: TrainConfig = TrainConfig()
    methods: Distinct[SyntheticMethod] = list(METHODS)  # empty: no synthetic comparison or sweeps
    sweep: SweepConfig = SweepConfig()
    bandit: BanditConfig = BanditConfig()  # spec §8.3, on the main problem's truth
    federated: FederatedConfig = FederatedConfig()  # users as clients, on the main problem
    engine: EngineOptions = EngineOptions()  # fault handling and the engine (simulator or Flower) of the federated part
    text: TextConfig = TextConfig()  # spec §8.4: MiniLM reward models on TL;DR-like and HH-RLHF text
    workers: PositiveInt = 1  # processes for the independent fits (each is seeded on its own: results do not change)

    def sweep_seeds(self) -> list[int]:
        """The sweeps' seeds: their own, else the main comparison's."""
        return self.sweep.seeds or self.seeds

    def text_seeds(self) -> list[int]:
        """The text part's seeds: its own, else the main comparison's."""
        return self.text.seeds if self.text.seeds is not None else self.seeds
