"""The P-ShareLoRA reproduction through the CLI at toy size (the quick config with small overrides): every declared
claim in summary.json with its rule, the tables and plots, determinism with one or two worker processes, and the
paper-scale TL;DR config on a tiny Llama."""

import json
import shutil
from types import ModuleType

import pytest

from collabalign.claims import Claim
from collabalign.cli import main
from collabalign.commands import config_path
from collabalign.experiments.pshare_lora import Config, bandit, federated, ordering, sweeps, text
from collabalign.experiments.pshare_lora import fits as fits_module
from collabalign.experiments.pshare_lora.fits import fit, jobs
from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, TrainConfig
from collabalign.runs import RunDir

QUICK = str(config_path("pshare-lora", quick=True))
TOY = ["seeds=[0, 1, 2]", "workers=1", "problem.users=4", "problem.n_train=30", "problem.n_test=100",
       "train.steps=20", "sweep.n_train=[15, 30, 60]", "sweep.methods=[global, local, pshare_si, full]",
       "sweep.users=[2, 4]", "sweep.spectrum_decay=[0.5, 1]", "sweep.tail=[0, 1]", "sweep.tail_n_train=[15, 60]",
       "bandit.prompts=6", "bandit.candidates=4", "bandit.n_train=[10, 20]", "bandit.train.steps=20",
       "bandit.iters=50", "federated.rounds=3", "federated.local_steps=2", "federated.eval_every=3",
       "text.backbone=tiny-llama", "text.targets=[q_proj, k_proj]", "text.lora_blocks=1", "text.users=3",
       "text.n_train=4", "text.n_test=4", "text.seeds=[0]", "text.max_length=32",
       "text.methods=[global, share_rep, share_rep_same_head, share_rep_phased, pshare_si]", "--no-progress"]


SYNTHETIC_ONLY = ["bandit.run=false", "federated.run=false", "text.run=false"]  # the parts whose fits use workers


def synthetic_records(out) -> list[str]:
    return [r for r in (out / "metrics.jsonl").read_text().splitlines()
            if json.loads(r)["experiment"] == "main" or json.loads(r)["experiment"].startswith("sweep_")]


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """The toy run on one process, and its synthetic parts (the fits) again on two worker processes: their records
    must not change."""
    outs = [tmp_path_factory.mktemp("pshare-lora") for _ in range(2)]
    assert main(["run", QUICK, *TOY[:-1], "workers=1", "--no-progress", "--out", str(outs[0])]) == 0
    assert main(["run", QUICK, *TOY[:-1], "workers=2", *SYNTHETIC_ONLY, "--no-progress", "--out", str(outs[1])]) == 0
    return outs


def declared(*modules: ModuleType) -> list[Claim]:
    """Every claim a part module declares at module level (alone or in a dict per method)."""
    out = []
    for module in modules:
        for value in vars(module).values():
            out += [value] if isinstance(value, Claim) else \
                [v for v in value.values() if isinstance(v, Claim)] if isinstance(value, dict) else []
    return out


def test_quick_config_is_found_by_the_experiment_name():
    assert config_path("pshare-lora", quick=True).is_file() and config_path("pshare-lora", quick=False).is_file()


def test_every_declared_claim_is_in_the_summary_with_its_rule(toy_runs):
    summary = json.loads((toy_runs[0] / "summary.json").read_text())
    records = summary["claims"]
    claims = declared(ordering, sweeps, bandit, federated, text)
    assert len(claims) == 7 + 12 + 5 + 3 + 3
    for claim in claims:
        found = [r for r in records if claim.name in r["name"]]
        assert found, claim.name
        assert all(r["rule"] == claim.rule and r["post_hoc"] == claim.post_hoc for r in found), claim.name
    assert sum("TL;DR-like: " in r["name"] for r in records) == 3 + len(ordering.CLAIMS)  # learned, then order
    assert {r["verdict"] for r in records} <= {"reproduced", "not reproduced", "inconclusive"}
    assert all({"rule", "n", "estimate", "interval", "margin", "post_hoc", "measured"} <= set(r) for r in records)
    g_beats = next(r for r in records if r["name"] == "P-ShareLoRA (G) beats every baseline")
    assert set(g_beats["cells"]) == {"LoRA-global", "LoRA-local", "Share Rep"}  # the paper's Share Rep only
    decided = {r["name"] for r in records if r["n"] >= 3}
    assert "P-ShareLoRA (SI) > LoRA-global" in decided and "dist(B^, B°) falls as N_p^-1/2 (Thm 4.1)" in decided
    assert "federated P-ShareLoRA (SI) > FedAvg-LoRA" in decided


def test_tables_plots_and_slopes_are_written(toy_runs):
    summary = json.loads((toy_runs[0] / "summary.json").read_text())
    assert set(summary["metrics"]["sweep_slopes"]) == {"n_train", "users", "spectrum_decay", "tail=0", "tail=1"}
    assert set(summary["metrics"]["sweep_slopes"]["users"]) == {"global", "local", "pshare_si", "full"}
    report = (toy_runs[0] / "report.md").read_text()
    assert "| P-ShareLoRA (WU) | " in report and " ± " in report and "Smoke run" in report
    assert "| Share Rep (global then personal; ablation) | " in report and "| Share Rep (same head) | " in report
    assert "Share Rep is the linear shared-representation model" in report
    for sweep in ("n_train", "users", "spectrum_decay", "tail_1"):
        for metric in ("accuracy", "subspace_dist"):
            assert (toy_runs[0] / "plots" / f"sweep_{sweep}_{metric}.png").stat().st_size > 1000
    for plot in ("bandit_gap_zeta0", "federated_accuracy", "text_tldr_like_per_labeler"):
        assert (toy_runs[0] / "plots" / f"{plot}.png").stat().st_size > 1000


def test_records_cover_every_method_and_seed_and_are_deterministic(toy_runs):
    a, b = toy_runs
    records = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    main_runs = {(r["method"], r["seed"]) for r in records if r["experiment"] == "main"}
    assert len(main_runs) == 9 * 3 and {"share_rep", "share_rep_phased"} <= {m for m, _ in main_runs}
    assert {r["method"] for r in records if r["experiment"] == "text"} == {
        "global", "share_rep", "share_rep_same_head", "share_rep_phased", "pshare_si"}
    assert {r["value"] for r in records if r["experiment"] == "sweep_n_train"} == {15, 30, 60}
    assert {r["value"] for r in records if r["experiment"] == "sweep_users"} == {2, 4}
    assert {r["experiment"] for r in records} >= {"bandit", "federated", "text"}
    assert synthetic_records(b) == synthetic_records(a) and len(synthetic_records(a)) > 9 * 3


def test_a_rerun_reads_the_cached_fits_back_without_worker_processes(toy_runs, tmp_path, monkeypatch):
    out = tmp_path / "run"
    shutil.copytree(toy_runs[1], out)  # the two-worker run, its fits cached in the folder
    fits = sorted((out / "pshare_synthetic_fits").iterdir())
    saved = RunDir(out).read_config()
    cfg = Config.model_validate({k: v for k, v in saved.items() if k not in ("experiment", "smoke")})
    assert len(fits) == len({(p.model_dump_json(), m, s) for p, m, s in jobs(cfg)}) > 9 * 3  # every fit, once
    stamps = [f.stat().st_mtime_ns for f in fits]
    args = ["run", QUICK, *TOY[:-1], "workers=2", *SYNTHETIC_ONLY, "--no-progress", "--out", str(out), "--force"]
    monkeypatch.setattr(fits_module, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("workers with every fit saved"))
    assert main(args) == 0  # a stopped or repeated run reads every fit back instead of refitting
    assert [f.stat().st_mtime_ns for f in fits] == stamps
    assert (out / "metrics.jsonl").read_text().splitlines() == synthetic_records(toy_runs[0])


@pytest.mark.parametrize("override", ["methods=[global, share_rep_same_head]", "bandit.methods=[pshare_si, shared]",
                                      "text.methods=[global, share_rep_global]"])
def test_a_method_that_cannot_run_where_it_is_listed_is_a_config_error(override, tmp_path, capsys):
    assert main(["run", QUICK, override, "--no-progress", "--out", str(tmp_path)]) == 2
    assert "Input should be" in capsys.readouterr().err


def test_fit_is_deterministic_and_seed_dependent():
    small = ProblemConfig(d1=6, d2=4, users=3, k=2, n_train=5, n_test=50)
    tc = TrainConfig(steps=15)
    a, b = fit(small, tc, "pshare_wu", 0), fit(small, tc, "pshare_wu", 0)
    assert a == b and fit(small, tc, "pshare_wu", 1) != a


def test_gpu_tldr_config_validates_and_runs_on_a_tiny_llama(tmp_path):
    """The paper-scale TL;DR config with a tiny random Llama saved locally in place of Llama-3 8B, LoRA on q_proj /
    k_proj of every block (no cache), bfloat16 backbone, gradient checkpointing and micro-batches, on the CPU, on a
    TL;DR fixture in the hub's schema."""
    from collabalign.commands import CONFIG_DIR
    from collabalign.config import read_yaml, validate
    from collabalign.experiments.pshare_lora import Config
    from collabalign.models.backbones import tiny_llama
    from tests.data.helpers import jsonl, write
    from tests.data.test_tldr import TRAIN, VALID

    path = CONFIG_DIR / "pshare_lora" / "gpu_tldr.yaml"
    cfg = validate(Config, {k: v for k, v in read_yaml(path).items() if k != "experiment"})
    assert (cfg.text.backbone, cfg.text.rank, cfg.text.alpha, cfg.text.targets) == (
        "meta-llama/Meta-Llama-3-8B", 32, 16, ["q_proj", "k_proj"])
    assert cfg.methods == [] and cfg.text.sources == ["tldr"] and cfg.text.lr_grid == [5e-5]
    assert (cfg.text.dtype, cfg.text.gradient_checkpointing, cfg.text.micro_batch) == ("bfloat16", True, 4)
    tiny = tiny_llama(num_layers=2)
    tiny.model.save_pretrained(tmp_path / "tiny-llama")
    tiny.tokenizer.save_pretrained(tmp_path / "tiny-llama")
    (tmp_path / "data").mkdir()
    write(tmp_path / "data" / "train.jsonl.gz", jsonl(*TRAIN), gz=True)
    write(tmp_path / "data" / "validation.jsonl", jsonl(*VALID))
    overrides = [f"text.backbone={tmp_path / 'tiny-llama'}", f"text.data_root={tmp_path / 'data'}", "text.device=cpu",
                 "text.lora_blocks=2", "text.max_length=48", "text.batch_size=8", "text.rank=4", "text.epochs=1",
                 "text.methods=[global, pshare_si, pshare_wu]", "--no-progress"]
    assert main(["run", str(path), *overrides, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["metrics"]["text_tldr"]) == {"LoRA-global", "P-ShareLoRA (SI)", "P-ShareLoRA (WU)"}
    assert summary["claims"] and all(c["name"].startswith("Reddit TL;DR: ") for c in summary["claims"])
