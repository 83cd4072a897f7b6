"""FIRM on a language-model policy (spec §5, Figs. 1-6, Table 1): PPO with LoRA on HH-RLHF and PKU-SafeRLHF
prompts (or a prompts JSONL, `lm.data`), helpful and harmless reward models trained here, every arm over the same
seeds. Claims are declared below before the code that runs them; seeds are the replicates; final held-out rewards
are the mean of the last two evaluated rounds."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from collabalign import claims
from collabalign.claims import tagged
from collabalign.comm import Ledger, Message
from collabalign.experiments.firm import lm_plots
from collabalign.experiments.firm.config import Config, LMConfig, lm_fingerprint
from collabalign.experiments.firm.lm_setup import Arm, LMRunner, arms
from collabalign.runs import Part, RunDir, cached_json
from collabalign.seeding import Seeds

REWARD_MARGIN = 0.02  # a reward difference smaller than this (on [0, 1]) is "comparable" (declared a priori)
CLOSE_MARGIN = 0.05  # ablations "closely matched" to the base run: final rewards within +-0.05
LAMBDA_MARGIN = 0.1  # ... and mean λ_help within +-0.1

LEARN_MARGIN = 0.02  # smallest gain over the base model worth calling learning (rewards on [0, 1]; declared a priori)

LEARNED = claims.superiority(
    "[LM] The task is learned: FIRM raises the mean of the two held-out rewards above the base model",
    "final (helpful + harmless) / 2 of FIRM's global model above the same at round 0 (the frozen base model)",
    smallest_effect=LEARN_MARGIN)
LEARNED_HARMLESS = claims.superiority(
    "[LM] Harmlessness is learned: FIRM at the smallest p1/p2 raises held-out harmlessness above the base model",
    "final held-out harmlessness at the sweep's smallest p1/p2 above the base model's (round 0), per seed",
    smallest_effect=LEARN_MARGIN)
LEARNED_HELPFUL = claims.superiority(
    "[LM] Helpfulness is learned: FIRM at the largest p1/p2 raises held-out helpfulness above the base model",
    "final held-out helpfulness at the sweep's largest p1/p2 above the base model's (round 0), per seed",
    smallest_effect=LEARN_MARGIN)
GATES = (LEARNED, LEARNED_HARMLESS, LEARNED_HELPFUL)  # the arms are ranked only on a task shown to be learned
# Written after the first main run: the gates above compare with the base model on round 0's sampling stream, a
# constant that carries that stream's evaluation noise (harmlessness 0.684 there, 0.726 on the final rounds' streams);
# scored on the same streams as the trained policies (common random numbers), that noise cancels.
SAME_STREAMS = {claim.name: claims.superiority(
    claim.name.replace(" above the base model", " above the base model on the same sampling streams"),
    claim.expected.replace("(round 0)", "on the final rounds' sampling streams"), smallest_effect=LEARN_MARGIN,
    post_hoc=True) for claim in GATES}
RQ1 = claims.non_inferiority(
    "[LM] RQ1: FIRM comparable to or better than FedCMOO-A on both rewards",
    f"final held-out reward FIRM - FedCMOO-A above -{REWARD_MARGIN} for helpfulness and harmlessness, Holm over "
    "the two", margin=REWARD_MARGIN)
DISPERSION = claims.superiority(
    "[LM] RQ2: across-client λ dispersion falls as β grows",
    "mean over steps of D_λ at each β above D_λ at the next larger β of the sweep, Holm over adjacent pairs",
    lower_is_better=True)
DISPERSION_ENDS = claims.superiority(
    "[LM] RQ2: λ dispersion at the largest β below β = 0",
    "mean D_λ at the sweep's largest β minus at β = 0 below 0", lower_is_better=True)
BETA0_WORSE = claims.superiority(
    "[LM] RQ2: β = 0.05 gives higher rewards than β = 0 (paper: helpfulness stuck near 0.46 without β)",
    "final held-out reward at β = 0.05 above β = 0 for helpfulness and harmlessness, Holm over the two")
PREFERENCE = claims.superiority(
    "[LM] RQ3: the preference vector steers the final rewards",
    "per-seed least-squares slope of final (helpful - harmless) against log(p1/p2) above 0")
MONOTONE = claims.superiority(
    "[LM] RQ3: the front is monotone: each larger p1/p2 gives a larger helpful - harmless gap",
    "final (helpful - harmless) at each p1/p2 of the sweep above at the next smaller one, paired per seed, Holm over "
    "adjacent pairs")
CLOSE_REWARD = claims.equivalence(
    "ablation: final held-out reward equal to the base FIRM run", f"paired difference within +-{CLOSE_MARGIN}",
    margin=CLOSE_MARGIN)
CLOSE_LAMBDA = claims.equivalence(
    "ablation: mean λ_help equal to the base FIRM run", f"paired difference within +-{LAMBDA_MARGIN}",
    margin=LAMBDA_MARGIN)
UPLOAD = claims.exact(
    "[LM] FIRM uploads d floats per client per round, FedCMOO-A M·d more (its gradient phase)",
    "array bytes uploaded by FedCMOO-A's gradient phase / FIRM's adapter upload = M = 2, from the ledger")

CLAIMS = (*GATES, *SAME_STREAMS.values(), RQ1, UPLOAD, DISPERSION, DISPERSION_ENDS, BETA0_WORSE, PREFERENCE,
          MONOTONE)


def not_run_part(reason: str) -> Part:
    """The LM part when it cannot run (no data, no reward models): every declared claim recorded as not run."""
    return Part([claims.not_run(c, reason) for c in CLAIMS], notes=[f"Language-model path not run: {reason}."])


def final(records: list[dict], key: str, last: int = 2) -> float:
    """Mean of `key` over the last `last` evaluated rounds of one run."""
    values = [r[key] for r in records if key in r and r["round"] > 0]
    return float(np.mean(values[-last:]))


def cached_run(runner: LMRunner, arm: Arm, seed: int, folder: Path, fingerprint: str, progress: bool) -> dict:
    """One (arm, seed) run's records, ledger rows and Table 1 samples, read from `folder` when a run with the same
    fingerprint (every setting that changes its numbers) finished there before, else run and saved: a main run
    killed midway, or split across processes (lm.only) into one folder, continues to the same results."""
    def compute() -> dict:
        start = time.perf_counter()
        records, ledger = runner.run(arm, seed, progress)
        wants_samples = seed == 0 and (arm.name == "firm" or arm.name.startswith("p1/p2"))
        return {"records": records, "ledger": [list(row) for row in ledger.rows],
                "samples": runner.samples() if wants_samples else None, "seconds": time.perf_counter() - start}

    return cached_json(folder / f"{arm.name.replace('/', '_')}__seed{seed}.json", fingerprint, compute)


def part(config: Config, rewards, seeds: Seeds, run_dir: RunDir, data_root: Path | None, progress: bool) -> Part:
    """Every switched-on arm over lm.seeds seeds (each (arm, seed) run cached in run_dir/lm_runs under
    `lm_fingerprint`), then the claims, plots and Table 1 samples."""
    cfg, fingerprint = config.lm, lm_fingerprint(config)
    runner = LMRunner(config, rewards, seeds, data_root)
    with runner.policy.reference():
        samples = {"base model": runner.samples()}
    results, ledgers, records, seconds = {}, {}, [], {}
    for arm in arms(cfg):
        results[arm.name] = []
        for s in range(cfg.seeds):
            done = cached_run(runner, arm, s, run_dir.path / "lm_runs", fingerprint, progress)
            results[arm.name].append(done["records"])
            if "seconds" in done:  # runs cached before the cost was recorded have none
                seconds.setdefault(arm.name, []).append(done["seconds"])
            records += [{"part": "lm", "arm": arm.name, "seed": s, **r} for r in done["records"]]
            if s == 0:
                ledgers[arm.name] = Ledger([tuple(row) for row in done["ledger"]])
                if done["samples"] is not None:
                    samples[arm.name] = done["samples"]
    same_streams = {k: float(np.mean([runner.base_on(t)[k] for t in (cfg.rounds - 1, cfg.rounds) if t > 0]))
                    for k in ("eval_helpful", "eval_harmless")}
    decided = decide(cfg, results, ledgers, runner, same_streams)
    earlier = {k: v for k, v in run_dir.read_ledgers().items() if not k.startswith("lm ")}  # the synthetic parts'
    run_dir.write_ledgers({**earlier, **{f"lm {arm} seed 0": led for arm, led in ledgers.items()}})
    lm_plots.plot_all(run_dir.path / "plots", results)
    label = "" if rewards.helpful_beats_baselines else f" **Helpfulness label:** {rewards.label}."
    notes = [f"Language-model path: {cfg.model}, {cfg.clients} clients, {cfg.rounds} rounds x {cfg.batches} batches "
             f"of {cfg.batch_size}, {cfg.max_new_tokens} new tokens, {cfg.seeds} seeds; {len(runner.prompts.train)} "
             f"train and {len(runner.prompts.eval)} held-out prompts ({runner.prompts.dropped_long} longer than "
             f"{cfg.max_prompt_tokens} tokens left out).{label}"]
    if all("eval_capped" in r[0] for runs in results.values() for r in runs):
        base = np.mean([r[0]["eval_capped"] for runs in results.values() for r in runs])
        trained = np.mean([final(r, "eval_capped") for runs in results.values() for r in runs])
        notes.append(f"Replies that reach the {cfg.max_new_tokens}-token cap: {base:.0%} of the base model's, "
                     f"{trained:.0%} of the trained policies' (mean over arms and seeds); the rewards score the text "
                     "up to the cap, and neither is a function of length.")
    gates = [c for c in decided if c["name"] in {g.name for g in (*GATES, *SAME_STREAMS.values())}]
    if failed := [c for c in gates if not claims.confirmed(c)]:
        named = "; ".join(f"\"{c['name']}\" is {c['verdict']}" for c in failed)
        notes.append(f"**Learning not shown:** {named}. The comparisons between arms below rank methods on a task "
                     "this run did not show to be learned; read them as checks that the arms behave alike, not as "
                     "evidence for the paper's orderings.")
    base0 = runner.base_on(0)
    notes.append(f"The base model on the final rounds' sampling streams: helpfulness "
                 f"{same_streams['eval_helpful']:.3f}, harmlessness {same_streams['eval_harmless']:.3f} (on round "
                 f"0's, the gates' baseline: {base0['eval_helpful']:.3f}, {base0['eval_harmless']:.3f}); the "
                 "difference is evaluation noise that the gates' constant baseline does not carry.")
    if seconds:
        notes.append("Cost per run (one thread, mean over the seeds that recorded it): " + ", ".join(
            f"{arm} {np.mean(t) / 60:.1f} min" for arm, t in seconds.items()) + ".")
    notes.append(table1(cfg.samples, samples))
    metrics = {"lm": {arm: {"final_helpful": [final(r, "eval_helpful") for r in runs],
                            "final_harmless": [final(r, "eval_harmless") for r in runs],
                            "lambda_help": [final(r, "lambda_0", last=10**6) for r in runs],
                            "lambda_dispersion": [final(r, "lambda_dispersion", last=10**6) for r in runs]}
                      for arm, runs in results.items()}, "lm_samples": samples,
               "lm_seconds": {arm: [round(x, 1) for x in t] for arm, t in seconds.items()},
               "lm_base_on_final_streams": same_streams}
    return Part(claims=decided, records=records, metrics=metrics, notes=notes)


def table1(prompts: list[str], samples: dict[str, list[str]]) -> str:
    """The paper's Table 1 analogue as markdown: each model's answer (temperature 0.7, one fixed stream) per prompt."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ").strip() or "(empty)"

    rows = [f"| {who} | {cell(p)} | {cell(r)} |" for who, texts in samples.items()
            for p, r in zip(prompts, texts, strict=True)]
    return "\n".join(["Table 1 analogue (seed 0's global models):", "", "| model | prompt | response |",
                      "|---|---|---|", *rows])


def decide(cfg: LMConfig, results: dict[str, list[list[dict]]], ledgers: dict, runner: LMRunner,
           base_final: dict[str, float] | None = None) -> list[dict]:
    """Every declared LM claim on the arms that ran; a claim whose arms did not run is recorded as not run."""
    def per_seed(arm: str, key: str, last: int = 2) -> np.ndarray:
        return np.array([final(r, key, last) for r in results[arm]])

    def missing(*arms: str) -> str:
        absent = [a for a in arms if a not in results]
        return f"arms not run: {', '.join(absent)}" if absent else ""

    both = ("eval_helpful", "eval_harmless")
    out = []
    if why := missing("firm"):
        out.append(claims.not_run(LEARNED, why))
    else:
        mean = (per_seed("firm", both[0]) + per_seed("firm", both[1])) / 2
        base0 = np.array([(r[0][both[0]] + r[0][both[1]]) / 2 for r in results["firm"]])
        out.append(LEARNED.decide(mean, base0, firm=mean.mean(), base_model=base0.mean()))
    out += single_objective_gates(cfg, results, per_seed)
    out += same_stream_gates(cfg, results, per_seed, base_final)
    if why := missing("firm", "fedcmoo-a"):
        out += [claims.not_run(RQ1, why), claims.not_run(UPLOAD, why)]
    else:
        ls = {k: per_seed("fedavg-ls", k).mean() for k in both} if "fedavg-ls" in results else None
        out.append(RQ1.decide_cells({k: (per_seed("firm", k), per_seed("fedcmoo-a", k)) for k in both},
                                    fedavg_ls=ls))
        out.append(upload_claim(ledgers, runner, cfg))
    name = {b: f"beta={b:g}/C={cfg.beta_clients}" for b in sorted(cfg.beta_sweep)}
    betas = [b for b in name if name[b] in results]
    if len(betas) < 2 or betas[0] != 0:
        out += [claims.not_run(c, "needs β = 0 and a larger β") for c in (DISPERSION, DISPERSION_ENDS)]
    else:
        disp = {b: per_seed(name[b], "lambda_dispersion", last=10**6) for b in betas}
        pairs = zip(betas, betas[1:], strict=False)
        out.append(DISPERSION.decide_cells({f"beta {a:g} -> {b:g}": (disp[b], disp[a]) for a, b in pairs},
                                           means={f"{b:g}": disp[b].mean() for b in betas}))
        out.append(DISPERSION_ENDS.decide(disp[betas[-1]], disp[0]))
    if 0.0 in betas and 0.05 in betas:
        out.append(BETA0_WORSE.decide_cells({k: (per_seed(name[0.05], k), per_seed(name[0.0], k)) for k in both}))
    else:
        out.append(claims.not_run(BETA0_WORSE, "needs β = 0 and β = 0.05 in the sweep"))
    return out + preference_claims(cfg, results, per_seed) + ablation_claims(cfg, results, per_seed)


def single_objective_gates(cfg: LMConfig, results: dict, per_seed) -> list[dict]:
    """Each reward learned on its own: the sweep's most harmless-leaning and most helpful-leaning preference arms
    against the base model (round 0, the same for every seed)."""
    return preference_gates(cfg, results, per_seed, (LEARNED_HARMLESS, LEARNED_HELPFUL),
                            lambda runs, key: np.array([r[0][key] for r in runs]))


def same_stream_gates(cfg: LMConfig, results: dict, per_seed, base: dict[str, float] | None) -> list[dict]:
    """The three gates against the base model scored on the final rounds' own sampling streams (`base`)."""
    post_hoc = [SAME_STREAMS[g.name] for g in GATES]
    if base is None:
        return [claims.not_run(c, "no base model scored on the final rounds' streams") for c in post_hoc]
    if "firm" in results:
        mean = (per_seed("firm", "eval_helpful") + per_seed("firm", "eval_harmless")) / 2
        reference = (base["eval_helpful"] + base["eval_harmless"]) / 2
        first = post_hoc[0].decide(mean, reference, firm=mean.mean(), base_model=reference)
    else:
        first = claims.not_run(post_hoc[0], "arms not run: firm")
    return [first, *preference_gates(cfg, results, per_seed, post_hoc[1:], lambda runs, key: base[key])]


def preference_gates(cfg: LMConfig, results: dict, per_seed, gates: tuple, base_of) -> list[dict]:
    """Harmlessness at the smallest p1/p2 and helpfulness at the largest against `base_of(runs, key)`."""
    ratios = sorted(r for r in cfg.preferences if f"p1/p2={r:g}" in results)
    if len(ratios) < 2:
        return [claims.not_run(c, "fewer than 2 preference vectors ran") for c in gates]
    out = []
    for claim, ratio, key in zip(gates, (ratios[0], ratios[-1]), ("eval_harmless", "eval_helpful"), strict=True):
        arm = f"p1/p2={ratio:g}"
        trained, base = per_seed(arm, key), base_of(results[arm], key)
        out.append(claim.decide(trained, base, arm=arm, trained=trained.mean(), base_model=np.mean(base)))
    return out


def preference_claims(cfg: LMConfig, results: dict, per_seed) -> list[dict]:
    ratios = sorted(r for r in cfg.preferences if f"p1/p2={r:g}" in results)
    if len(ratios) < 2:
        return [claims.not_run(c, "fewer than 2 preference vectors ran") for c in (PREFERENCE, MONOTONE)]
    arms_ = [f"p1/p2={r:g}" for r in ratios]
    gap = np.stack([per_seed(a, "eval_helpful") - per_seed(a, "eval_harmless") for a in arms_], 1)  # (seeds, p)
    front = {"helpful": {a: per_seed(a, "eval_helpful").mean() for a in arms_},
             "harmless": {a: per_seed(a, "eval_harmless").mean() for a in arms_}}
    steps = {f"{a} -> {b}": (gap[:, j + 1], gap[:, j]) for j, (a, b) in enumerate(zip(arms_, arms_[1:], strict=False))}
    return [PREFERENCE.decide(claims.slopes(np.log(ratios), gap, log_x=False, log_y=False), **front),
            MONOTONE.decide_cells(steps, **front)]


def ablation_claims(cfg: LMConfig, results: dict, per_seed) -> list[dict]:
    out = []
    for arm in ["hetero-rm", f"dirichlet={cfg.dirichlet_alpha:g}", f"C={2 * cfg.clients}"]:
        for key, claim in (("eval_helpful", CLOSE_REWARD), ("eval_harmless", CLOSE_REWARD),
                           ("lambda_0", CLOSE_LAMBDA)):
            named = tagged(claim, f"LM {arm}, {key.removeprefix('eval_')}")
            last = 10**6 if key == "lambda_0" else 2
            out.append(named.decide(per_seed(arm, key, last), per_seed("firm", key, last))
                       if arm in results and "firm" in results else claims.not_run(named, f"arm {arm} or firm not run"))
    return out


def upload_claim(ledgers: dict, runner: LMRunner, cfg: LMConfig) -> dict:
    """Array bytes per client upload, from the messages as sent: FedCMOO-A's M·d gradients against FIRM's d."""
    adapter = Message(runner.policy.adapter_state(), {"n": cfg.batches * cfg.batch_size})
    d = sum(a.size for a in adapter.values())
    grads = Message({"grads": np.zeros((d, 2), np.float32)}, {"n": cfg.batch_size})
    firm_up = ledgers["firm"].total("up")
    expected_firm = cfg.rounds * cfg.clients * adapter.nbytes
    cmoo_up = ledgers["fedcmoo-a"].total("up")
    expected_cmoo = cfg.rounds * cfg.clients * (adapter.nbytes + grads.nbytes)
    ratio = grads.array_nbytes / adapter.array_nbytes
    ok = firm_up == expected_firm and cmoo_up == expected_cmoo
    value = ratio if ok else 0.0  # a ledger that differs from the messages' own bytes fails the claim
    return UPLOAD.decide(value, 2.0, adapter_floats=d,
                         firm_upload_bytes=firm_up, firm_expected=expected_firm, fedcmoo_upload_bytes=cmoo_up,
                         fedcmoo_expected=expected_cmoo)
