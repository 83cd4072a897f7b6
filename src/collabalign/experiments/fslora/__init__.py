"""FSLoRA reproduction (spec docs/methods/fslora.md §8.4): E1 main comparison with the heterogeneous-rank
baselines (+ FedLoRA at rank r as reference) on the synthetic teacher–student problem, GLUE tasks and commonsense
reasoning; E6 device and server time; E2–E5 ablations (equal upload budget, sketching ratio, global rank, top-k +
sketch); the LoRA variants built for averaging at equal upload bytes; the §7.5 theory checks. Every baseline uses the
same per-device ranks."""

from __future__ import annotations

from collabalign.claims import Claim, not_run
from collabalign.experiments.fslora.ablations import CLAIMS as ABLATION_CLAIMS
from collabalign.experiments.fslora.ablations import ablations_part
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.e1_comparison import e1_part
from collabalign.experiments.fslora.e6_timing import e6_part
from collabalign.experiments.fslora.theory import CLAIMS as THEORY_CLAIMS
from collabalign.experiments.fslora.theory import theory_part
from collabalign.experiments.fslora.variants import CLAIMS as VARIANT_CLAIMS
from collabalign.experiments.fslora.variants import variants_part
from collabalign.runs import Part, RunDir

TITLE = "FSLoRA: federated sketching LoRA vs heterogeneous-rank baselines"

__all__ = ["TITLE", "Config", "run"]


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    parts = [e1_part(cfg, run_dir.path, progress), e6_part(cfg)]
    parts.append(ablations_part(cfg, run_dir.path, progress) if cfg.ablations.run
                 else switched_off(ABLATION_CLAIMS, "ablations.run is false"))
    parts.append(variants_part(cfg, run_dir.path, progress) if cfg.variants.run
                 else switched_off(VARIANT_CLAIMS, "variants.run is false"))
    parts.append(theory_part(cfg) if cfg.theory.run else switched_off(THEORY_CLAIMS, "theory.run is false"))
    run_dir.write_parts(parts, plot_metrics=[])


def switched_off(claims: tuple[Claim, ...], reason: str) -> Part:
    """The declared claims of a part the config switched off."""
    return Part([not_run(claim, reason) for claim in claims])
