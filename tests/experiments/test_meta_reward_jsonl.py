"""The sentiment part on the user's own preference pairs (`sentiment.data: {source: jsonl, path: ...}`), on the
tiny Llama and MiniLM: every declared claim decided, the file's domains used, cells cached under the
file's hash, and a file without a configured domain or a config that mixes the sources refused."""

import json

import pytest
from pydantic import ValidationError

from collabalign.cli import main
from collabalign.commands import CONFIG_DIR
from collabalign.experiments.meta_reward import sentiment
from collabalign.experiments.meta_reward.sentiment_config import SentimentConfig
from tests.entry.helpers import write_jsonl

from .plots import unrendered

THINGS = {"teapots": ["kettle", "spout", "glaze"], "kites": ["tail", "spar", "string"],
          "lanterns": ["wick", "shade", "handle"]}
TINY = ["bandit.run=false", "sentiment.model=tiny-llama",
        "sentiment.domains=[teapots,kites,lanterns]", "sentiment.held_out=[lanterns]", "sentiment.seeds=3",
        "sentiment.lr_grid=[0.001]", "sentiment.sft_steps=3", "sentiment.inner_steps=1", "sentiment.outer_steps=2",
        "sentiment.outer_batch=2", "sentiment.select_every=1", "sentiment.test_steps=2", "sentiment.pair_steps=2",
        "sentiment.ppo_iterations=1", "sentiment.ppo_batch=2", "sentiment.max_new_tokens=3",
        "sentiment.beta_grid=[1.0,4.0]", "sentiment.eval_prompts=2", "sentiment.temperatures=[0.5,1.0]",
        "sentiment.repetitions=1", "sentiment.batch=2"]


def pairs(per_domain: int = 10) -> list[dict]:
    """Invented reviews: the chosen continuation praises the thing, the rejected one pans it."""
    return [{"prompt": f"My {domain[:-1]} {part} ({i}) review:", "domain": domain,
             "chosen": f"the {part} is superb and I adore it every single day",
             "rejected": f"the {part} broke at once, a dreadful waste of money"}
            for domain, parts in THINGS.items() for i in range(per_domain) for part in [parts[i % len(parts)]]]


def run(path, out, extra=()):
    args = ["run", str(CONFIG_DIR / "meta_reward" / "quick.yaml"), *TINY, "sentiment.data.source=jsonl",
            f"sentiment.data.path={path}", *extra, "--out", str(out), "--no-progress"]
    return main(args), args


def test_the_sentiment_part_runs_on_jsonl_pairs_and_caches_cells_under_the_file(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs())
    out = tmp_path / "run"
    code, args = run(path, out)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    names = [c["name"] for c in summary["claims"]]
    for claim in sentiment.PROTOCOL_CLAIMS:
        assert sum(n.startswith(claim.name) for n in names) == 2, claim.name
    assert all(c["verdict"] in {"reproduced", "not reproduced", "inconclusive"} for c in summary["claims"])
    metrics = summary["metrics"]["sentiment"]
    assert metrics["data"] == {d: {"pairs": 10, "examples": 20} for d in THINGS}
    assert metrics["judges"]["lanterns"]["domain"] == "lanterns"
    assert {"sft", "ours@1", "bt+rwr@4", "oracle@1", "hpl"} <= set(metrics["held_out_apl"])
    assert len(list((out / "meta_reward_cells").glob("lanterns-seed*.json"))) == 3
    monkeypatch.setattr(sentiment, "run_cell", lambda *a: pytest.fail("a cached cell was run again"))
    # the reruns are checked on whether cells run again: figures built, not rendered
    unrendered(monkeypatch)
    assert main(args) == 0
    write_jsonl(path, pairs()[::-1])  # other bytes, other cells
    with pytest.raises(pytest.fail.Exception, match="run again"):
        main([*args[:-3], *args[-3:], "--force"])


def test_a_configured_domain_missing_from_the_file_is_named(tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [p for p in pairs() if p["domain"] != "kites"])
    with pytest.raises(ValueError, match=r"domains \['kites'\] are not in .*its domains are \['lanterns', 'teapots'\]"):
        run(path, tmp_path / "run")


def test_a_training_domain_too_small_to_validate_is_named(tmp_path):
    rows = [p for p in pairs() if p["domain"] != "kites"] + [p for p in pairs() if p["domain"] == "kites"][:2]
    with pytest.raises(ValueError, match="domain 'kites' has 2 pairs: too few"):
        run(write_jsonl(tmp_path / "pairs.jsonl", rows), tmp_path / "run")


def test_configs_that_mix_the_sources_are_refused():
    with pytest.raises(ValidationError, match="needs data.path"):
        SentimentConfig(data={"source": "jsonl"})
    with pytest.raises(ValidationError, match="for data.source jsonl"):
        SentimentConfig(data={"path": "pairs.jsonl"})
    with pytest.raises(ValidationError, match="Amazon reviews' folder"):
        SentimentConfig(data={"source": "jsonl", "path": "p.jsonl"}, data_dir="/data", domains=["a", "b"],
                        held_out=["a"])
    assert SentimentConfig(data={"source": "jsonl", "path": "p.jsonl"}, domains=["a", "b"], held_out=["b"])
