"""One package per reproduction. Each defines `TITLE`, a pydantic `Config` and `run(cfg, run_dir, progress)`, which
composes its parts (one module each, returning a `runs.Part` with the claims it declares) and writes metrics.jsonl,
ledger.csv, summary.json (claims + metrics) and plots into the run directory."""

EXPERIMENTS: dict[str, str] = {
    "affpcl": "collabalign.experiments.affpcl",
    "fed-tune": "collabalign.experiments.fed_tune",
    "firm": "collabalign.experiments.firm",
    "fslora": "collabalign.experiments.fslora",
    "meta-reward": "collabalign.experiments.meta_reward",
    "pshare-lora": "collabalign.experiments.pshare_lora",
    "quickstart": "collabalign.experiments.quickstart",
}
