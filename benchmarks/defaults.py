"""Each entry point at its defaults against its baseline, on real data under ../shared/data that no default was chosen
on, at 5 seeds (each seed: the entry point's own split and initialisation), decided by the claims rule.

    python benchmarks/defaults.py --out runs/defaults [--only pshare-pku,fslora-sst2] [--seeds 5] [--first-seed 0]

Every cell writes the user's files (JSONL in the documented formats) and calls the entry point exactly as a user
would, with only the fields the data needs (`held_out`, `objective`) set: what a new user gets. The record each run
puts in `metrics["baseline"]` (ours and the baseline on the same held-out items) gives one paired value per seed; the
claim "ours beats its baseline" is decided over the seeds by `claims.superiority` (lower is better where the metric is
an error). Claims, declared before the run: every cell, "the entry point at its defaults beats its baseline"
(superiority, smallest effect 0). Writes `defaults.json` (every run's metrics and seconds) and `defaults.md` (the
table) into --out; a finished cell is read back, so a stopped run continues.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from collabalign import claims
from collabalign.data.amazon_reviews import load_task
from collabalign.data.glue import load_glue
from collabalign.data.hh_rlhf import load_hh_rlhf
from collabalign.data.paths import shared_data_dir
from collabalign.data.pku_saferlhf import PKU_FILE, load_pku_saferlhf, pku_prompts
from collabalign.registry import METHODS

CLAIM = claims.superiority("defaults_beat_baseline", "the entry point at its defaults beats its baseline")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def hh_rows(root: Path, n: int) -> list[dict]:
    pairs = load_hh_rlhf(root / "hh-rlhf" / "harmless-base-test.jsonl.gz", drop_invalid=True)  # 9 rows lack a reply
    return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs.pairs[:n]]


def pku_two_users(root: Path) -> list[dict]:
    """PKU-SafeRLHF's two labels as two users on the same 394 pairs: 'helpful' prefers the more helpful reply,
    'harmless' the safer one (they disagree on 91)."""
    rows = []
    for r in load_pku_saferlhf(root / PKU_FILE):
        for user, pick in (("helpful", r.better_response_id), ("harmless", r.safer_response_id)):
            rows.append({"prompt": r.prompt, "chosen": r.responses[pick], "rejected": r.responses[1 - pick],
                         "user": user})
    return rows


def hh_opposite_users(root: Path) -> list[dict]:
    """300 HH-RLHF harmlessness pairs: user 'as-labelled' keeps the first 150 as labelled, user 'contrarian' prefers
    the rejected reply of the next 150."""
    rows = hh_rows(root, 300)
    for i, row in enumerate(rows):
        row["user"] = "as-labelled" if i < 150 else "contrarian"
        if i >= 150:
            row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
    return rows


def sst2(root: Path, n: int = 1500) -> list[dict]:
    data = load_glue("SST-2", "train", root / "glue")
    pick = np.random.default_rng(0).permutation(len(data.labels))[:n]  # a fixed subset, the same for every seed
    return [{"text": data.text_a[i], "label": int(data.labels[i])} for i in pick]


def amazon(root: Path, per_domain: int = 100) -> list[dict]:
    task = load_task(root / "amazon-multidomain", max_pairs=per_domain)
    return [{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected, "domain": d}
            for d, data in task.items() for p in data.pairs]


def pku_prompt_rows(root: Path, n: int = 40) -> list[dict]:
    return [{"prompt": p} for p in pku_prompts(load_pku_saferlhf(root / PKU_FILE))[:n]]


# cell -> (method, data maker, fields the data needs, what the data is)
CELLS: dict[str, tuple[str, Callable[[Path], list[dict]], dict, str]] = {
    "pshare-pku": ("pshare-lora", pku_two_users, {}, "PKU-SafeRLHF, users helpful / harmless, 394 pairs each"),
    "pshare-hh-opposite": ("pshare-lora", hh_opposite_users, {},
                           "HH-RLHF harmless, two opposite users, 150 pairs each"),
    "fedavg-hh": ("fedavg-lora", lambda r: hh_rows(r, 300), {}, "HH-RLHF harmless, 300 pairs, 4 iid clients"),
    "fslora-sst2": ("fslora", sst2, {}, "SST-2, 1,500 labelled sentences"),
    "meta-amazon": ("meta-reward", amazon, {"held_out": "kitchen"},
                    "Amazon reviews, 4 domains x 100 pairs, kitchen held out"),
    "dpo-hh": ("fed-tune", lambda r: hh_rows(r, 240), {"objective": "dpo"}, "HH-RLHF harmless, 240 pairs"),
    "sft-hh": ("fed-tune", lambda r: hh_rows(r, 240), {"objective": "sft"}, "HH-RLHF harmless, 240 pairs"),
    "firm-pku": ("firm", pku_prompt_rows, {}, "PKU-SafeRLHF prompts, 40"),
}


def run_cell(cell: str, seed: int, folder: Path) -> dict:
    method, make, fields, _ = CELLS[cell]
    entry = METHODS[method]
    module = importlib.import_module(entry.module)
    data = folder / f"{cell}.jsonl"
    if not data.exists():
        _write(data, make(shared_data_dir()))
    config = getattr(module, entry.config)(**fields, seed=seed)
    start = time.perf_counter()
    result = getattr(module, entry.train)(config, data)
    seconds = time.perf_counter() - start
    keep = {k: v for k, v in result.metrics.items() if k not in ("rounds", "log", "trace")}
    return {"cell": cell, "method": method, "seed": seed, "seconds": round(seconds, 1), "metrics": keep}


def decide(records: list[dict]) -> dict:
    base = records[0]["metrics"]["baseline"]
    ours = [r["metrics"]["baseline"]["ours"] for r in records]
    theirs = [r["metrics"]["baseline"]["baseline_value"] for r in records]
    lower = base["metric"] in ("squared error",) or base["metric"].startswith("NLL")
    claim = claims.superiority(CLAIM.name, CLAIM.expected, lower_is_better=lower)
    return claim.decide(ours, theirs, ours=float(np.mean(ours)), baseline=float(np.mean(theirs)),
                        metric=base["metric"], baseline_name=base["baseline"])


def table(results: dict[str, list[dict]], decided: dict[str, dict]) -> str:
    lines = ["| cell | method | data | metric | baseline | baseline value | ours | difference [95% CI] | verdict | "
             "s / run |", "|---|---|---|---|---|---|---|---|---|---|"]
    for cell, records in results.items():
        d = decided[cell]
        iv = d["interval"]
        span = f"{d['estimate']:+.3f} [{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else f"{d['estimate']:+.3f}"
        m = d["measured"]
        lines.append(f"| {cell} | {records[0]['method']} | {CELLS[cell][3]} | {m['metric']} | {m['baseline_name']} | "
                     f"{m['baseline']:.3f} | {m['ours']:.3f} | {span} | {d['verdict']} | "
                     f"{np.mean([r['seconds'] for r in records]):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/defaults"))
    parser.add_argument("--only", default="", help="comma-separated cells (default: all)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="run seeds from here only (two processes on two folders; merge their defaults.json)")
    args = parser.parse_args(argv)
    if shared_data_dir() is None:
        print("error: ../shared/data not found (set COLLABALIGN_DATA to its folder)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "defaults.json"
    done = json.loads(store.read_text()) if store.exists() else {}
    cells = [c for c in args.only.split(",") if c] or list(CELLS)
    for cell in cells:
        for seed in range(args.first_seed, args.seeds):
            key = f"{cell}/{seed}"
            if key in done:
                continue
            print(f"{key} ...", file=sys.stderr, flush=True)
            done[key] = run_cell(cell, seed, args.out)
            b = done[key]["metrics"]["baseline"]
            print(f"{key}: ours {b['ours']:.3f} baseline {b['baseline_value']:.3f} ({done[key]['seconds']} s)",
                  file=sys.stderr, flush=True)
            tmp = store.with_suffix(".tmp")
            tmp.write_text(json.dumps(done, indent=1))
            tmp.replace(store)
    results = {c: [done[f"{c}/{s}"] for s in range(args.seeds)] for c in cells
               if all(f"{c}/{s}" in done for s in range(args.seeds))}
    decided = {c: decide(r) for c, r in results.items()}
    (args.out / "defaults.md").write_text(table(results, decided))
    (args.out / "claims.json").write_text(json.dumps(decided, indent=1))
    print(table(results, decided))
    return 0


if __name__ == "__main__":
    sys.exit(main())
