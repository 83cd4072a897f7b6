"""The FSLoRA reproduction's config: the synthetic problem, GLUE, commonsense, the federation, ablations, theory."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.config import Distinct, Fraction, Grid, Strict, validate
from collabalign.federation.engine import EngineOptions
from collabalign.methods.fslora.commonsense import CommonsenseSetup
from collabalign.methods.fslora.glue import GlueSetup
from collabalign.methods.fslora.problems import LocalSGD

Momentum = Annotated[float, Field(ge=0, lt=1)]  # SGD momentum: 0 plain SGD, below 1


class SyntheticConfig(Strict):
    n_train: PositiveInt = 1000  # data-scarce: ~50 samples per device, the regime the paper motivates
    n_test: PositiveInt = 4000
    dim: PositiveInt = 64
    classes: int = Field(10, ge=2)
    update_rank: PositiveInt = 24
    lr: PositiveFloat = 0.1
    extra_lrs: Distinct[PositiveFloat] = [0.05, 0.2]  # E1 repeated at these step sizes: the ordering depends on them


class FederationConfig(Strict):
    devices: PositiveInt = 20
    alpha: PositiveFloat = 0.5  # Dirichlet label split; the paper's code uses 0.1 (see notes)
    min_size: NonNegativeInt = 8
    rank: PositiveInt = 32
    ratios: Grid[Fraction] = [0.125, 0.25, 0.5, 0.75]
    steps: PositiveInt = 10
    batch_size: PositiveInt = 16
    rounds: PositiveInt = 30
    eval_every: PositiveInt = 5
    lora_alpha: PositiveFloat = 1.0
    momentum: Momentum = 0.0  # local SGD momentum (fresh each round); the authors' GLUE code uses 0.9, eq. 4 none
    optimizer: Literal["sgd", "adamw"] = "sgd"  # the devices' (and the references') local optimiser, fresh each round
    weight_decay: Annotated[float, Field(ge=0)] = 0.0  # adamw only
    server_opt: Literal["sgd", "adam"] = "sgd"  # sgd = eq. 5; adam = the authors' code (FSLoRA/FedLoRA/HeteroLoRA)
    server_lr: PositiveFloat = 5e-4
    flexlora_sigma: Literal["B", "sqrt"] = "B"  # where FlexLoRA's singular values go (the code: all into B)

    def local_sgd(self, lr: float) -> LocalSGD:
        """A device's training per round under this federation, at step size `lr`."""
        return LocalSGD(self.steps, lr, self.batch_size, self.momentum, optimizer=self.optimizer,
                        weight_decay=self.weight_decay)


class LabelledJsonl(Strict):
    """The user's labelled-text JSONL (data/formats.py: text, text_pair?, label) as one more task of the GLUE part."""

    source: Literal["jsonl"]
    path: str
    name: str  # the task's name in records, tables and glue.budget_task
    dev_fraction: float = Field(0.2, gt=0, lt=1)  # rows held out (seeded) as the task's dev split


class GlueConfig(Strict):
    tasks: Distinct[str] = []
    data: LabelledJsonl | None = None  # a labelled-text JSONL run after the GLUE tasks, as one more task
    backbone: str = "minilm-l6"  # or any Hugging Face encoder name / path, e.g. roberta-base as in the paper
    max_train: PositiveInt = 2000
    max_test: PositiveInt | None = None  # the first N dev rows (None: the whole dev split)
    max_length: PositiveInt = 64
    pair_max_length: PositiveInt | None = None  # pair tasks (MRPC, RTE, STS-B, ...) cut here instead (None: max_length)
    segments: bool = True  # pair tasks with segment ids (the second sentence is segment 1, as BERT was pre-trained)
    min_words: dict[str, NonNegativeInt] = {}  # per task: training texts with fewer words left out, e.g. {SST-2: 10}
    lora_blocks: PositiveInt = 6  # LoRA in the top N blocks (the paper: every block); the blocks below run once
    targets: Grid[str] = ["query", "value"]
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1  # LoRA dropout (the paper's Table A.1)
    # One grid (lr x lora_alpha) for every arm; each arm's point is chosen per task on a held-out training slice
    lr_grid: Grid[PositiveFloat] = [0.01, 0.03, 0.1]
    alpha_grid: Grid[PositiveFloat] = [8.0]
    select_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.2  # of the training examples, held out to choose lr
    select_eval_every: PositiveInt | None = None  # selection runs score the slice this often (None: eval_every);
    # only their final round chooses the grid point: at the rounds' count they score round 0 and the last only
    budget_task: str | None = None  # E2 (equal upload budget) on this task too
    gate: bool = True  # the five methods run only on tasks whose references show them learned (glue.py)
    device: str = "cpu"
    # bfloat16: matrix products of the LoRA blocks and head under autocast (weights, optimiser and losses float32);
    # half float32's step time on this CPU with AMX (benchmarks/fslora_cost.py), slower on CPUs without bfloat16 units
    precision: Literal["float32", "bfloat16"] = "float32"
    federation: dict[str, float | int | str] = {}  # overrides of the federation section for GLUE, e.g. {rounds: 10}

    @model_validator(mode="after")
    def _task_names_valid(self) -> GlueConfig:
        if self.data is not None and self.data.name in self.tasks:
            raise ValueError(f"data.name {self.data.name!r} is also one of tasks {self.tasks}: name the JSONL task "
                             "apart")
        if self.budget_task is not None and self.budget_task not in self.task_names:
            raise ValueError(f"budget_task {self.budget_task!r} is not one of the tasks {self.task_names}")
        return self

    @property
    def task_names(self) -> list[str]:
        """The tasks the GLUE part runs: `tasks`, then the JSONL task when `data` is set."""
        return [*self.tasks, *([] if self.data is None else [self.data.name])]

    def setup(self, fed: FederationConfig, task: str) -> GlueSetup:
        """The method layer's settings of one task's problem under federation `fed` (lr: set per run by glue.py)."""
        return GlueSetup(rank=fed.rank, sgd=fed.local_sgd(self.lr_grid[0]), max_train=self.max_train,
                         max_length=self.max_length, lora_blocks=self.lora_blocks, targets=tuple(self.targets),
                         max_test=self.max_test, dropout=self.dropout, device=self.device,
                         pair_max_length=self.pair_max_length, segments=self.segments,
                         min_words=self.min_words.get(task, 0), precision=self.precision)


class CommonsenseConfig(Strict):
    """Commonsense170K training, per-task LLM-Adapters test sets; runs E1 when both paths are given."""

    train_file: str | None = None  # LLM-Adapters' ft-training_set/commonsense_170k.json
    test_root: str | None = None  # LLM-Adapters' dataset/ folder, holding <task>/test.json
    tasks: Grid[str] = ["boolq", "piqa", "social_i_qa", "hellaswag", "winogrande", "ARC-Challenge", "ARC-Easy",
                        "openbookqa"]
    backbone: str = "tiny-llama"  # any causal LM name or path, e.g. meta-llama/Llama-3.2-3B-Instruct
    max_train: PositiveInt | None = None  # None: all of Commonsense170K
    max_test: PositiveInt | None = None  # None: every test row of each task
    max_length: PositiveInt = 256
    max_new_tokens: PositiveInt = 10
    targets: Grid[str] = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
    lr: PositiveFloat = 3e-4
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
    budget_ranks: Grid[PositiveInt] = [8, 16, 32]
    budget_ratio: Fraction = 0.5
    many_devices: PositiveInt | None = 50  # E2 again with this many devices (Figs. 8, 9); None: not run
    many_devices_ranks: Grid[PositiveInt] = [4, 16, 64]
    ratio_grid: Grid[Fraction] = [0.125, 0.25, 0.5, 1.0]
    rank_grid: Grid[PositiveInt] = [8, 16, 32, 64]  # Fig. 4(b); at most synthetic.dim
    fixed_k: PositiveInt = 8
    rank_rounds_scale: bool = True  # E4 runs federation.rounds * r / fixed_k rounds: equal expected updates per column
    top_k: Fraction = 0.5
    top_k_rounds: PositiveInt = 10  # at ratio 1; a run at ratio q gets rounds / q (equal upload)

    @model_validator(mode="after")
    def _fixed_k_fits(self) -> AblationConfig:
        if self.fixed_k > min(self.rank_grid):
            raise ValueError(f"fixed_k = {self.fixed_k} exceeds the smallest rank of rank_grid {self.rank_grid}")
        return self


class VariantsConfig(Strict):
    run: bool = True  # FFA-LoRA, FedSA-LoRA and FedEx-LoRA against Federated LoRA at equal upload bytes (variants.py)


class TheoryConfig(Strict):
    run: bool = True
    rate_rounds: Grid[PositiveInt] = [50, 100, 200, 400, 800]
    speedup_rounds: PositiveInt = 2000
    bias_rounds: PositiveInt = 2000


class Config(Strict):
    seeds: Grid[NonNegativeInt] = [0, 1, 2, 3, 4]
    synthetic: SyntheticConfig = SyntheticConfig()
    glue: GlueConfig = GlueConfig()
    commonsense: CommonsenseConfig = CommonsenseConfig()
    federation: FederationConfig = FederationConfig()
    engine: EngineOptions = EngineOptions()  # fault handling and the engine (simulator or Flower) of every run
    ablations: AblationConfig = AblationConfig()
    variants: VariantsConfig = VariantsConfig()
    theory: TheoryConfig = TheoryConfig()
    timing_reps: PositiveInt = 5  # E6: interleaved repetitions of 2 rounds per method

    @model_validator(mode="after")
    def _glue_federation_valid(self) -> Config:
        self.glue_federation()  # a bad glue.federation override is named before any work
        return self

    def glue_federation(self) -> FederationConfig:
        """The federation section with `glue.federation`'s overrides, validated (a bad key names glue.federation)."""
        return validate(FederationConfig, self.federation.model_dump() | self.glue.federation, "glue.federation")
