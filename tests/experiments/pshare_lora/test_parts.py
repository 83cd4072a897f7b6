"""The bandit, federated and text parts at toy size: records, claims, tables and plots, determinism, and the bandit
summary rebuilt from metrics.jsonl alone."""

import json

import numpy as np
import pytest
import torch

from collabalign.experiments.pshare_lora import Config
from collabalign.experiments.pshare_lora.bandit import bandit_part, summarise
from collabalign.experiments.pshare_lora.config import BanditConfig, FederatedConfig, TextConfig
from collabalign.experiments.pshare_lora.federated import federated_part
from collabalign.experiments.pshare_lora.ordering import CLAIMS
from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, TrainConfig
from collabalign.experiments.pshare_lora.text import LEARNED, LEARNED_BEYOND_FEATURES, LEARNED_PERSONAL, text_part
from collabalign.runs import RunDir
from tests.data.helpers import write_hh
from tests.experiments.plots import unrendered
from tests.methods.pshare_lora.text_setup import tiny_bert

BANDIT = Config(seeds=[0, 1], problem=ProblemConfig(d1=6, d2=4, users=3, n_test=10),
                bandit=BanditConfig(prompts=6, candidates=4, n_train=[10, 20, 40], zetas=[0.0, 0.1, "theory", "oracle"],
                                    methods=["global", "pshare_si"], train=TrainConfig(steps=20), iters=50))


def test_bandit_part_writes_claims_table_and_plots_and_is_deterministic(tmp_path, monkeypatch):
    a = bandit_part(BANDIT, RunDir(tmp_path / "a"), progress=False)
    with monkeypatch.context() as patched:
        unrendered(patched)
        b = bandit_part(BANDIT, RunDir(tmp_path / "b"), progress=False)
    assert json.dumps(a.records, sort_keys=True) == json.dumps(b.records, sort_keys=True)
    assert a.claims == b.claims and a.metrics == b.metrics
    names = [c["name"] for c in a.claims]
    assert names[:2] == ["P-ShareLoRA (SI) has a lower value gap than every baseline at N_p = 10 (zeta = 0)",
                         "P-ShareLoRA (G) has a lower value gap than every baseline at N_p = 10 (zeta = 0)"]
    assert a.claims[0]["cells"].keys() == {"LoRA-global"} and a.claims[1]["measured"]["not_run"]
    assert sum(n.startswith("A confidence radius zeta > 0") for n in names) == 3
    assert names[-2:] == ["P-ShareLoRA (SI)'s value gap falls with N_p (zeta = 0)",
                          "P-ShareLoRA (G)'s value gap falls with N_p (zeta = 0)"]
    gaps = [r for r in a.records if r["experiment"] == "bandit"]
    assert len(gaps) == 2 * 3 * 2 * 4 and all(r["gap"] >= -1e-9 for r in gaps)
    assert "| P-ShareLoRA (SI) | oracle |" in a.notes[0]
    for name in ("zeta0", "best_zeta"):
        assert (tmp_path / "a" / "plots" / f"bandit_gap_{name}.png").stat().st_size > 1000
    unrendered(monkeypatch)  # what follows is compared on claims, metrics and records only
    saved = RunDir(tmp_path / "a")
    saved.write_metrics(a.records)  # the summary is rebuilt from metrics.jsonl alone
    rebuilt = summarise(BANDIT.bandit, saved.read_metrics(), RunDir(tmp_path / "c"))
    assert rebuilt.claims == a.claims and rebuilt.metrics == a.metrics
    cached = sorted((tmp_path / "a" / "pshare_bandit_runs").iterdir())
    assert [f.name for f in cached] == ["seed0.json", "seed1.json"]
    stamps = [f.stat().st_mtime_ns for f in cached]
    again = bandit_part(BANDIT, RunDir(tmp_path / "a"), progress=False)  # a stopped run continues: read back
    assert [f.stat().st_mtime_ns for f in cached] == stamps and again.records == a.records
    assert again.claims == a.claims
    with pytest.raises(ValueError, match="include 0"):
        BanditConfig(zetas=[0.1, "oracle"])


FEDERATED = Config(seeds=[0, 1, 2], problem=ProblemConfig(users=3, n_train=20, n_test=60),
                   federated=FederatedConfig(rounds=6, local_steps=2, eval_every=3,
                                             methods=["fed_pshare_si", "fed_pshare_g", "fedavg_lora", "fed_local",
                                                      "central_pshare_si", "central_global"]))


@pytest.fixture(scope="module")
def toy_federated(tmp_path_factory):
    out = [tmp_path_factory.mktemp("fed") for _ in range(2)]
    first = federated_part(FEDERATED, RunDir(out[0]), progress=False)
    with pytest.MonkeyPatch.context() as monkeypatch:
        unrendered(monkeypatch)  # the second run is compared on its records only
        return out, [first, federated_part(FEDERATED, RunDir(out[1]), progress=False)]


def test_federated_part_writes_its_claims_ledgers_and_plot(toy_federated):
    paths, (part, again) = toy_federated
    assert [(c["name"], c["rule"]) for c in part.claims] == [
        ("federated P-ShareLoRA (SI) > FedAvg-LoRA", "superiority"),
        ("federated P-ShareLoRA (SI) matches centralised P-ShareLoRA (SI)", "equivalence"),
        ("the upload per round is exactly the shared B factors' bytes", "exact")]
    assert part.claims[1]["margin"] == 0.01 and part.claims[0]["n"] == 3
    assert part.claims[2]["verdict"] == "reproduced" and part.claims[2]["measured"]["byte_exact_runs"] == {
        "federated P-ShareLoRA (SI)": "3/3", "federated P-ShareLoRA (G)": "3/3"}
    assert {(r["method"], r["seed"]) for r in part.records} == {(m, s) for m in FEDERATED.federated.methods
                                                                for s in (0, 1, 2)}
    assert "| federated P-ShareLoRA (SI) | " in part.notes[0]
    ledgers = RunDir(paths[0]).read_ledgers()
    assert set(ledgers) == {"fed_pshare_si", "fed_pshare_g", "fedavg_lora", "fed_local"}
    assert ledgers["fed_local"].total("up") < ledgers["fed_pshare_si"].total("up") < ledgers["fedavg_lora"].total("up")
    assert (paths[0] / "plots" / "federated_accuracy.png").stat().st_size > 1000
    assert json.dumps(part.records, sort_keys=True) == json.dumps(again.records, sort_keys=True)


def test_federated_runs_are_cached_and_read_back_with_their_ledgers(toy_federated, monkeypatch):
    unrendered(monkeypatch)  # compared on the cached runs, records and ledger only
    paths, (part, _) = toy_federated
    cached = sorted((paths[0] / "pshare_federated_runs").iterdir())
    assert len(cached) == len(FEDERATED.federated.methods) * len(FEDERATED.seeds)
    stamps, ledger = [f.stat().st_mtime_ns for f in cached], (paths[0] / "ledger.csv").read_text()
    (paths[0] / "ledger.csv").unlink()
    again = federated_part(FEDERATED, RunDir(paths[0]), progress=False)
    assert [f.stat().st_mtime_ns for f in cached] == stamps  # read back, not simulated again
    assert again.records == part.records and again.claims == part.claims and again.metrics == part.metrics
    assert (paths[0] / "ledger.csv").read_text() == ledger
    assert all(isinstance(r, int) for rec in again.records for r in rec.get("accuracy_by_round", {}))


def test_the_top_level_engine_runs_the_federated_part_and_keys_its_cache(tmp_path, monkeypatch):
    from collabalign.experiments.pshare_lora import federated
    from collabalign.federation.engine import EngineOptions

    seen, simulate = [], federated.simulate
    monkeypatch.setattr(federated, "simulate", lambda *a, options, **k: seen.append(options) or simulate(
        *a, options=options, **k))
    engine = EngineOptions(batched=False)
    cfg = FEDERATED.model_copy(update={"seeds": [0], "engine": engine, "federated": FEDERATED.federated.model_copy(
        update={"methods": ["fed_pshare_si"]})})
    federated_part(cfg, RunDir(tmp_path), progress=False)
    assert seen == [engine] and federated.cache_key(cfg) != federated.cache_key(FEDERATED)
    with pytest.raises(ValueError, match="federated.engine"):
        Config.model_validate({"federated": {"engine": {"batched": False}}})


TEXT = TextConfig(run=True, seeds=[0, 1], users=3, n_train=8, n_test=4, epochs=1, batch_size=8, max_length=40, rank=2,
                  methods=["global", "frozen", "local", "share_rep", "share_rep_same_head", "pshare_si", "pshare_g"])


@pytest.fixture(scope="module")
def backbone():
    return tiny_bert()


@pytest.fixture
def hh_dir(tmp_path, monkeypatch):
    write_hh(tmp_path)
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path))
    return tmp_path


def test_text_part_writes_claims_table_plot_and_is_deterministic(backbone, hh_dir, tmp_path, monkeypatch):
    cfg = Config(seeds=[7], text=TEXT)
    parts = [text_part(cfg, RunDir(tmp_path / "run0"), False, backbone)]
    with monkeypatch.context() as patched:
        unrendered(patched)  # the second run is compared on its records only
        parts.append(text_part(cfg, RunDir(tmp_path / "run1"), False, backbone))
    assert parts[0].records == parts[1].records
    assert {r["seed"] for r in parts[0].records} == {0, 1}  # the text seeds override the experiment's
    assert len(parts[0].records) == 2 * 7 * 2  # sources x methods x seeds
    assert {r["method"] for r in parts[0].records} == set(TEXT.methods)
    names = [c["name"] for c in parts[0].claims]
    assert names == [f"{source}: {c.name}" for source in ("TL;DR-like", "HH-RLHF")
                     for c in (LEARNED, LEARNED_PERSONAL, LEARNED_BEYOND_FEATURES, *CLAIMS)]
    by_name = dict(zip(names, parts[0].claims, strict=True))
    learned = by_name[f"HH-RLHF: {LEARNED.name}"]  # decided before the ordering: above chance and the frozen head
    assert learned["n"] == 2 and set(learned["cells"]) == {"chance", "frozen"}
    personal = by_name[f"HH-RLHF: {LEARNED_PERSONAL.name}"]
    assert personal["post_hoc"] and set(personal["measured"]["mean_accuracy"]) == {"LoRA-local", "frozen"}
    # the paper's Share Rep is a baseline of the declared claims; its same-head variant is not
    assert set(by_name["HH-RLHF: P-ShareLoRA (G) beats every baseline"]["cells"]) == {"LoRA-global", "LoRA-local",
                                                                                      "Share Rep"}
    assert by_name["HH-RLHF: P-ShareLoRA (SI) > LoRA-local"]["n"] == 2  # two seeds: decided, inconclusive
    assert by_name["HH-RLHF: P-ShareLoRA (WU) >= P-ShareLoRA (SI)"]["measured"]["not_run"]
    notes = "\n".join(parts[0].notes)
    assert "| frozen backbone (trained head) | " in notes and "| Share Rep | " in notes
    assert "| Share Rep (same head) | " in notes and "| oracle | " in notes
    assert "**HH-RLHF: learning not shown.**" in notes  # two seeds: no learned claim can be reproduced
    assert "labeler 2" in notes and "formality" in notes
    assert parts[0].metrics["text_hh"].keys() >= {"Share Rep", "Share Rep (same head)"}
    for source in ("tldr_like", "hh"):
        assert (tmp_path / "run0" / "plots" / f"text_{source}_per_labeler.png").stat().st_size > 1000
    rec = parts[0].records[0]
    assert len(rec["accuracy_per_user"]) == 3 and 0 <= rec["accuracy"] <= 1 and rec["steps"] == 3
    fits = sorted((tmp_path / "run0" / "pshare_text_fits").iterdir())
    assert len(fits) == len(parts[0].records)  # every fit cached: a stopped run continues where it stopped
    stamps = [f.stat().st_mtime_ns for f in fits]
    unrendered(monkeypatch)
    assert text_part(cfg, RunDir(tmp_path / "run0"), False, backbone).records == parts[0].records
    assert [f.stat().st_mtime_ns for f in fits] == stamps  # read back, not refitted


def test_real_tldr_source_trains_on_the_labelers_own_comparisons(backbone, tmp_path):
    from tests.data.helpers import jsonl, write
    from tests.data.test_tldr import TRAIN, VALID

    write(tmp_path / "train.jsonl.gz", jsonl(*TRAIN), gz=True)
    write(tmp_path / "validation.jsonl", jsonl(*VALID))
    text = TEXT.model_copy(update={"sources": ["tldr"], "data_root": str(tmp_path), "users": 5, "n_train": 0,
                                   "n_test": 0, "methods": ["global", "pshare_si"], "seeds": None})
    part = text_part(Config(seeds=[0], text=text), RunDir(tmp_path / "run"), False, backbone)
    assert len(part.records) == 2 * 1  # methods x seeds
    rec = part.records[0]
    assert rec["source"] == "tldr" and len(rec["accuracy_per_user"]) == 5 and "oracle_accuracy" not in rec
    assert rec["steps"] == 3  # 4 balanced train pairs x 5 labelers / batch 8, one epoch
    assert "Reddit TL;DR: P-ShareLoRA (SI) > LoRA-global" in [c["name"] for c in part.claims]
    assert "| oracle |" not in "\n".join(part.notes)
    assert (tmp_path / "run" / "plots" / "text_tldr_per_labeler.png").stat().st_size > 1000


def test_text_lr_is_chosen_per_method_on_a_held_out_slice_of_the_training_pairs(backbone, hh_dir, tmp_path):
    from collabalign.selection import best, held_out_slice

    text = TEXT.model_copy(update={"sources": ["tldr_like"], "seeds": [0], "methods": ["global", "pshare_si"],
                                   "n_train": 10, "lr_grid": [1e-3, 1e-2]})
    part = text_part(Config(seeds=[0], text=text), RunDir(tmp_path / "run"), False, backbone)
    chosen = part.metrics["text_tldr_like_lr"]
    for method in ("global", "pshare_si"):
        scores = {float(lr): a for lr, a in chosen[method]["selection_accuracy"].items()}
        assert set(scores) == {1e-3, 1e-2} and chosen[method]["lr"] == best(scores)
    assert {r["lr"] for r in part.records} <= {1e-3, 1e-2}
    assert all(r["lr"] == chosen[r["method"]]["lr"] for r in part.records)
    fits = {f.name for f in (tmp_path / "run" / "pshare_text_fits").iterdir()}
    assert sum(n.endswith("__select.json") for n in fits) == 4 and len(fits) == 6
    assert any(n.startswith("TL;DR-like learning rate, chosen per method") for n in part.notes)
    users = np.repeat(np.arange(3), 10)
    fit_rows, select_rows = held_out_slice(users, 0.2, np.random.default_rng(0))
    assert sorted(fit_rows.tolist() + select_rows.tolist()) == list(range(30))
    assert np.bincount(users[select_rows.numpy()]).tolist() == [2, 2, 2]


def write_user_pairs(path, users=("ana", "bo", 7), per_user=10):
    rows = [{"prompt": f"Post {i} by {u}: my day went well.", "chosen": f"A short summary {i} for {u}.",
             "rejected": f"An unrelated, long and rambling reply number {i}.", "user": u}
            for u in users for i in range(per_user)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_jsonl_source_trains_on_the_files_users_and_caches_under_the_files_hash(backbone, tmp_path):
    from collabalign.experiments.pshare_lora.config import PairsData
    from collabalign.experiments.pshare_lora.text import fit_key, jsonl_data, jsonl_split

    write_user_pairs(tmp_path / "pairs.jsonl")
    text = TextConfig.model_validate({**TEXT.model_dump(), "sources": ["jsonl"], "seeds": [0, 1],
                                      "methods": ["global", "frozen", "pshare_si"],
                                      "data": {"source": "jsonl", "path": str(tmp_path / "pairs.jsonl")}})
    part = text_part(Config(seeds=[0], text=text), RunDir(tmp_path / "run"), False, backbone)
    assert len(part.records) == 3 * 2 and {r["source"] for r in part.records} == {"jsonl"}
    assert all(len(r["accuracy_per_user"]) == 3 and "oracle_accuracy" not in r for r in part.records)
    assert f"JSONL pairs: {LEARNED.name}" in [c["name"] for c in part.claims]
    assert f"the 3 users of {tmp_path / 'pairs.jsonl'}" in "\n".join(part.notes)
    prefs, _, names = jsonl_data(text, backbone)
    assert names == ["7", "ana", "bo"] and len(prefs) == 30
    splits = [jsonl_split(prefs, names, 0.2, seed) for seed in (0, 1)]
    for train, test in splits:  # 2 of each user's 10 pairs held out, the rest trained on
        assert np.bincount(test.users.numpy()).tolist() == [2, 2, 2] and len(train) + len(test) == 30
    assert not torch.equal(splits[0][1].chosen, splits[1][1].chosen)  # each seed holds out its own pairs
    key = fit_key(text, "jsonl")
    assert key != fit_key(text, "tldr_like") == fit_key(TextConfig(**{**text.model_dump(), "sources": ["hh"],
                                                                      "data": None}), "tldr_like")
    write_user_pairs(tmp_path / "pairs.jsonl", per_user=11)
    assert fit_key(text, "jsonl") != key  # a changed file is fitted again
    with pytest.raises(ValueError, match="go together"):
        TextConfig(sources=["jsonl"])
    with pytest.raises(ValueError, match="go together"):
        TextConfig(data=PairsData(path="pairs.jsonl"))
