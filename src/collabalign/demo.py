"""`collabalign demo`: each of the five methods trained through its entry point on the example data
(`examples.py`) with the real small models, every result saved, and one report with a plot per method. A smoke run
that shows the tool, not evidence (template data, one seed); the reproductions are `collabalign reproduce`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from collabalign.artifacts import Result
from collabalign.baselines import sentence
from collabalign.examples import write_examples
from collabalign.plotting import line_plot, plt, save
from collabalign.runs import atomic_write_text

# (title, what the plot shows) per method; each runs in about 2 to 40 s on one thread
SMOLLM2, MINILM = "smollm2-135m", "minilm-l6"


def _bars(path: Path, groups: dict[str, dict[str, float]], ylabel: str, title: str, top: float | None = 1.2) -> None:
    """Grouped bars: one group per outer key, one bar per inner key (the y axis up to `top`; None: as the data)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = list(next(iter(groups.values())))
    width = 0.8 / len(groups)
    for i, (name, values) in enumerate(groups.items()):
        ax.bar(np.arange(len(labels)) + i * width, [values[k] for k in labels], width, label=name)
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2, labels)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top)
    ax.legend(fontsize=8, loc="upper center", ncols=len(groups))
    save(fig, path, title)


def pshare(data: dict[str, Path], out: Path) -> tuple[list[Result], str]:
    from collabalign.methods.pshare_lora import PShareLoRAConfig, train_pshare_lora

    results = [train_pshare_lora(PShareLoRAConfig(model=MINILM, method=m, epochs=6, batch_size=8, test_fraction=0.25),
                                 data["pairs"]) for m in ("pshare_si", "global")]
    _bars(out / "plots" / "pshare.png", {r.config["method"]: r.metrics["accuracy_per_user"] for r in results},
          "held-out preference accuracy", "P-ShareLoRA: one reward model per user")
    return results, ("Three users who disagree (ana: short replies, ben: detailed ones, cai: friendly ones). Held-out "
                     "accuracy per user of P-ShareLoRA (SI) against one global LoRA reward model.")


def meta_reward(data: dict[str, Path], out: Path) -> tuple[list[Result], str]:
    from collabalign.data.formats import load_pairs
    from collabalign.data.preferences import PreferenceSet
    from collabalign.methods.meta_reward import MetaRewardConfig, train_meta_reward

    pairs = load_pairs(data["pairs"])  # cai's pairs: one taste (friendly over curt) in every domain
    mine = PreferenceSet([p for p in pairs if p.party == "cai"], {}, f"{data['pairs']} (user cai)")
    config = MetaRewardConfig(held_out="garden", model=MINILM, policy=SMOLLM2, sft_steps=10, outer_steps=20,
                              select_every=5, test_steps=20, outer_batch=8)
    result = train_meta_reward(config, mine)
    m = result.metrics
    _bars(out / "plots" / "meta_reward.png", {"reward accuracy": m["reward_accuracy"]}, "pairwise accuracy",
          "Meta-learned reward model (garden held out)")
    return [result], (f"A reward model meta-trained on cai's cooking and travel pairs to guide a SmolLM2 policy; the "
                      f"garden domain was never trained on. Model selection kept outer step {m['selected_step']}; "
                      f"the policy's held-out preference accuracy A_PL went {m['held_out_apl']['sft']:.2f} (SFT) -> "
                      f"{m['held_out_apl']['meta_test']:.2f} (meta-test).")


def firm(data: dict[str, Path], out: Path) -> tuple[list[Result], str]:
    from collabalign.methods.firm import FIRMConfig, train_firm

    config = FIRMConfig(model=SMOLLM2, rounds=3, clients=2, batch_size=4, max_new_tokens=16, step="rloo", samples=2,
                        lora={"rank": 8, "alpha": 16.0, "blocks": 2}, test_fraction=0.25)
    result = train_firm(config, data["prompts"])
    rounds = [r for r in result.metrics["rounds"] if "eval_reward_0" in r]
    names = result.metrics["objectives"]
    line_plot(out / "plots" / "firm.png",
            {name: ([r["round"] for r in rounds], [r[f"eval_reward_{j}"] for r in rounds])
             for j, name in enumerate(names)}, "round", "held-out reward", "FIRM: two objectives, two clients")
    return [result], ("A SmolLM2 LoRA policy trained by two clients on their own prompts towards two rewards "
                      f"({' and '.join(names)}) with FIRM's per-client regularised MGDA (REINFORCE-RLOO steps).")


def fslora(data: dict[str, Path], out: Path) -> tuple[list[Result], str]:
    from collabalign.methods.fslora import FSLoRAConfig, train_fslora

    result = train_fslora(FSLoRAConfig(model=MINILM, ranks=[2, 4, 8], rounds=8, test_fraction=0.25), data["labelled"])
    rounds = [r for r in result.metrics["rounds"] if "accuracy" in r]
    line_plot(out / "plots" / "fslora.png", {"FSLoRA": ([r["round"] for r in rounds], [r["accuracy"] for r in rounds])},
            "round", "held-out accuracy", "FSLoRA: devices of ranks 2, 4 and 8")
    return [result], ("A MiniLM classifier of pleased / displeased product remarks, half of them negated (\"The kettle "
                      "is not flimsy.\" is pleased), trained by three devices whose LoRA ranks differ; each device's "
                      "slice is saved beside the global adapter. Its baseline, a logistic probe on the frozen "
                      "encoder's mean-pooled embeddings, sees the negation only in part.")


def affpcl(data: dict[str, Path], out: Path) -> tuple[list[Result], str]:
    from collabalign.methods.affpcl import AffPCLConfig, train_affpcl

    results = [train_affpcl(AffPCLConfig(method=m, steps=2000), data["agents"]) for m in ("affpcl", "il", "fedavg")]
    _bars(out / "plots" / "affpcl.png", {r.config["method"]: r.metrics["test_mse"] for r in results},
          "held-out squared error", "AffPCL against learning alone (IL) and one model (FedAvg)", top=None)
    return results, ("Four related agents, each with a few noisy rows of its own and rows they all share: AffPCL's "
                     "personalised solutions (density ratios estimated from the agents' rows) against each agent "
                     "learning alone (IL) and one model for all (FedAvg), on each agent's held-out rows.")


PARTS: dict[str, Callable[[dict[str, Path], Path], tuple[list[Result], str]]] = {
    "P-ShareLoRA": pshare, "Meta-learned reward model": meta_reward, "FIRM": firm, "FSLoRA": fslora,
    "AffPCL": affpcl}


def _headline(result: Result) -> str:
    """The result's main numbers in a line."""
    m = result.metrics
    keys = [k for k in ("accuracy", "pearson", "held_out_reward_accuracy", "eval_reward_0", "eval_reward_1")
            if isinstance(m.get(k), int | float)]
    shown = ", ".join(f"{k} {m[k]:.3f}" for k in keys)
    if "ls_error" in m:
        shown = f"mean distance to the agents' own solutions {np.mean(list(m['ls_error'].values())):.4f}"
    return shown


def _label(result: Result) -> str:
    return str(result.config.get("method", result.method))


def _against_baseline(path: Path, records: dict[str, dict], title: str) -> None:
    """Each result's score beside its baseline's on the same held-out items, the difference's interval as a bar."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    x = np.arange(len(records))
    ours = [r["ours"] for r in records.values()]
    base = [r["baseline_value"] for r in records.values()]
    ax.bar(x - 0.2, base, 0.4, label="baseline", color="0.7")
    ax.bar(x + 0.2, ours, 0.4, label="trained")
    for i, r in enumerate(records.values()):
        if r["interval"]:
            low, high = r["interval"]
            ax.errorbar(i + 0.2, r["ours"], yerr=[[r["difference"] - low], [high - r["difference"]]], color="k",
                        capsize=3)
    first = next(iter(records.values()))
    ax.set_xticks(x, list(records))
    ax.set_ylabel(first["metric"])
    ax.legend(fontsize=8)
    ax.set_title(f"against: {first['baseline']}", fontsize=8)
    save(fig, path, f"{title}: trained model and baseline")


def run_demo(out: str | Path, only: list[str] | None = None) -> Path:
    """Writes the example data, trains each method, saves every result under `out` and writes out/report.md."""
    out = Path(out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    data = write_examples(out / "data")
    lines = ["# collabalign demo", "", "Each method trained through its entry point on the example data in `data/` "
             "(template text, one seed): a smoke run that shows the tool works, not evidence. The papers' claims are "
             "checked by `collabalign reproduce`.", ""]
    for title, part in PARTS.items():
        if only and title not in only:
            continue
        start = time.perf_counter()
        print(f"demo: {title} ...", file=sys.stderr)
        results, text = part(data, out)
        seconds = time.perf_counter() - start
        slug = part.__name__
        lines += [f"## {title}", "", text, "", f"![{title}](plots/{slug}.png)", ""]
        against = {_label(r): r.metrics["baseline"] for r in results if "baseline" in r.metrics}
        if against:
            _against_baseline(out / "plots" / f"{slug}-baseline.png", against, title)
            lines += [f"![{title} against its baseline](plots/{slug}-baseline.png)", ""]
        for result in results:
            folder = result.save(out / (slug if len(results) == 1 else f"{slug}-{result.config['method']}"))
            names = ", ".join(sorted(result.adapters)) or ", ".join(sorted(result.arrays))
            lines.append(f"- `{folder.relative_to(out)}` ({_label(result)}): {_headline(result)}; saved: {names}")
            if "baseline" in result.metrics:
                lines.append(f"  - {sentence(_label(result), result.metrics['baseline'])}")
        lines += ["", f"({seconds:.0f} s)", ""]
    lines += ["Use them (from this folder): `collabalign score pshare-pshare_si --file data/texts.jsonl --user ana`, "
              "`collabalign generate firm --prompt \"How do I keep basil fresh?\"`.", ""]
    report = out / "report.md"
    atomic_write_text(report, "\n".join(lines))
    return report
