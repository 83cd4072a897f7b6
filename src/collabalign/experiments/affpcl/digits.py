"""Fig. 2 of AffPCL on the real-data substitute for FEMNIST (spec §5.2, §8.2, §9 item 13): digits features from a
pre-trained MLP, 10 users with different labels (delta_obj) and different class mixtures; test MSE, means and medians
with 90% bands. Runs are the replicates (users' mixtures are redrawn per run and shared by every method and setting).

The main setting is the paper's (App. B): AffPCL without importance correction against independent learning and
FedAvg, all with step 0.002, batch 32 and 70 local steps (samples) between two communication rounds. The setting used
before issue 16 (one step per round at step 1, every baseline, AffPCL with and without importance correction, batches
32 and 1) is kept as a labelled ablation."""

from __future__ import annotations

from typing import NamedTuple

from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Grid, Probability, Strict
from collabalign.data.digit_features import DigitFeatures, digit_features
from collabalign.experiments.affpcl import plots
from collabalign.experiments.affpcl.problems.digits import DigitsUsers
from collabalign.experiments.affpcl.shared import LOWER, MATCH, bands, summary
from collabalign.methods.affpcl import IL, AffPCL, Ditto, FineTune, LocalAffPCL, LocalFedAvg, OneStepFedAvg, PFedMe, run
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

# "Matches" and "lowest (or tied)" are one-sided with MATCH's margin, a factor 1.5 (reason in shared.py); they are the
# claims declared in issue 12, decided unchanged in the paper's setting. In the ablation, batch 1 (the theory's one
# sample per step) was added after its results were seen.
HOMOGENEOUS = claims.non_inferiority(
    "AffPCL matches FedAvg when objectives agree",
    "per-run final test MSE ratio AffPCL / FedAvg at the lowest delta_obj not above 1.5 (one-sided; users still "
    "differ in class mixture)", **MATCH)
LOWEST = claims.non_inferiority(
    "AffPCL has the lowest test MSE at every delta_obj",
    "best or tied in every (delta_obj, rival) cell: per-run ratio AffPCL / rival not above 1.5, Holm over the cells",
    **MATCH)
FLIP = claims.superiority(
    "FedAvg vs independent learning flips with heterogeneity",
    "FedAvg's per-run test MSE below IL's at the lowest delta_obj and IL's below FedAvg's at the highest, Holm over "
    "both", **LOWER)
PAPER_BATCH = 32

LABELS = {"il": "independent", "fedavg": "FedAvg", "affpcl": "AffPCL (exact rho)",
          "affpcl_no_ic": "AffPCL, no importance correction", "finetune": "fine-tuning",
          "pfedme": "pFedMe (simplified)", "ditto": "Ditto"}
PAPER_LABELS = {"il": "independent", "fedavg": "FedAvg", "affpcl": "AffPCL (no importance correction)"}


class PerStepAblation(Strict):
    """The setting before issue 16, an ablation: communication every step at half the per-sample stability limit."""

    run: bool = True
    alpha: PositiveFloat = 1.0  # half the per-sample stability limit 2 / max ||phi||^2 (features scaled to max norm 1)
    batches: Grid[PositiveInt] = [32, 1]  # the paper's batch 32, and one sample per step (the theory's setting)
    steps: PositiveInt = 300
    reg: PositiveFloat = 0.15  # pFedMe / Ditto: alpha * reg = 0.15 as in Fig. 1 (0.01 * 15)
    eval_every: PositiveInt = 10
    window: PositiveInt = 3  # evaluations averaged for the final test MSE (the last 30 steps)


class DigitsConfig(Strict):
    run: bool = True
    n: PositiveInt = 10
    runs: PositiveInt = 10
    levels: Grid[NonNegativeFloat] = [0.0, 0.2, 0.6, 1.0]  # delta_obj, the paper's FEMNIST levels
    alpha: PositiveFloat = 0.002  # the paper's step
    batch: PositiveInt = 32  # the paper's batch
    local: PositiveInt = 70  # the paper's samples (local steps) between two communication rounds
    rounds: PositiveInt = 100  # not stated in the paper: what fits the part's time budget
    window: PositiveInt = 3  # rounds averaged for the final test MSE
    skew: Probability = 0.5  # class-mixture skew: environment heterogeneity, like FEMNIST's writers
    concentration: PositiveFloat = 0.5
    per_step: PerStepAblation = PerStepAblation()


class Setting(NamedTuple):
    """One Fig. 2 setting: its claim tag, file name, methods, minibatch, step, steps, evaluation period and window."""

    tag: str
    name: str
    methods: dict
    batch: int
    alpha: float
    steps: int
    every: int
    window: int


def settings(cfg: DigitsConfig) -> list[Setting]:
    """The paper's setting, then the per-step ablation at each of its batch sizes."""
    paper = Setting("Fig. 2", "paper", {"il": IL(), "fedavg": LocalFedAvg(cfg.local), "affpcl": LocalAffPCL(cfg.local)},
                    cfg.batch, cfg.alpha, cfg.rounds * cfg.local, cfg.local, cfg.window)
    ab = cfg.per_step
    per_step = {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(central="oracle"),
                "affpcl_no_ic": AffPCL(central="oracle", weights="none"), "finetune": FineTune(),
                "pfedme": PFedMe(ab.reg), "ditto": Ditto(ab.reg)}
    return [paper] + [Setting(f"Fig. 2 ablation: per-step, alpha {ab.alpha:g}, batch {b}", f"per_step_batch{b}",
                              per_step, b, ab.alpha, ab.steps, ab.eval_every, ab.window)
                      for b in (ab.batches if ab.run else [])]


def part(cfg: DigitsConfig, seeds: Seeds, run_dir: RunDir, progress: bool = True) -> Part:
    """Claims and per-evaluation records of Fig. 2 in the paper's setting and the ablation, at every delta_obj."""
    feats = digit_features(seeds.entropy("digits/features") % 2**31)
    decided, records, final = [], [], {}
    for s in settings(cfg):
        last, recs = run_setting(cfg, s, feats, seeds, run_dir, progress)
        records += recs
        final[s.name] = {f"{lv:g}": {m: summary(v) for m, v in last[lv].items()} for lv in cfg.levels}
        decided += setting_claims(s.tag, cfg.levels, last, post_hoc=s.name != "paper" and s.batch != PAPER_BATCH)
    metrics = {"fig2_digits": {"final_test_mse": final, "pretrain_accuracy": round(feats.pretrain_accuracy, 4),
                               "train_pool": int(feats.phi.shape[0]), "feature_dim": feats.d}}
    return Part(claims=decided, records=records, metrics=metrics, notes=[note(cfg)])


def run_setting(cfg: DigitsConfig, s: Setting, feats: DigitFeatures, seeds: Seeds, run_dir: RunDir,
                progress: bool) -> tuple[dict, list[dict]]:
    """Every method at every delta_obj in one setting: final test MSE per run (level -> method -> (R,)), the records
    and the plot. The ablation keeps the seed streams it had before issue 16."""
    stream = "paper" if s.name == "paper" else str(s.batch)
    curves, last, records = {}, {}, []
    for level in cfg.levels:
        users = DigitsUsers(feats, seeds.numpy(f"digits/{level}/users"), cfg.runs, cfg.n, level, cfg.skew,
                            cfg.concentration, s.batch)
        errs = {m: run(method, users, s.steps, s.alpha, seeds.numpy(f"digits/{stream}/{level}/{m}"),
                       every=s.every)[0].mean(-1) for m, method in s.methods.items()}
        curves[level] = {m: bands(e, seeds.numpy(f"digits/bands/{stream}/{level}/{m}")) for m, e in errs.items()}
        last[level] = {m: e[-s.window:].mean(0) for m, e in errs.items()}
        records += [{"figure": "fig2", "setting": s.name, "batch": s.batch, "level": level, "method": m,
                     "step": (k + 1) * s.every, "test_mse_mean": float(b["mean"][k]),
                     "test_mse_median": float(b["median"][k])}
                    for m, b in curves[level].items() for k in range(len(b["mean"]))]
        if progress:
            print(f"affpcl fig2 ({s.name}): delta_obj {level:g} done", flush=True)
    rounds = f"{cfg.local} local steps" if s.name == "paper" else "one step"
    plots.fig1(run_dir.path / "plots" / f"fig2_digits_{s.name}.png", cfg.levels, curves,
               PAPER_LABELS if s.name == "paper" else LABELS,
               f"{s.tag} (digits substitute): n = {cfg.n}, {cfg.runs} runs, alpha = {s.alpha:g}, batch {s.batch}, "
               f"{rounds} per round", every=s.every, ylabel="test MSE", level_name="delta_obj")
    return last, records


def setting_claims(tag: str, levels: list[float], last: dict, post_hoc: bool) -> list[dict]:
    """Matches FedAvg at the lowest delta_obj; lowest (or tied) against every other method run, at every level;
    FedAvg vs IL flips."""
    zero, top = min(levels), max(levels)
    rivals = [m for m in last[zero] if m != "affpcl"]
    cells = {f"{lv:g}/{m}": (last[lv]["affpcl"], last[lv][m]) for lv in levels for m in rivals}
    flip = {f"delta_obj {zero:g}: FedAvg below IL": (last[zero]["fedavg"], last[zero]["il"]),
            f"delta_obj {top:g}: IL below FedAvg": (last[top]["il"], last[top]["fedavg"])}
    at = f"(delta_obj = {zero:g})"
    return [tagged(HOMOGENEOUS, tag, at, post_hoc).decide(last[zero]["affpcl"], last[zero]["fedavg"],
                                                          affpcl=summary(last[zero]["affpcl"]),
                                                          fedavg=summary(last[zero]["fedavg"])),
            tagged(LOWEST, tag, post_hoc=post_hoc).decide_cells(cells),
            tagged(FLIP, tag, post_hoc=post_hoc).decide_cells(flip)]


def note(cfg: DigitsConfig) -> str:
    """The report paragraph describing the Fig. 2 substitute."""
    ab = cfg.per_step
    ablation = (f" Ablation (the setting before issue 16): one step per round at step {ab.alpha:g}, batches "
                f"{ab.batches}, {ab.steps} steps, AffPCL with exact class density ratios and without, fine-tuning, "
                f"pFedMe and Ditto; final test MSE = mean of the last {ab.window} evaluations (every {ab.eval_every} "
                "steps)." if ab.run else "")
    return (f"Fig. 2 substitute (no FEMNIST offline): scikit-learn digits, 84 ReLU features of an MLP pre-trained on "
            f"40% of the images (scaled to max norm 1), {cfg.n} users with labels lambda a1 + (1 - lambda) a2 (a1: "
            f"closed loop 0/6/8/9, a2: digit >= 5), lambda evenly spaced over delta_obj, class mixtures "
            f"(1 - {cfg.skew:g}) uniform + {cfg.skew:g} Dirichlet({cfg.concentration:g}) per user and run; least "
            f"squares, {cfg.runs} runs. The paper's setting: IL, FedAvg and AffPCL without importance correction "
            f"(oracle central label, lambda-bar = 0.5; CDL (22-1) as FedAvg's local SGD), step {cfg.alpha:g}, batch "
            f"{cfg.batch}, {cfg.local} local steps per communication round (AffPCL's server direction frozen within a "
            f"round, spec §9 item 13), {cfg.rounds} rounds (the paper does not state its number); final test MSE = "
            f"mean of the user-averaged test MSE after the last {cfg.window} rounds. Our features have max norm 1, so "
            f"step {cfg.alpha:g} is 1/{2 / cfg.alpha:g} of the per-sample stability limit; the paper's feature scale "
            "is not stated." + ablation)
