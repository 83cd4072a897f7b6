"""The FSLoRA reproduction's config: the synthetic problem, GLUE, commonsense, the federation, ablations, theory."""

from __future__ import annotations

from typing import Literal

from collabalign.config import Strict, validate
from collabalign.methods.fslora.commonsense import CommonsenseSetup
from collabalign.methods.fslora.problems import GlueSetup, LocalSGD


class SyntheticConfig(Strict):
    n_train: int = 1000  # data-scarce: ~50 samples per device, the regime the paper motivates
    n_test: int = 4000
    dim: int = 64
    classes: int = 10
    update_rank: int = 24
    lr: float = 0.1
    extra_lrs: list[float] = [0.05, 0.2]  # E1 repeated at these step sizes: the ordering is regime-dependent


class FederationConfig(Strict):
    devices: int = 20
    alpha: float = 0.5  # Dirichlet label split; the paper's code uses 0.1 (see notes)
    min_size: int = 8
    rank: int = 32
    ratios: list[float] = [0.125, 0.25, 0.5, 0.75]
    steps: int = 10
    batch_size: int = 16
    rounds: int = 30
    eval_every: int = 5
    lora_alpha: float = 1.0
    momentum: float = 0.0  # local SGD momentum (fresh each round); the authors' GLUE code uses 0.9, eq. 4 none
    server_opt: Literal["sgd", "adam"] = "sgd"  # sgd = eq. 5; adam = the authors' code (FSLoRA/FedLoRA/HeteroLoRA)
    server_lr: float = 5e-4
    flexlora_sigma: Literal["B", "sqrt"] = "B"  # where FlexLoRA's singular values go (the code: all into B)

    def local_sgd(self, lr: float) -> LocalSGD:
        """A device's training per round under this federation, at step size `lr`."""
        return LocalSGD(self.steps, lr, self.batch_size, self.momentum)


class GlueConfig(Strict):
    tasks: list[str] = []
    backbone: str = "minilm-l6"  # or any Hugging Face encoder name / path, e.g. roberta-base as in the paper
    max_train: int = 2000
    max_length: int = 64
    lora_blocks: int = 1  # LoRA in the top N blocks; the blocks below run once, as cached features
    targets: list[str] = ["query", "value"]
    lr: float = 0.5
    device: str = "cpu"
    # (lr, momentum, lora_alpha) settings run with FSLoRA on the first task and seed before E1: how much LoRA adds
    sensitivity: list[tuple[float, float, float]] = []
    federation: dict[str, float | int] = {}  # overrides of the federation section for GLUE, e.g. {rounds: 10}

    def setup(self, fed: FederationConfig) -> GlueSetup:
        """The method layer's settings of a GLUE problem under federation `fed`."""
        return GlueSetup(rank=fed.rank, sgd=fed.local_sgd(self.lr), max_train=self.max_train,
                         max_length=self.max_length, lora_blocks=self.lora_blocks, targets=tuple(self.targets),
                         device=self.device)


class CommonsenseConfig(Strict):
    """Commonsense170K training, per-task LLM-Adapters test sets; runs E1 when both paths are given."""

    train_file: str | None = None  # LLM-Adapters' ft-training_set/commonsense_170k.json
    test_root: str | None = None  # LLM-Adapters' dataset/ folder, holding <task>/test.json
    tasks: list[str] = ["boolq", "piqa", "social_i_qa", "hellaswag", "winogrande", "ARC-Challenge", "ARC-Easy",
                        "openbookqa"]
    backbone: str = "tiny-llama"  # any causal LM name or path, e.g. meta-llama/Llama-3.2-3B-Instruct
    max_train: int | None = None  # None: all of Commonsense170K
    max_test: int | None = None  # None: every test row of each task
    max_length: int = 256
    max_new_tokens: int = 10
    targets: list[str] = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
    lr: float = 3e-4
    device: str = "cpu"

    @property
    def configured(self) -> bool:
        return self.train_file is not None and self.test_root is not None

    def setup(self, fed: FederationConfig) -> CommonsenseSetup:
        """The method layer's settings of the commonsense problem under federation `fed`."""
        return CommonsenseSetup(self.train_file, self.test_root, tuple(self.tasks), rank=fed.rank,
                                sgd=fed.local_sgd(self.lr), targets=tuple(self.targets), max_train=self.max_train,
                                max_test=self.max_test, max_length=self.max_length,
                                max_new_tokens=self.max_new_tokens, device=self.device)


class AblationConfig(Strict):
    run: bool = True
    budget_ranks: list[int] = [8, 16, 32]
    budget_ratio: float = 0.5
    ratio_grid: list[float] = [0.125, 0.25, 0.5, 1.0]
    rank_grid: list[int] = [4, 8, 16, 32]
    fixed_k: int = 4
    top_k: float = 0.5
    top_k_rounds: int = 10  # at ratio 1; a run at ratio q gets rounds / q (equal upload)


class TheoryConfig(Strict):
    run: bool = True
    rate_rounds: list[int] = [50, 100, 200, 400, 800]
    speedup_rounds: int = 2000
    bias_rounds: int = 2000


class Config(Strict):
    seeds: list[int] = [0, 1, 2, 3, 4]
    synthetic: SyntheticConfig = SyntheticConfig()
    glue: GlueConfig = GlueConfig()
    commonsense: CommonsenseConfig = CommonsenseConfig()
    federation: FederationConfig = FederationConfig()
    ablations: AblationConfig = AblationConfig()
    theory: TheoryConfig = TheoryConfig()
    timing_reps: int = 5  # E6: interleaved repetitions of 2 rounds per method

    def glue_federation(self) -> FederationConfig:
        """The federation section with `glue.federation`'s overrides, validated (a bad key names glue.federation)."""
        return validate(FederationConfig, self.federation.model_dump() | self.glue.federation, "glue.federation")
