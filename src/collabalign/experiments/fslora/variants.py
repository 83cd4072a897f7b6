"""The LoRA variants built for averaging against Federated LoRA at equal upload bytes, on the synthetic problem's
Dirichlet split of the E1 comparison: FFA-LoRA and FedSA-LoRA send one factor, so they run at rank 2r against
Federated LoRA's r (the layer is square: B (m, 2r) and A (2r, n) have as many entries as B and A at r); FedEx-LoRA sends
both factors at r (and downloads a dense base). Claims from the papers, declared before the runs; every arm uses the
E1 devices, local steps and step size."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.claims import Claim, exact, non_inferiority, superiority
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.runner import (
    Arm,
    Runner,
    devices,
    run_cache,
    score,
    synthetic_fingerprint,
    synthetic_problem,
)
from collabalign.experiments.fslora.scores import mean_std
from collabalign.runs import Part

FFA = non_inferiority(
    "FFA-LoRA is no worse than Federated LoRA at equal upload bytes",
    "per seed, FFA-LoRA's (rank 2r, A frozen) final test accuracy at most 1 point below Federated LoRA's (rank r) "
    "(Sun et al. 2024: FFA-LoRA matches or beats it)", margin=1.0)
FEDEX = superiority(
    "FedEx-LoRA beats Federated LoRA", "per seed, FedEx-LoRA's final test accuracy above Federated LoRA's, both at "
    "rank r (Singhal et al. 2025: exact aggregation improves on averaging the factors)")
FEDSA = superiority(
    "FedSA-LoRA beats Federated LoRA at equal upload bytes",
    "per seed, the mean over devices of FedSA-LoRA's (rank 2r, B kept on the device) own models' final test accuracy "
    "above Federated LoRA's (rank r) global model's, on the one global test set (Guo et al. 2025 score each client on "
    "its own data, which this problem does not have)")
EQUAL_BYTES = exact(
    "the variants upload what Federated LoRA uploads",
    "upload bytes of FFA-LoRA, FedSA-LoRA and FedEx-LoRA over Federated LoRA's, seed 0: 1 within 1% (array headers)",
    tolerance=0.01)
CLAIMS: tuple[Claim, ...] = (FFA, FEDEX, FEDSA, EQUAL_BYTES)
ARMS = {"fedlora": 1, "ffa-lora": 2, "fedsa-lora": 2, "fedex-lora": 1}  # method: its rank over r


def variants_part(cfg: Config, run_path: Path, progress: bool = True) -> Part:
    fed, lr = cfg.federation, cfg.synthetic.lr
    runner = Runner(fed, cfg.engine, progress, cache=run_cache(run_path, "synthetic"), key=synthetic_fingerprint(cfg))
    scores: dict[str, list[float]] = {m: [] for m in ARMS}
    for seed in cfg.seeds:
        for method, times in ARMS.items():
            problem, train = synthetic_problem(cfg.synthetic, fed, seed, times * fed.rank, lr)
            arm = Arm(method, times * fed.rank, fed.ratios, fed.rounds)
            scores[method].append(score(runner.run({"experiment": "variants"}, problem, devices(train, fed, seed), arm,
                                                   seed)))
    up = {m: max(r["upload_mb_per_device"] for r in runner.records if r["method"] == m and r["seed"] == cfg.seeds[0])
          for m in ARMS}
    ratio = max(abs(up[m] / up["fedlora"] - 1) for m in ARMS)
    a = {m: np.array(v) for m, v in scores.items()}
    claims = [FFA.decide(a["ffa-lora"], a["fedlora"]), FEDEX.decide(a["fedex-lora"], a["fedlora"]),
              FEDSA.decide(a["fedsa-lora"], a["fedlora"]), EQUAL_BYTES.decide(1 + ratio, 1.0)]
    rows = [f"| {m} | {ARMS[m]}r | {mean_std(v)[0]:.2f} ± {mean_std(v)[1]:.2f} | {up[m]:.4f} |" for m, v in a.items()]
    note = ("LoRA variants at equal upload bytes (synthetic problem, final test accuracy in points, mean ± std over "
            "seeds; upload MB per device over the run, seed 0):\n\n| method | rank | accuracy | upload MB |\n"
            "|---|---|---|---|\n" + "\n".join(rows))
    metrics = {"variants": {m: dict(zip(("mean", "std"), mean_std(v), strict=True)) for m, v in a.items()},
               "variants_upload_mb_per_device": up}
    return Part(claims, runner.records, metrics, [note])
