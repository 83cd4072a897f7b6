"""The commonsense (LLM-Adapters) loader, answer extraction, the causal-LM LoRA problem on tiny_llama, and the
paper-scale gpu_llama_commonsense.yaml run end to end on a tiny stand-in."""

import json
import re

import numpy as np
import pytest
import torch

from collabalign.cli import main
from collabalign.commands import CONFIG_DIR
from collabalign.config import read_yaml, validate
from collabalign.data import DataError
from collabalign.data.commonsense import commonsense_prompt, extract_answer, load_commonsense, load_commonsense_test
from collabalign.experiments.fslora import Config
from collabalign.federation import simulate
from collabalign.methods.fslora import fslora, lora_scale, sketch_indices
from collabalign.methods.fslora.commonsense import CommonsenseSetup, commonsense_problem, encode
from collabalign.methods.fslora.problems import LocalSGD
from collabalign.models.backbones import tiny_llama
from collabalign.seeding import Seeds

TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
QUESTIONS = {  # task -> (instruction, answer) pairs in LLM-Adapters' wording
    "boolq": [(f"Please answer the following question with true or false, question: is {x} blue?\n\n"
               "Answer format: true/false", a) for x, a in (("the sky", "true"), ("grass", "false"),
                                                             ("the sea", "true"), ("snow", "false"))],
    "piqa": [(f"Please choose the correct solution to the question: {q}\n\nSolution1: {s1}\n\nSolution2: {s2}\n\n"
              "Answer format: solution1/solution2", a)
             for q, s1, s2, a in (("To open a jar", "twist the lid", "bake it", "solution1"),
                                  ("To dry hands", "wet them", "use a towel", "solution2"),
                                  ("To boil water", "heat it", "freeze it", "solution1"))],
    "winogrande": [(f"Please choose the correct answer to fill in the blank to complete the given sentence: {s}\n\n"
                    f"Option1: {o1}\n\nOption2: {o2}\n\nAnswer format: option1/option2", a)
                   for s, o1, o2, a in (("The cup did not fit in the box because _ was big.", "cup", "box", "option1"),
                                        ("The ball broke the window because _ was fragile.", "ball", "window",
                                         "option2"))],
}


def record(instruction: str, answer: str, input_: str = "") -> dict:
    return {"instruction": instruction, "input": input_, "output": f"the correct answer is {answer}", "answer": answer}


def write(path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2))


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    """LLM-Adapters' layout: ft-training_set/commonsense_170k.json (tasks mixed) and dataset/<task>/test.json."""
    root = tmp_path_factory.mktemp("llm-adapters")
    train = [record(q, a) for pairs in QUESTIONS.values() for q, a in pairs]
    train.append(record("Please answer the following question with true or false, question: see the input.\n\n"
                        "Answer format: true/false", "true", input_="Is fire hot?"))
    write(root / "ft-training_set" / "commonsense_170k.json", train)
    for task, pairs in QUESTIONS.items():
        write(root / "dataset" / task / "test.json", [record(q, a) for q, a in pairs])
    return root


@pytest.fixture(scope="module")
def backbone():
    return tiny_llama(hidden_size=32, num_layers=2, num_heads=2, seed=0)


def problem_for(fixture, backbone, steps=2, lr=0.5, rank=8, max_test=None):
    setup = CommonsenseSetup(fixture / "ft-training_set" / "commonsense_170k.json", fixture / "dataset",
                             list(QUESTIONS), rank, LocalSGD(steps, lr, batch_size=4), targets=TARGETS,
                             max_test=max_test, max_length=128, max_new_tokens=6)
    return commonsense_problem(setup, backbone, Seeds(0))


def test_loader_reads_the_llm_adapters_schema(fixture):
    train = load_commonsense(fixture / "ft-training_set" / "commonsense_170k.json")
    assert len(train) == 10 and train[-1].input == "Is fire hot?" and train[0].answer == "true"
    test = load_commonsense_test(fixture / "dataset", "piqa")
    assert [e.answer for e in test] == ["solution1", "solution2", "solution1"]
    with_input, without = commonsense_prompt(train[-1]), commonsense_prompt(train[0])
    assert "### Input:\nIs fire hot?\n\n### Response:\n" in with_input and "### Input:" not in without
    assert without.endswith(f"### Instruction:\n{train[0].instruction}\n\n### Response:\n")


@pytest.mark.parametrize("bad, task, where", [
    ({"input": "", "output": "x", "answer": "true"}, None, ":2: field 'instruction': missing"),
    ({"instruction": "q", "input": None, "output": "x", "answer": "true"}, None, ":2: field 'input': missing"),
    ({"instruction": "q", "input": 3, "output": "x", "answer": "true"}, None, ":2: field 'input': not a string"),
    ({"instruction": "q", "input": "", "output": "  ", "answer": "true"}, None, ":2: field 'output': empty text"),
    ({"instruction": "q", "input": "", "output": "x", "answer": "yes"}, "boolq", ":2: field 'answer': 'yes' is not"),
    ({"instruction": "q", "input": "", "output": "x", "answer": "option3"}, "winogrande", ":2: field 'answer'"),
    (["not", "an", "object"], None, ":2: record is not a JSON object"),
])
def test_loader_errors_name_file_record_and_field(tmp_path, bad, task, where):
    path = tmp_path / "test.json"
    write(path, [record("q", "option1" if task == "winogrande" else "true"), bad])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}{where}"):
        load_commonsense(path, task)


def test_loader_rejects_invalid_json_non_lists_and_unknown_tasks(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"instruction": "q",\n  oops\n]')
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:3: invalid JSON"):
        load_commonsense(path)
    path.write_text('{"instruction": "q"}')
    with pytest.raises(DataError, match="non-empty JSON list"):
        load_commonsense(path)
    with pytest.raises(ValueError, match="unknown commonsense task 'mmlu'"):
        load_commonsense_test(tmp_path, "mmlu")


@pytest.mark.parametrize("task, text, answer", [
    ("boolq", "the correct answer is true", "true"),
    ("boolq", "false, not true", "false"),  # the first label found counts
    ("boolq", "True", ""),  # case-sensitive, as LLM-Adapters' regexes
    ("piqa", "the correct answer is solution2\n", "solution2"),
    ("social_i_qa", "answer3", "answer3"),
    ("ARC-Challenge", "it is answer5", "answer5"),
    ("hellaswag", "ending4 then ending1", "ending4"),
    ("winogrande", "option2", "option2"),
    ("winogrande", "answer1", ""),  # another task's label is no answer
])
def test_extract_answer(task, text, answer):
    assert extract_answer(task, text) == answer


def test_encode_masks_the_prompt_and_keeps_the_answer_under_the_cutoff(fixture, backbone):
    tok = backbone.tokenizer
    examples = load_commonsense(fixture / "ft-training_set" / "commonsense_170k.json")
    tokens = encode(tok, examples, max_length=24)  # shorter than every prompt: prompts are cut from the left
    assert int(tokens.lengths.max()) == 24 and tokens.input_ids.shape[1] == 24
    ids, mask, answer = tokens.training_batch(torch.tensor([0, 4]))
    for row, example in zip((0, 1), (examples[0], examples[4]), strict=True):
        assert tok.decode(ids[row][answer[row]]) == example.output + tok.eos_token
        assert mask[row].sum() == tokens.lengths[[0, 4][row]]
    prompts, prompt_mask = tokens.prompts(torch.tensor([0, 9]))
    for row, stored in zip((0, 1), (0, 9), strict=True):
        start = int(tokens.prompt_lengths[stored])
        assert prompts[row][prompt_mask[row].bool()].tolist() == tokens.input_ids[stored, :start].tolist()
        assert prompt_mask[row, -1] == 1  # left padding: the prompt ends where generation starts


def test_problem_has_no_head_and_overfits_the_answers(fixture, backbone):
    problem, train = problem_for(fixture, backbone, steps=25, lr=2.0)  # the answers of all 10 rows
    assert problem.head == {} and problem.init_head(Seeds(0)) == {}
    assert len(problem.shapes) == 2 * len(TARGETS) and problem.shapes["model.layers.0.mlp.up_proj"] == (64, 32)
    assert len(train) == 10 and len(problem.test) == 9 and (train.y == -1).all()
    gen = torch.Generator().manual_seed(0)
    factors = {name: (np.zeros((m, 8), np.float32), problem.init_a(gen, 8, n)) for name, (m, n) in
               problem.shapes.items()}
    scale = lora_scale(1.0, 8)

    def loss(blocks):
        problem.load(blocks, {}, scale, None)
        with torch.no_grad():
            return float(problem.loss(train))

    before = loss(factors)
    trained, head = problem.local_train(factors, {}, scale, None, train, torch.Generator().manual_seed(1))
    assert head == {}
    # a random 32-wide LM with tied 0.02-scale embeddings cannot make confident logits (its loss floor is near
    # ln |V| = 10.8), so the fall is small; it is deterministic (a wrong gradient sign would raise the loss)
    assert before > 10 and loss(trained) < before - 0.1


def test_left_padded_generation_matches_one_prompt_at_a_time(fixture, backbone):
    problem, _ = problem_for(fixture, backbone)
    rows = problem.test.x  # prompts of 54 to 81 tokens: the batch is padded

    def step_logits(rows):  # the logits of 3 greedy steps (a random LM's texts are all "\n", so compare logits)
        ids, mask = problem.tokens.prompts(rows)
        out = problem.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                                     pad_token_id=problem.tokens.pad_id, output_logits=True,
                                     return_dict_in_generate=True)
        return torch.stack(out.logits, 1)

    alone = torch.cat([step_logits(rows[i:i + 1]) for i in range(len(rows))])
    torch.testing.assert_close(step_logits(rows), alone, atol=1e-4, rtol=1e-4)
    assert problem.generate(rows) == [problem.generate(rows[i:i + 1])[0] for i in range(len(rows))]


def test_evaluate_scores_extracted_answers_per_task_and_their_mean(fixture, backbone, monkeypatch):
    problem, _ = problem_for(fixture, backbone)
    zero = {name: np.zeros(shape, np.float32) for name, shape in problem.shapes.items()}
    metrics = problem.evaluate(zero, {})
    assert set(metrics) == {"accuracy", "loss"} | {f"accuracy/{t}" for t in QUESTIONS} and metrics["loss"] > 0
    # answer right on every boolq row, wrong on piqa's (no label), "option1" on winogrande's (half right)
    task_of = dict(zip(problem.test.x.tolist(), problem.test.y.tolist(), strict=True))
    reply = {"boolq": lambda gold: gold, "piqa": lambda gold: "solution3", "winogrande": lambda gold: "option1"}
    monkeypatch.setattr(problem, "generate", lambda rows: [
        "the correct answer is " + reply[list(QUESTIONS)[task_of[r]]](problem.answers[r]) for r in rows.tolist()])
    metrics = problem.evaluate(zero, {})
    assert (metrics["accuracy/boolq"], metrics["accuracy/piqa"], metrics["accuracy/winogrande"]) == (1.0, 0.0, 0.5)
    assert metrics["accuracy"] == pytest.approx(0.5)


def test_fslora_round_moves_only_the_sketched_rank_columns(fixture, backbone):
    problem, train = problem_for(fixture, backbone, steps=2, lr=0.5, max_test=1)
    clients = {"d0": train[:5], "d1": train[5:]}
    ranks = {"d0": 2, "d1": 2}
    algorithm = fslora(problem, ranks, rank=8)
    before = algorithm.init(Seeds(0))
    after = simulate(algorithm, clients, rounds=1, seed=0, progress=False).state
    for name in problem.shapes:
        chosen = np.union1d(*[sketch_indices(Seeds(0), 1, cid, name, 8, 2) for cid in clients])
        other = np.setdiff1d(np.arange(8), chosen)
        assert len(other) >= 4
        np.testing.assert_array_equal(after[f"{name}.B"][:, other], 0)
        np.testing.assert_array_equal(after[f"{name}.A"][other], before[f"{name}.A"][other])
        assert (np.abs(after[f"{name}.B"][:, chosen]).sum(axis=0) > 0).all()  # every sketched column moved
        assert (after[f"{name}.A"][chosen] != before[f"{name}.A"][chosen]).any(axis=1).all()
    assert not any(k.startswith("head/") for k in after)


def test_gpu_llama_commonsense_config_validates_and_runs_on_a_tiny_stand_in(fixture, tmp_path):
    """The paper-scale config with tiny_llama, the CPU, 3 devices and the fixture in place of LLaMA-3.2-3B."""
    path = CONFIG_DIR / "fslora" / "gpu_llama_commonsense.yaml"
    cfg = validate(Config, {k: v for k, v in read_yaml(path).items() if k != "experiment"})
    cs, fed = cfg.commonsense, cfg.federation
    assert (cs.backbone, cs.max_length, cs.lr, cs.device, cs.targets) == (
        "meta-llama/Llama-3.2-3B-Instruct", 256, 3e-4, "cuda", TARGETS)
    assert (fed.rank, fed.devices, fed.rounds, fed.steps, fed.batch_size, len(cfg.seeds)) == (64, 20, 750, 20, 16, 3)
    assert len(cs.tasks) == 8 and cs.max_train is None and cs.max_test is None
    overrides = ["seeds=[0]", "synthetic.n_train=100", "synthetic.n_test=100", "federation.devices=3",
                 "federation.min_size=2", "federation.rank=8", "federation.rounds=1", "federation.steps=2",
                 "federation.batch_size=4", "commonsense.backbone=tiny-llama", "commonsense.device=cpu",
                 f"commonsense.train_file={fixture / 'ft-training_set' / 'commonsense_170k.json'}",
                 f"commonsense.test_root={fixture / 'dataset'}", f"commonsense.tasks={list(QUESTIONS)}",
                 "commonsense.max_test=2", "commonsense.max_new_tokens=4", "commonsense.lr=0.5", "--no-progress"]
    assert main(["run", str(path), *overrides, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    e1 = summary["metrics"]["E1"]
    assert {f"commonsense/{m}" for m in ("fedlora", "fslora", "heterolora", "flexlora", "fedstack")} <= set(e1)
    assert {f"commonsense/boolq/{m}" for m in ("fslora", "fedstack")} <= set(e1)
    assert "commonsense" in summary["claims"][0]["measured"]["problems"]
    assert "| boolq |" in (tmp_path / "run" / "report.md").read_text()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in records if r.get("problem") == "commonsense" and r["round"] == 1]
    assert len(final) == 5 and all(0 <= r["accuracy/winogrande"] <= 1 for r in final)
