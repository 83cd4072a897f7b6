"""The FSLoRA reproduction through the CLI at toy size: claims, plots and determinism."""

import json
import shutil

import pytest

from collabalign.claims import VERDICTS
from collabalign.cli import main
from collabalign.commands import CONFIG_DIR, config_path, load_config
from collabalign.experiments.fslora import ablations, e1_comparison, e6_timing, glue, theory, variants
from collabalign.experiments.fslora.runner import Runner
from collabalign.federation.engine import RoundFailed

from .plots import unrendered

DECLARED = [e1_comparison.BEST_AVERAGE, glue.LEARNED, glue.GLUE_EQUAL_BUDGET, e6_timing.DEVICE_TIME_AS_HETEROLORA,
            e6_timing.CHEAPER_THAN_FLEX_AND_STACK,
            *ablations.CLAIMS, *variants.CLAIMS, *theory.CLAIMS]

TOY = ["seeds=[0]", "synthetic.n_train=200", "synthetic.n_test=200", "federation.devices=5", "federation.min_size=4",
       "federation.rounds=2", "federation.steps=2", "federation.eval_every=1", "ablations.budget_ranks=[8]",
       "ablations.many_devices=8", "ablations.many_devices_ranks=[8]", "ablations.ratio_grid=[0.5, 1.0]",
       "ablations.rank_grid=[4, 8]", "ablations.fixed_k=4", "ablations.top_k_rounds=1",
       "theory.rate_rounds=[50, 100]", "theory.speedup_rounds=50", "theory.bias_rounds=50", "timing_reps=1",
       "--no-progress"]


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """Two runs of the same config and seed; the second, compared on its metrics only, unrendered."""
    outs = [tmp_path_factory.mktemp("fslora") for _ in range(2)]
    args = ["run", str(config_path("fslora", quick=True)), *TOY]
    assert main([*args, "--out", str(outs[0])]) == 0
    with pytest.MonkeyPatch.context() as monkeypatch:
        unrendered(monkeypatch)
        assert main([*args, "--out", str(outs[1])]) == 0
    return outs


def test_every_declared_claim_is_reported_with_its_rule_and_a_verdict(toy_runs):
    summary = json.loads((toy_runs[0] / "summary.json").read_text())
    assert [c["name"] for c in summary["claims"]] == [c.name for c in DECLARED]
    for record, claim in zip(summary["claims"], DECLARED, strict=True):
        glue_claim = claim in (glue.LEARNED, glue.GLUE_EQUAL_BUDGET)  # the toy run has no GLUE tasks
        assert record["verdict"] in VERDICTS and ("not_run" in record["measured"]) == glue_claim
        if glue_claim:
            continue
        assert (record["rule"], record["scale"], record["lower_is_better"]) == (claim.rule, claim.scale,
                                                                               claim.lower_is_better)
        assert record["n"] == 1 or claim in (e6_timing.DEVICE_TIME_AS_HETEROLORA,
                                             e6_timing.CHEAPER_THAN_FLEX_AND_STACK)  # one seed; E6: one per rep
    assert set(summary["metrics"]["ablations"]) == {"E2", "E2_many_devices", "E3", "E4", "E5"}
    for plot in ("E1_synthetic", "E2_equal_budget", "E2_many_devices", "E3_ratio", "E3_upload", "E4_global_rank",
                 "E4_upload", "E5_topk_upload"):
        assert (toy_runs[0] / "plots" / f"{plot}.png").stat().st_size > 1000
    report = (toy_runs[0] / "report.md").read_text()
    assert "| synthetic | " in report and "| SST-2 |" not in report  # no GLUE rows without GLUE tasks


def test_a_rerun_reads_every_synthetic_run_back_from_the_cache(toy_runs, tmp_path, monkeypatch):
    """E1's and the ablations' runs are saved under the synthetic settings' fingerprint: a stopped main run continues
    where it stopped; a changed setting computes afresh."""
    unrendered(monkeypatch)  # compared on the cached runs and metrics only
    run = tmp_path / "run"
    shutil.copytree(toy_runs[0], run)
    cached = {p.name: p.stat().st_mtime_ns for p in (run / "fslora_synthetic_runs").iterdir()}
    assert len(cached) == 5 + 2 * 2 + 3 * 2 + 4  # E1's five methods; E2 and E2 with many devices, E3-E5: 2 arms
    # each; the four arms of the variants
    args = ["run", str(config_path("fslora", quick=True)), *TOY, "--out", str(run), "--force"]
    assert main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (run / "fslora_synthetic_runs").iterdir()} == cached
    assert (run / "metrics.jsonl").read_bytes() == (toy_runs[0] / "metrics.jsonl").read_bytes()
    assert main([*args[:2], "synthetic.lr=0.11", *args[2:]]) == 0
    assert all(p.stat().st_mtime_ns != cached[p.name] for p in (run / "fslora_synthetic_runs").iterdir()
               if p.name in cached)


def test_the_quick_config_runs_every_part_so_its_summary_holds_every_claim():
    """The toy run above is the quick config with smaller sizes; the quick config switches no part off."""
    cfg, smoke = load_config(config_path("fslora", quick=True))[2:]
    assert smoke and cfg.ablations.run and cfg.variants.run and cfg.theory.run
    assert not cfg.glue.tasks and not cfg.commonsense.configured


def test_main_config_runs_five_seeds():
    cfg = load_config(CONFIG_DIR / "fslora" / "main.yaml")[2]
    assert cfg.seeds == [0, 1, 2, 3, 4] and cfg.ablations.run and cfg.variants.run and cfg.theory.run


def test_records_carry_method_round_and_upload(toy_runs):
    records = [json.loads(x) for x in (toy_runs[0] / "metrics.jsonl").read_text().splitlines()]
    e1 = [r for r in records if r["experiment"] == "E1" and r["problem"] == "synthetic"]
    assert {r["method"] for r in e1} == {"fedlora", "fslora", "heterolora", "flexlora", "fedstack"}
    fed = [r for r in e1 if r["method"] == "fedlora"]
    fs = [r for r in e1 if r["method"] == "fslora"]
    assert [r["round"] for r in fed] == [0, 1, 2]
    assert fs[-1]["upload_mb_per_device"] < fed[-1]["upload_mb_per_device"]  # sketched uploads are smaller


def test_same_config_and_seed_give_byte_identical_metrics(toy_runs):
    a, b = toy_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()


@pytest.mark.real
def test_gpu_roberta_config_validates_and_runs_on_a_tiny_stand_in(tmp_path):
    """The paper-scale config, with a tiny random BERT saved locally in place of roberta-base, on the CPU."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from collabalign.models.backbones import MINILM_PACKAGE, package_dir

    path = CONFIG_DIR / "fslora" / "gpu_roberta.yaml"
    cfg = load_config(path)[2]
    assert (cfg.glue.backbone, cfg.glue.lora_blocks, cfg.federation.rank) == ("roberta-base", 12, 64)
    assert cfg.glue.tasks == ["QNLI", "MRPC", "CoLA", "MNLI", "RTE", "SST-2", "QQP"]  # Table 5.1's order
    tiny = tmp_path / "tiny-bert"
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(tiny)
    AutoTokenizer.from_pretrained(package_dir(MINILM_PACKAGE) / "model").save_pretrained(tiny)
    overrides = [f"glue.backbone={tiny}", "glue.device=cpu", "glue.tasks=[RTE]", "glue.budget_task=null",
                 "glue.gate=false", "glue.max_train=24",
                 "glue.lora_blocks=2", "glue.max_length=32", *TOY[:-1], "federation.devices=3",
                 "federation.min_size=2", "ablations.run=false", "variants.run=false", "theory.run=false",
                 "glue.federation={rounds: 1, momentum: 0.9}", "--no-progress"]
    assert main(["run", str(path), *overrides, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "RTE/fslora" in summary["metrics"]["E1"]
    assert [c["name"] for c in summary["claims"]] == [c.name for c in DECLARED]  # switched-off parts: not run
    learned = summary["claims"][1]
    assert summary["claims"][0]["measured"]["problems"] == ["synthetic", *glue.learned_tasks(learned, ["RTE"])]
    off = [c for c in summary["claims"] if "not_run" in c["measured"]]
    assert [c["name"] for c in off] == [c.name for c in (glue.GLUE_EQUAL_BUDGET, *ablations.CLAIMS, *variants.CLAIMS,
                                                         *theory.CLAIMS)]
    assert {c["verdict"] for c in off} == {"inconclusive"}
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    glue_runs = [r for r in records if r.get("problem") == "RTE" and r["experiment"] == "E1"]
    assert max(r["round"] for r in glue_runs) == 1 < max(r["round"] for r in records
                                                         if r.get("problem") == "synthetic")
    final = [r for r in glue_runs if r["round"] == 1]
    assert {r["method"] for r in final} == set(glue.ARMS) and len(final) == 7  # one seed, the paper's one lr
    assert all("score_without_lora" in r and r["delta_w_rel_norm"] >= 0 for r in final)
    assert {r["scored_on"] for r in glue_runs} == {"dev"}  # a one-point grid runs no selection
    assert {r["experiment"] for r in records} == {"E1"}


def test_a_bad_glue_federation_override_is_named_before_any_work(tmp_path, capsys):
    path = config_path("fslora", quick=True)
    assert main(["run", str(path), "glue.federation={rounds: 1, rouds: 2}", "--no-progress", "--out",
                 str(tmp_path)]) == 2
    assert "glue.federation" in capsys.readouterr().err and not (tmp_path / "metrics.jsonl").exists()


def test_a_diverged_run_is_saved_and_fails_again_without_running_again(tmp_path, monkeypatch):
    cfg = load_config(config_path("fslora", quick=True))[2]
    calls = []

    def diverge(*args):
        calls.append(args)
        raise RoundFailed("round 1: 0 valid replies of 5, min_replies = 4")

    for key, runs in (("k", 1), ("k", 1), ("other settings", 2)):
        runner = Runner(cfg.federation, cfg.engine, progress=False, cache=tmp_path, key=key)
        monkeypatch.setattr(runner, "_simulate", diverge)
        with pytest.raises(RoundFailed, match="round 1: 0 valid replies"):
            runner.run({"experiment": "E1", "problem": "toy"}, None, {}, runner.arm("fslora"), 0)
        assert len(calls) == runs and not runner.records
