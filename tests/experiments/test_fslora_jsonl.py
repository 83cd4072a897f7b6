"""FSLoRA's GLUE part on the user's labelled-text JSONL (`glue.data`) on a tiny random Llama: the task runs as one
more GLUE-part task, its dev split is held out of training, its file keys the cached runs, bad settings are named."""

import json

import pytest

from collabalign.cli import main
from collabalign.commands import config_path, load_config
from collabalign.experiments.fslora import glue
from collabalign.experiments.fslora.runner import Runner
from collabalign.models.backbones import tiny_llama

from .test_fslora import TOY


def write_labelled(path, rows=60, regression=False):
    """A labelled-text JSONL: two kinds of text, classes 0/1 (or the scores 0.25/1.75)."""
    lines = []
    for i in range(rows):
        kind = i % 2
        text = f"{'a fine, warm film' if kind else 'a dull, cold film'} number {i}"
        lines.append(json.dumps({"text": text, "label": 0.25 + 1.5 * kind if regression else kind}))
    path.write_text("\n".join(lines) + "\n")
    return path


def jsonl_overrides(path, *extra):
    return [*TOY[:-1], "ablations.run=false", "theory.run=false", "federation.devices=3", "federation.min_size=2",
            "glue.backbone=tiny-llama", "glue.targets=[q_proj, v_proj]", "glue.lora_blocks=1", "glue.max_length=16",
            "glue.lr_grid=[0.1]", "glue.gate=false", "glue.federation={rounds: 1}",
            f"glue.data={{source: jsonl, path: {path}, name: mine}}", *extra]


def test_the_jsonl_task_runs_every_arm_and_e2_in_the_glue_part(tmp_path):
    data = write_labelled(tmp_path / "mine.jsonl")
    overrides = jsonl_overrides(data, "glue.budget_task=mine", "--no-progress")
    assert main(["run", str(config_path("fslora", quick=True)), *overrides, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {f"mine/{arm}" for arm in glue.ARMS} <= set(summary["metrics"]["E1"])
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["experiment"] for r in records if r.get("problem") == "mine"} == {"E1", "E2"}
    assert any(f"Task mine: the labelled texts of {data}" in n for n in summary["notes"])
    assert len(list((tmp_path / "run" / "fslora_glue_runs").iterdir())) == len(glue.ARMS) + 1  # one seed; E2


@pytest.mark.parametrize("regression", [False, True])
def test_the_jsonl_dev_split_is_held_out_of_training_and_the_selection_slice(regression, tmp_path):
    data = write_labelled(tmp_path / "mine.jsonl", regression=regression)
    cfg = load_config(config_path("fslora", quick=True), jsonl_overrides(data))[2]
    task = glue.load_task(cfg, "mine", tiny_llama(), Runner(cfg.glue_federation(), cfg.engine, progress=False))
    fit, select, dev = (set(d.x.tolist()) for d in (task.fit, task.select, task.dev))
    assert (len(fit) + len(select), len(dev)) == (48, 12) and len(select) == round(0.2 * 48)
    assert not fit & select and not (fit | select) & dev
    assert task.problem.regression == regression and (task.chance == 0.0) == regression


def test_jsonl_pairs_are_cut_at_the_pair_length_as_glue_pairs_are(tmp_path):
    data = tmp_path / "pairs.jsonl"
    words = " ".join(f"word{i}" for i in range(40))
    data.write_text("".join(json.dumps({"text": words, "text_pair": words, "label": i % 2}) + "\n" for i in range(30)))
    cfg = load_config(config_path("fslora", quick=True), jsonl_overrides(data, "glue.max_length=8",
                                                                         "glue.pair_max_length=24"))[2]
    task = glue.load_task(cfg, "mine", tiny_llama(), Runner(cfg.glue_federation(), cfg.engine, progress=False))
    assert task.problem.model.cache.tokens.input_ids.shape[1] == 24  # not max_length's 8


def test_the_jsonl_file_keys_the_cached_glue_runs(tmp_path):
    data = write_labelled(tmp_path / "mine.jsonl")
    cfg = load_config(config_path("fslora", quick=True), jsonl_overrides(data))[2]
    key = glue.glue_fingerprint(cfg)
    write_labelled(data, rows=61)
    assert glue.glue_fingerprint(cfg) != key
    assert glue.glue_fingerprint(cfg.model_copy(update={"glue": cfg.glue.model_copy(update={"data": None})})) != key


@pytest.mark.parametrize("extra, message", [
    (["glue.tasks=[mine]"], "data.name 'mine' is also one of tasks ['mine']"),
    (["glue.budget_task=SST-2"], "budget_task 'SST-2' is not one of the tasks ['mine']"),
    (["glue.data.dev_fraction=0.001"], "mine.jsonl: 60 rows: too few to hold out dev_fraction 0.001"),
])
def test_a_bad_jsonl_task_is_named(extra, message, tmp_path, capsys):
    data = write_labelled(tmp_path / "mine.jsonl")
    overrides = jsonl_overrides(data, *extra, "--no-progress")
    assert main(["run", str(config_path("fslora", quick=True)), *overrides, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
