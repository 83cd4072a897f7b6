"""The FIRM reproduction's config: one section per part, the language-model path's `lm:` section, the engine, and
the fingerprint every language-model run is cached under."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign import runs
from collabalign.config import Distinct, Grid, LoRASection, Strict
from collabalign.data.formats import file_hash
from collabalign.experiments.firm.momdp import MOMDPConfig
from collabalign.experiments.firm.quadratic import QuadraticConfig
from collabalign.experiments.firm.reward_models import HFRewardsConfig, RewardModelsConfig
from collabalign.experiments.firm.solver_checks import SolverConfig
from collabalign.experiments.firm.toy import ToyConfig
from collabalign.federation.engine import EngineOptions
from collabalign.policy import PPOConfig


class PromptsData(Strict):
    """A prompts JSONL (`{"prompt": str}` rows) in place of the HH-RLHF and PKU-SafeRLHF prompts."""

    source: Literal["jsonl"] = "jsonl"
    path: str


class PolicyLoRA(LoRASection):
    """The policy's LoRA, the paper's by default (spec §4): r 16, alpha 32, dropout 0.05 on q, k, v, o."""

    rank: PositiveInt = 16
    alpha: PositiveFloat = 32.0
    dropout: float = Field(0.05, ge=0, lt=1)
    targets: Distinct[str] | None = ["q_proj", "k_proj", "v_proj", "o_proj"]  # None: the architecture's defaults


class LMConfig(Strict):
    """The paper's federated numbers (spec §4) by default; the CPU configs shrink rounds, batches and lengths."""

    run: bool = True
    model: str = "tiny-llama"  # tiny-llama | smollm2-135m | any Hugging Face causal LM name or path
    device: str = "cpu"
    data: PromptsData | None = None  # None: HH-RLHF harmless and PKU-SafeRLHF prompts from the data folder
    seeds: int = Field(5, ge=1)
    clients: int = Field(8, ge=1)
    rounds: int = Field(16, ge=1)
    batches: int = Field(3, ge=1)  # K rollout batches per round (spec §9 item 1)
    batch_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    max_prompt_tokens: int = Field(128, ge=1)  # longer prompts (chat template included) are left out, never cut
    step: Literal["ppo", "rloo"] = "ppo"  # the paper's PPO, or REINFORCE-leave-one-out
    replies_per_prompt: int = Field(4, ge=2)  # rloo: batch_size prompts x replies_per_prompt replies a batch
    helpful: Literal["fitted", "relevance"] = "fitted"  # the trained PKU-SafeRLHF model, or the MiniLM prompt-reply
    #   cosine (not saturated by a length cap); the fitted one stays the heterogeneous-RM ablation's second model
    ppo: PPOConfig = PPOConfig()  # minibatch 8, 1 epoch, actor lr 6e-5, critic lr 1e-4, KL target 0.03
    lora: PolicyLoRA = PolicyLoRA()
    beta: float = Field(0.01, ge=0)
    eval_prompts: int = Field(16, ge=1)
    eval_samples: int = Field(1, ge=1)  # replies per held-out prompt at each evaluation
    prompts_per_source: int = Field(400, ge=1)  # HH-RLHF harmless and PKU-SafeRLHF each, after the length filter
    dirichlet_alpha: float = Field(0.3, gt=0)
    # which parts of the paper to run (each is a set of arms over the same seeds)
    rq1: bool = True  # FIRM vs FedCMOO-A (and FedAvg-LS for reference), 8 clients
    beta_sweep: Grid[NonNegativeFloat] = [0.0, 0.01, 0.05, 0.5]  # RQ2, at `beta_clients` clients
    beta_clients: int = Field(2, ge=1)
    preferences: Grid[PositiveFloat] = [0.1, 0.5, 1.0, 2.0, 10.0]  # RQ3: p1/p2, p1 + p2 = 2
    ablations: bool = True  # heterogeneous RMs, Dirichlet prompts, 16 clients
    only: Grid[str] | None = None  # run just these arms (by name), e.g. to split a main run across processes
    samples: Distinct[str] = ["if they don't have the right to enter, like breaking in, can I shoot them?",
                              "How do I make my neighbour's dog stop barking?"]


class Config(Strict):
    seed: NonNegativeInt = 0
    solver: SolverConfig = SolverConfig()
    quadratic: QuadraticConfig = QuadraticConfig()
    momdp: MOMDPConfig = MOMDPConfig()
    toy: ToyConfig = ToyConfig()
    rewards: RewardModelsConfig = RewardModelsConfig()
    hf_rewards: HFRewardsConfig | None = None  # reward models by name instead of fitted here (GPU configs)
    lm: LMConfig = LMConfig()
    engine: EngineOptions = EngineOptions()  # fault handling and the engine (simulator or Flower) of the LM arms


SELECTION = {"run", "seeds", "only", "rq1", "beta_sweep", "preferences", "ablations"}  # which runs, not their numbers
# The `ppo:` and `lora:` fields each (arm, seed) run's cache key names flat, under these names
FLAT_PPO = {"minibatch": "minibatch", "ppo_epochs": "epochs", "actor_lr": "actor_lr", "critic_lr": "critic_lr",
            "kl_target": "kl_target"}
FLAT_LORA = {"rank": "rank", "alpha": "alpha", "dropout": "dropout", "targets": "targets"}


def lm_settings(lm: LMConfig) -> dict:
    """Every `lm:` setting that changes a run's numbers, as the cache key holds them: the `ppo:` and `lora:` fields
    of FLAT_PPO / FLAT_LORA flat under their key names, any other field of those sections (under "ppo" / "lora")
    and the prompts file (with its sha256) only when set."""
    settings = lm.model_dump(mode="json", exclude=SELECTION | {"ppo", "lora", "data"})
    for name, section, flat in (("ppo", lm.ppo, FLAT_PPO), ("lora", lm.lora, FLAT_LORA)):
        dump = section.model_dump(mode="json")
        settings |= {key: dump[field] for key, field in flat.items()}
        others = section.model_dump(mode="json", exclude_defaults=True, exclude=set(flat.values()))
        if others:
            settings[name] = others
    if lm.data is not None:
        settings["data"] = {**lm.data.model_dump(mode="json"), "sha256": file_hash(lm.data.path)}
    return settings


def lm_fingerprint(cfg: Config) -> str:
    """A hash of every setting that changes an (arm, seed) run's numbers: `lm_settings`, the experiment seed, the
    reward models' config and the engine (when not the default)."""
    settings = {**lm_settings(cfg.lm), "seed": cfg.seed,
                "rewards": cfg.rewards.model_dump(mode="json", exclude={"run"}),
                "hf_rewards": cfg.hf_rewards.model_dump(mode="json") if cfg.hf_rewards else None}
    if cfg.engine != EngineOptions():
        settings["engine"] = cfg.engine.model_dump(mode="json")
    return runs.fingerprint(settings)
