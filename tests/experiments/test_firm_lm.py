"""The FIRM language-model path end to end: the GPU config with tiny local stand-ins for its three Hugging Face
models (policy, helpful and harmless reward models), every declared LM claim in summary.json, the Table 1 analogue
and the plots, on the shared prompts and on a prompts JSONL; the part's not-run record."""

import json

import numpy as np
import pytest
import torch

from collabalign.cli import main
from collabalign.commands import CONFIG_DIR
from collabalign.data.errors import DataError
from collabalign.data.paths import shared_data_dir
from collabalign.experiments.firm import lm
from collabalign.experiments.firm.lm_setup import LMRunner, jsonl_prompts
from collabalign.models.backbones import smollm2_tokenizer, tiny_llama

from .plots import unrendered

needs_data = pytest.mark.skipif(shared_data_dir() is None, reason="../shared/data not found")


def stand_ins(root):
    """A tiny random Llama policy and two tiny random GPT-2 sequence classifiers, saved as Hugging Face folders."""
    from transformers import GPT2Config, GPT2ForSequenceClassification

    policy = tiny_llama(seed=1)
    policy.model.save_pretrained(root / "policy")
    policy.tokenizer.save_pretrained(root / "policy")
    tok = smollm2_tokenizer()
    for name in ("helpful", "harmless"):
        config = GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=512, num_labels=1,
                            pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(len(name))
            GPT2ForSequenceClassification(config).save_pretrained(root / name)
        tok.save_pretrained(root / name)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The stand-ins, saved once for the file's runs (which only read them)."""
    root = tmp_path_factory.mktemp("stand-ins")
    stand_ins(root)
    return root


@pytest.mark.real
@needs_data
def test_gpu_config_runs_end_to_end_on_tiny_stand_ins_and_resumes_from_its_cached_runs(models, tmp_path, monkeypatch):
    out = tmp_path / "run"
    overrides = [f"lm.model={models / 'policy'}", "lm.device=cpu", "hf_rewards.device=cpu",
                 f"hf_rewards.helpful={models / 'helpful'}", f"hf_rewards.harmless={models / 'harmless'}",
                 f"hf_rewards.helpful_alt={models / 'helpful'}", "lm.seeds=3", "lm.clients=2", "lm.rounds=1",
                 "lm.batches=1", "lm.batch_size=2", "lm.ppo.minibatch=2", "lm.max_new_tokens=3", "lm.eval_prompts=2",
                 "lm.prompts_per_source=8", "lm.beta_sweep=[0.0,0.05]", "lm.preferences=[0.1,1.0,10.0]"]
    args = ["run", str(CONFIG_DIR / "firm" / "gpu_tinyllama.yaml"), *overrides, "--out", str(out), "--no-progress"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    names = {c["name"] for c in summary["claims"]}
    assert {c.name for c in lm.CLAIMS} <= names
    for claim in summary["claims"]:
        assert {"rule", "n", "estimate", "interval", "margin", "verdict"} <= set(claim)
    assert any(c["name"].startswith("[LM hetero-rm, helpful]") for c in summary["claims"])
    upload = next(c for c in summary["claims"] if c["name"] == lm.UPLOAD.name)
    assert upload["verdict"] == "reproduced"  # the ledger's bytes equal the messages' own, FedCMOO-A sends 2d more
    report = (out / "report.md").read_text()
    assert "Table 1 analogue" in report and "loaded by name" in report
    assert (out / "plots" / "lm_pareto.png").exists() and (out / "plots" / "lm_lambda_beta.png").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    firm = [r for r in records if r.get("arm") == "firm" and r["seed"] == 0]
    assert [r["round"] for r in firm] == [0, 1] and 0 <= firm[-1]["eval_harmless"] <= 1
    # a second run into the same folder reads every (arm, seed) run back instead of training again
    first = (out / "metrics.jsonl").read_bytes()
    monkeypatch.setattr(LMRunner, "run", lambda *a, **k: pytest.fail("a cached run was trained again"))
    # the reruns are compared on their records (the plots were checked above): figures built, not rendered
    unrendered(monkeypatch)
    assert main(args) == 0
    assert (out / "metrics.jsonl").read_bytes() == first
    # a setting that changes the numbers: the folder is refused, and with --force the cache is invalidated
    assert main([*args[:-3], "lm.ppo.actor_lr=0.001", *args[-3:]]) == 2
    with pytest.raises(pytest.fail.Exception, match="trained again"):
        main([*args[:-3], "lm.ppo.actor_lr=0.001", *args[-3:], "--force"])


def test_not_run_records_every_declared_claim():
    part = lm.not_run_part("no data")
    assert [c["name"] for c in part.claims] == [c.name for c in lm.CLAIMS]
    assert all(c["verdict"] == "inconclusive" and c["measured"]["not_run"] == "no data" for c in part.claims)


@pytest.mark.parametrize("override, key", [("lm.beta=-0.1", "lm.beta"),
                                           ("lm.preferences=[1.0,0.0]", "lm.preferences.1"),
                                           ("lm.beta_sweep=[0.0,-1.0]", "lm.beta_sweep.1")])
def test_bad_beta_or_preference_is_one_line_and_exit_2(override, key, capsys):
    assert main(["run", str(CONFIG_DIR / "firm" / "quick.yaml"), override, "--out", "/nonexistent/x"]) == 2
    err = capsys.readouterr().err
    assert key in err and err.startswith("error:")


def test_a_prompts_jsonl_replaces_the_shared_prompts(models, tmp_path, monkeypatch):
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path))  # no HH-RLHF or PKU-SafeRLHF here
    prompts = [f"How do I look after plant number {i}?" for i in range(10)] + ["word " * 400]  # the last too long
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    out = tmp_path / "run"
    overrides = [f"lm.model={models / 'policy'}", "lm.device=cpu", "hf_rewards.device=cpu",
                 f"hf_rewards.helpful={models / 'helpful'}", f"hf_rewards.harmless={models / 'harmless'}",
                 f"hf_rewards.helpful_alt={models / 'helpful'}", "lm.seeds=1", "lm.clients=2", "lm.rounds=1",
                 "lm.batches=1", "lm.batch_size=2", "lm.ppo.minibatch=2", "lm.max_new_tokens=3", "lm.eval_prompts=2",
                 "lm.only=[firm]", f"lm.data={{source: jsonl, path: {tmp_path / 'prompts.jsonl'}}}",
                 "engine.batched=false", "lm.step=rloo", "lm.replies_per_prompt=2", "lm.eval_samples=2",
                 "lm.helpful=relevance"]
    assert main(["run", str(CONFIG_DIR / "firm" / "gpu_tinyllama.yaml"), *overrides, "--out", str(out),
                 "--no-progress"]) == 0
    report = (out / "report.md").read_text()
    assert "8 train and 2 held-out prompts (1 longer than 256 tokens left out)" in report
    assert "helpfulness here is relevance" in report and "The base model on the final rounds' sampling" in report
    assert "Cost per run (one thread" in report and "reach the 3-token cap" in report
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if r.get("arm") == "firm" and r["round"] == 1][0]
    assert 0 <= trained["eval_capped"] <= 1 and trained["kl_coef"] > 0 and "train_kl" in trained
    summary = json.loads((out / "summary.json").read_text())
    assert next(c for c in summary["claims"] if c["name"] == lm.LEARNED.name)["n"] == 1
    with pytest.raises(DataError, match="more than lm.eval_prompts = 10 are needed"):
        jsonl_prompts(tmp_path / "prompts.jsonl", 10, len, 100, np.random.default_rng(0))


def synthetic_runs(helpful: float, harmless: float, seeds: int = 5) -> list[list[dict]]:
    """Runs from a base of 0.5 / 0.5 at round 0 to the given finals (rounds 1, 2), a little noise per seed."""
    rng = np.random.default_rng(int(helpful * 100 + harmless * 10))
    return [[{"round": 0, "eval_helpful": 0.5, "eval_harmless": 0.5},
             *({"round": t, "eval_helpful": helpful + rng.normal(0, 0.01),
                "eval_harmless": harmless + rng.normal(0, 0.01)} for t in (1, 2))] for _ in range(seeds)]


def test_single_objective_gates_and_the_monotone_front_are_decided_from_the_preference_arms():
    from collabalign.experiments.firm.config import LMConfig

    cfg = LMConfig(rq1=False, beta_sweep=[0.0], preferences=[0.1, 1.0, 10.0], ablations=False)
    results = {"firm": synthetic_runs(0.55, 0.55), "p1/p2=0.1": synthetic_runs(0.5, 0.7),
               "p1/p2=1": synthetic_runs(0.55, 0.6), "p1/p2=10": synthetic_runs(0.62, 0.5)}
    decided = {c["name"]: c for c in lm.decide(cfg, results, {}, runner=None)}
    for gate in (lm.LEARNED, lm.LEARNED_HARMLESS, lm.LEARNED_HELPFUL, lm.MONOTONE, lm.PREFERENCE):
        assert decided[gate.name]["verdict"] == "reproduced", gate.name
    assert decided[lm.LEARNED_HELPFUL.name]["measured"]["arm"] == "p1/p2=10"
    assert all(decided[c.name]["measured"]["not_run"] for c in lm.SAME_STREAMS.values())  # no base on those streams
    matched = {c["name"]: c for c in lm.decide(cfg, results, {}, None, {"eval_helpful": 0.6, "eval_harmless": 0.6})}
    verdicts = [matched[c.name]["verdict"] for c in lm.SAME_STREAMS.values()]
    assert verdicts == ["not reproduced", "reproduced", "reproduced"]  # 0.55 / 0.7 / 0.62 against 0.6
    # the helpful-leaning arm does not learn: its gate fails, and a front that folds back is not monotone
    results["p1/p2=10"] = synthetic_runs(0.5, 0.65)
    decided = {c["name"]: c for c in lm.decide(cfg, results, {}, runner=None)}
    assert decided[lm.LEARNED_HELPFUL.name]["verdict"] == "not reproduced"
    assert decided[lm.MONOTONE.name]["verdict"] != "reproduced"
    assert decided[lm.LEARNED_HARMLESS.name]["verdict"] == "reproduced"
