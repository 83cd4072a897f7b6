"""FSLoRA's GLUE part at toy size on real MiniLM and the shared GLUE files: lr chosen on a held-out slice of the
training examples from one grid, the references (chance, frozen head, centralised LoRA), the learned claim gating
the ranking, E2 on a GLUE task, STS-B, and runs cached in the run folder."""

import json

import numpy as np
import pytest
import torch

from collabalign.claims import VERDICTS
from collabalign.cli import main
from collabalign.commands import config_path, load_config
from collabalign.data import shared_data_dir
from collabalign.experiments.fslora import glue
from collabalign.experiments.fslora.runner import Runner
from collabalign.models.backbones import minilm_l6
from collabalign.selection import best

from .plots import unrendered
from .test_fslora import TOY

pytestmark = pytest.mark.real

GLUE_TOY = [*TOY[:-1], "ablations.run=false", "theory.run=false", "seeds=[0, 1]", "federation.devices=3",
            "federation.min_size=2", "glue.tasks=[SST-2, STS-B]", "glue.budget_task=SST-2", "glue.max_train=40",
            "glue.max_test=40", "glue.lora_blocks=1", "glue.max_length=16", "glue.lr_grid=[0.1]",
            "glue.alpha_grid=[1.0, 8.0]", "glue.federation={rounds: 2, eval_every: 1, batch_size: 4}",
            "glue.gate=false", "glue.select_eval_every=2",
            "--no-progress"]


@pytest.fixture(scope="module")
def glue_run(tmp_path_factory):
    if shared_data_dir() is None:
        pytest.skip("../shared/data not found")
    out = tmp_path_factory.mktemp("fslora-glue")
    assert main(["run", str(config_path("fslora", quick=True)), *GLUE_TOY, "--out", str(out)]) == 0
    return out


def read(out):
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, records


def test_each_arms_grid_point_is_chosen_per_task_on_the_selection_slice(glue_run):
    summary, records = read(glue_run)
    choice = summary["metrics"]["glue_choice"]
    points = [glue.Point(0.1, alpha) for alpha in (1.0, 8.0)]
    assert summary["metrics"]["glue_grid"] == [str(p) for p in points]
    for task in ("SST-2", "STS-B"):
        assert set(choice[task]) == set(glue.ARMS)
        for arm in choice[task].values():
            scores = {p: np.nan if arm["selection_scores"][str(p)] is None else arm["selection_scores"][str(p)]
                      for p in points}
            assert glue.Point(arm["lr"], arm["lora_alpha"]) == best(scores)
    selection = [r for r in records if r.get("scored_on") == "select"]
    assert {r["seed"] for r in selection} == {0}
    assert {(r["lr"], r["lora_alpha"]) for r in selection} == {(p.lr, p.alpha) for p in points}
    assert {r["round"] for r in selection} == {0, 2}  # glue.select_eval_every: the slice scored at the end only
    frozen = {(r["lr"], r["lora_alpha"]) for r in selection if r["method"] == "frozen"}
    assert frozen == {(0.1, 1.0)}  # LoRA alpha changes nothing without LoRA: one run per lr
    scored = [r for r in records if r.get("scored_on") == "dev" and r["experiment"] == "E1"]
    assert {(r["problem"], r["method"], r["lr"], r["lora_alpha"]) for r in scored} == {
        (t, a, c["lr"], c["lora_alpha"]) for t, arms in choice.items() for a, c in arms.items()}  # chosen only
    assert any(n.startswith("GLUE hyperparameters, chosen per task and arm") for n in summary["notes"])


def test_references_learned_claim_and_glue_e2_are_reported(glue_run):
    summary, records = read(glue_run)
    by_name = {c["name"]: c for c in summary["claims"]}
    learned, e2 = by_name[glue.LEARNED.name], by_name[glue.GLUE_EQUAL_BUDGET.name]
    assert learned["verdict"] in VERDICTS and set(learned["cells"]) == {
        f"{t} > {f}" for t in ("SST-2", "STS-B") for f in ("chance", "frozen")}
    ranked = summary["claims"][0]["measured"]["problems"]
    assert ranked == ["synthetic", *glue.learned_tasks(learned, ["SST-2", "STS-B"])]
    assert e2["verdict"] in VERDICTS and e2["n"] == 2 and e2["measured"]["sketched_rounds"] == 4
    e1 = summary["metrics"]["E1"]
    assert {"SST-2/centralised", "SST-2/frozen", "SST-2/chance", "STS-B/fslora"} <= set(e1)
    assert e1["STS-B/chance"]["mean"] == 0.0 and 0 < e1["SST-2/chance"]["mean"] < 100
    sts = [r for r in records if r.get("problem") == "STS-B"]
    assert all("pearson" in r and "accuracy" not in r for r in sts)
    frozen = [r for r in records if r.get("method") == "frozen" and r["round"] == 2]
    assert frozen and all(r["delta_w_rel_norm"] == 0 for r in frozen)  # the head alone moved


def test_a_rerun_reads_every_glue_run_back_from_the_cache(glue_run, tmp_path, monkeypatch):
    unrendered(monkeypatch)  # compared on the cached runs and metrics only
    cached = sorted(p.name for p in (glue_run / "fslora_glue_runs").iterdir())
    assert len(cached) == 2 * (2 * 6 + 1) + 2 * 2 * 7 + 2  # selection (frozen: per lr) + dev runs, 2 tasks; E2
    before = {p: (glue_run / "fslora_glue_runs" / p).stat().st_mtime_ns for p in cached}
    metrics = (glue_run / "metrics.jsonl").read_bytes()
    assert main(["run", str(config_path("fslora", quick=True)), *GLUE_TOY, "--out", str(glue_run), "--force"]) == 0
    assert {p: (glue_run / "fslora_glue_runs" / p).stat().st_mtime_ns for p in cached} == before
    assert (glue_run / "metrics.jsonl").read_bytes() == metrics


def test_the_selection_slice_is_held_out_of_training_and_apart_from_dev():
    if shared_data_dir() is None:
        pytest.skip("../shared/data not found")
    cfg = load_config(config_path("fslora", quick=True), GLUE_TOY[:-1])[2]
    runner = Runner(cfg.glue_federation(), cfg.engine, progress=False)
    task = glue.load_task(cfg, "SST-2", minilm_l6(), runner)
    fit, select, dev = (set(d.x.tolist()) for d in (task.fit, task.select, task.dev))
    assert len(select) == 8 and len(fit) == 32 and len(dev) == 40
    assert not fit & select and not (fit | select) & dev
    majority = int(torch.bincount(task.fit.y).argmax())
    assert task.chance == pytest.approx(100 * float(np.mean(task.dev.y.numpy() == majority)))


def test_with_the_gate_the_methods_run_only_where_the_references_show_the_task_learned(tmp_path):
    if shared_data_dir() is None:
        pytest.skip("../shared/data not found")
    gated = [o for o in GLUE_TOY[:-1] if not o.startswith(("glue.tasks", "glue.lr_grid", "glue.alpha_grid",
                                                           "glue.gate"))]
    overrides = [*gated, "glue.tasks=[SST-2]", "glue.lr_grid=[0.1]", "glue.alpha_grid=[8.0]", "--no-progress"]
    assert main(["run", str(config_path("fslora", quick=True)), *overrides, "--out", str(tmp_path)]) == 0
    summary, records = read(tmp_path)
    learned = {c["name"]: c for c in summary["claims"]}[glue.LEARNED.name]
    ran = summary["metrics"]["glue_methods_ran"]["SST-2"]
    assert ran == bool(glue.learned_tasks(learned, ["SST-2"]))  # one task: its own cells are the whole claim
    methods = {r["method"] for r in records if r.get("problem") == "SST-2" and r["experiment"] == "E1"}
    assert methods == (set(glue.ARMS) if ran else set(glue.REFERENCES))
    e2 = {c["name"]: c for c in summary["claims"]}[glue.GLUE_EQUAL_BUDGET.name]
    assert ("not_run" in e2["measured"]) == (not ran)
    assert ran or any("did not run on SST-2" in n for n in summary["notes"])


def test_which_tasks_and_arms_run_leaves_the_cached_runs_valid():
    cfg = load_config(config_path("fslora", quick=True), GLUE_TOY[:-1])[2]
    other = cfg.model_copy(update={"glue": cfg.glue.model_copy(update={"gate": True, "tasks": ["SST-2"],
                                                                     "budget_task": None})})
    assert glue.glue_fingerprint(other) == glue.glue_fingerprint(cfg)
    dropout = cfg.model_copy(update={"glue": cfg.glue.model_copy(update={"dropout": 0.2})})
    assert glue.glue_fingerprint(dropout) != glue.glue_fingerprint(cfg)  # a setting that changes the numbers


def test_learned_tasks_needs_both_floors_confirmed():
    record = {"cells": {"A > chance": {"confirmed": True}, "A > frozen": {"confirmed": True},
                        "B > chance": {"confirmed": True}, "B > frozen": {"confirmed": False}}}
    assert glue.learned_tasks(record, ["A", "B", "C"]) == ["A"]


def test_settings_added_later_key_new_runs_only_away_from_the_value_cached_runs_had():
    from collabalign.experiments.fslora.runner import federation_settings
    from collabalign.runs import fingerprint

    cfg = load_config(config_path("fslora", quick=True), GLUE_TOY[:-1])[2]

    def with_glue(**update):
        return cfg.model_copy(update={"glue": cfg.glue.model_copy(update=update)})

    legacy = with_glue(segments=False, pair_max_length=None, min_words={}, precision="float32", select_eval_every=None)
    dump = legacy.glue.model_dump(mode="json", exclude={"tasks", "budget_task", "gate", "data", "segments",
                                                         "pair_max_length", "min_words", "precision",
                                                         "select_eval_every"})
    fed = legacy.glue_federation()
    old = {"glue": dump, "federation": fed.model_dump(mode="json", exclude={"optimizer", "weight_decay"})
           | {"engine": legacy.engine.model_dump(mode="json")}, "budget_ratio": legacy.ablations.budget_ratio}
    assert glue.glue_fingerprint(legacy) == fingerprint(old)  # the runs cached before these settings still match
    assert federation_settings(fed, legacy.engine) == old["federation"]
    for changed in (with_glue(segments=True), with_glue(pair_max_length=128), with_glue(min_words={"SST-2": 10}),
                    with_glue(precision="bfloat16"), with_glue(select_eval_every=5)):
        assert glue.glue_fingerprint(changed) != glue.glue_fingerprint(legacy)
    adamw = fed.model_copy(update={"optimizer": "adamw"})
    assert federation_settings(adamw, legacy.engine)["optimizer"] == "adamw"


def test_min_words_leaves_sst2_phrases_out_of_training_and_pairs_get_their_own_length():
    if shared_data_dir() is None:
        pytest.skip("../shared/data not found")
    from dataclasses import replace

    from collabalign.methods.fslora.glue import glue_problem
    from collabalign.seeding import Seeds

    cfg = load_config(config_path("fslora", quick=True), [*GLUE_TOY[:-1], "glue.min_words={SST-2: 10}",
                                                         "glue.max_length=32", "glue.pair_max_length=64"])[2]
    setup = cfg.glue.setup(cfg.glue_federation(), "SST-2")
    assert setup.min_words == 10 and cfg.glue.setup(cfg.glue_federation(), "MRPC").min_words == 0
    assert setup.length(pairs=True) == 64 and setup.length(pairs=False) == 32
    root = shared_data_dir() / "glue"
    problem, train = glue_problem("SST-2", root, minilm_l6(), setup, Seeds(0))
    phrases, _ = glue_problem("SST-2", root, minilm_l6(), replace(setup, min_words=0), Seeds(0))
    words = [int(problem.model.cache.tokens.attention_mask[i].sum()) for i in train.x.tolist()]
    short = [int(phrases.model.cache.tokens.attention_mask[i].sum()) for i in range(len(train))]
    assert min(words) >= 10 + 2 and min(short) < 10  # 10 words are at least 10 word pieces, plus [CLS] and [SEP]
