"""The paper-scale GPU configs, one round (FSLoRA) or a few steps (P-ShareLoRA) each on a GPU, through the
experiments' own code: FSLoRA's gpu_roberta.yaml on SST-2 and P-ShareLoRA's gpu_tldr.yaml on TL;DR-length
comparisons. The device machine reaches no hub, so random weights of each paper's architecture stand in for the
pretrained ones (roberta-base with MiniLM's tokenizer; Llama-3 8B in bfloat16 with SmolLM2's tokenizer), and the
TL;DR comparisons are built from SST-2 sentences at the dataset's typical lengths (a 250-word post, 25-word
summaries). Time per round or step, peak GPU memory and throughput carry over; accuracies mean nothing here.
AffPCL has no GPU config: its paper's experiments are linear and tabular, and its main form runs whole on a CPU.

Engine (issue 17): benchmarks/engine_many.py's rounds of 32 and 1,000 clients, batched and one by one, on the GPU.
Assets: `benchmarks/gpu_assets.sh` builds .gpu/ here (tokenizers, SmolLM2's config, SST-2 and HH pairs, pydantic's
wheels) and prints the device command; the same path on a CPU, tiny models (a check, not a cost):
  PYTHONPATH=src .venv/bin/python benchmarks/gpu_configs.py --assets .gpu --out /tmp/gpu --tiny
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import random
import time
from pathlib import Path

import torch

from collabalign.cli import main
from collabalign.commands import CONFIG_DIR
from collabalign.data.tldr import tldr_prompt
from collabalign.experiments.fslora import glue
from collabalign.experiments.pshare_lora import text as pshare_text
from collabalign.models.backbones import Backbone

LOG: list[dict] = []


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def timed(fn, label: str, device: str, units):
    """Wraps `fn` so each call appends {label, seconds, peak GiB, units(args)} to LOG."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        LOG.append({"part": label, "seconds": round(time.perf_counter() - start, 2), "peak_gib": round(peak, 2),
                    **units(*args, **kwargs)})
        print(json.dumps(LOG[-1]), flush=True)
        return out
    return wrapper


def random_model(build, device: str, dtype: torch.dtype):
    """The architecture with random weights, built on the device in `dtype` (an 8B model never visits the CPU)."""
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return build().eval()
    finally:
        torch.set_default_dtype(previous)


def fslora(assets: Path, out: Path, device: str, tiny: bool) -> None:
    """gpu_roberta.yaml, SST-2 only, one seed, one round of every arm (20 devices x 50 steps of batch 16)."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    tok = AutoTokenizer.from_pretrained(assets / "tok" / "minilm")
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) if tiny else {}
    config = RobertaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, **size)  # roberta-base's shape
    model = random_model(lambda: RobertaModel(config), "cpu", torch.float32)  # the experiment moves it
    glue.load_backbone = lambda name: Backbone(model, tok, False)
    glue.arm_run = timed(glue.arm_run, "fslora", device, lambda runner, task, arm, *a, **k: {
        "arm": arm, "rounds": runner.fed.rounds, "devices": runner.fed.devices, "steps": runner.fed.steps,
        "batch": runner.fed.batch_size, "train_examples": len(task.fit), "params": sum(p.numel() for p in
                                                                                       model.parameters())})
    small = ["glue.lora_blocks=2", "glue.max_length=32", "federation.devices=3", "federation.steps=2",
             "federation.min_size=2", "glue.max_train=60"] if tiny else ["glue.max_train=20000"]
    code = main(["run", str(CONFIG_DIR / "fslora" / "gpu_roberta.yaml"), "glue.backbone=roberta-base-random",
                 f"glue.device={device}", "glue.tasks=[SST-2]", "glue.budget_task=null", "seeds=[0]",
                 "federation.rounds=1", "federation.eval_every=1", "synthetic.n_test=200",
                 *small, "--out", str(out / "fslora"), "--no-progress", "--force"])
    assert code == 0, f"fslora run failed ({code})"


def tldr_rows(sentences: list[str], users: int, pairs: int, split: str, rng: random.Random) -> list[dict]:
    """Comparisons in the hub's schema: posts of about 250 words and two summaries of about 25, from SST-2."""
    def words(n: int) -> str:
        out: list[str] = []
        while len(out) < n:
            out += rng.choice(sentences).split()
        return " ".join(out[:n])

    return [{"info": {"id": f"{split}{u}_{i}", "post": words(250), "title": words(8), "subreddit": "tifu",
                      "site": None, "article": None},
             "summaries": [{"text": " " + words(25), "policy": "a", "note": None},
                           {"text": " " + words(25), "policy": "b", "note": None}],
             "choice": rng.randrange(2), "worker": f"w{u}", "batch": "b", "split": split, "extra": {}}
            for u in range(users) for i in range(pairs)]


def pshare(assets: Path, out: Path, device: str, tiny: bool) -> None:
    """gpu_tldr.yaml: P-ShareLoRA (SI) on 5 users x 128 pairs (one batch of 128 per user: 5 steps), 1 epoch."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(assets / "tok" / "smollm2")
    tok.pad_token = tok.pad_token or tok.eos_token
    size = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=len(tok)) if tiny else
            dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0))  # Meta-Llama-3-8B's shape
    config = LlamaConfig(max_position_embeddings=8192, pad_token_id=tok.pad_token_id, **size)
    start = time.perf_counter()
    model = random_model(lambda: LlamaForCausalLM(config), device, torch.bfloat16)
    print(f"llama random init {time.perf_counter() - start:.1f} s, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters", flush=True)
    pshare_text.load_backbone = lambda name: Backbone(model, tok, True)
    lengths: list[int] = []

    def units(backbone, cache, data, test, method, n_users, tc, seed):
        return {"method": method, "pairs": len(data), "test_pairs": len(test), "batch": tc.batch_size,
                "micro_batch": tc.micro_batch, "epochs": tc.epochs, "steps": max(1, round(tc.epochs * -(
                    -len(data) // tc.batch_size))), "mean_tokens_per_sequence": round(sum(lengths) / len(lengths))}
    pshare_text.fit = timed(pshare_text.fit, "pshare", device, units)
    with open(assets / "data" / "glue" / "SST-2" / "train.tsv") as f:
        sentences = [row["sentence"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    rng, data = random.Random(0), out / "tldr-data"
    data.mkdir(parents=True, exist_ok=True)
    for split, pairs in (("train", 128), ("validation", 32)):
        rows = tldr_rows(sentences, 5, pairs, split, rng)
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows[:8]:
        prompt = tldr_prompt(r["info"]["subreddit"], r["info"]["title"], r["info"]["post"])
        lengths += [len(tok(prompt + s["text"])["input_ids"]) for s in r["summaries"]]
    small = ["text.lora_blocks=2", "text.max_length=64", "text.rank=4"] if tiny else []
    code = main(["run", str(CONFIG_DIR / "pshare_lora" / "gpu_tldr.yaml"), "text.backbone=llama-3-8b-random",
                 f"text.data_root={data}", f"text.device={device}", "text.epochs=1", "text.methods=[pshare_si]",
                 *small, "--out", str(out / "pshare"), "--no-progress", "--force"])
    assert code == 0, f"pshare run failed ({code})"


def engine(assets: Path, out: Path, device: str, tiny: bool) -> None:
    """benchmarks/engine_many.py's first two parts on the device (issue 17): one FedAvg-LoRA round of 32 clients on
    SmolLM2-135M's architecture (the quickstart's HH pairs) and of 1,000 clients on the tiny Llama, batched and one by
    one. Flower's simulation needs Ray, whose wheel is larger than what travels to the device machine: not run."""
    import engine_many
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    from collabalign.experiments.quickstart import comparison
    from collabalign.models.backbones import tiny_llama

    tok = AutoTokenizer.from_pretrained(assets / "tok" / "smollm2")
    config = AutoConfig.from_pretrained(assets / "smollm2")  # SmolLM2-135M-Instruct's config.json
    if tiny:
        config.update(dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2))
    small = random_model(lambda: LlamaForCausalLM(config), "cpu", torch.float32)  # the job moves it
    named = {"smollm2-135m": lambda: Backbone(small, tok, True), "tiny-llama": lambda: tiny_llama(tokenizer=tok)}
    comparison.load_backbone = lambda name: named[name]()
    runs = [("32 clients, SmolLM2-135M's architecture at random weights", engine_many.SMOLLM2),
            ("1,000 clients, tiny Llama", engine_many.TINY)]
    for title, overrides in runs[:1] if tiny else runs:
        if tiny:
            overrides, title = [*overrides, "split.clients=4", "data.max_pairs=80"], "the path only: 4 clients, tiny"
        results = engine_many.rounds([*overrides, f"model.device={device}"], ["batched", "one by one"])
        engine_many.report(f"FedAvg-LoRA on {device_name(device)}, {title}, one round", results)
        LOG.append({"part": "engine", "title": title, "device": device,
                    **{name: round(seconds, 3) for name, (_, seconds) in results.items()}})


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=Path, default=Path(".gpu"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="tiny models on the CPU: checks the path, not the cost")
    parser.add_argument("--parts", default="fslora,pshare,engine")
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    os.environ["COLLABALIGN_DATA"] = str((args.assets / "data").resolve())
    print(f"device: {device_name(device)}, torch {torch.__version__}", flush=True)
    for part in args.parts.split(","):
        start = time.perf_counter()
        try:
            {"fslora": fslora, "pshare": pshare, "engine": engine}[part](args.assets, args.out, device, args.tiny)
        except Exception as err:  # one part failing must not lose the other's numbers
            LOG.append({"part": part, "error": repr(err)[:500]})
            print(f"{part} failed: {err!r}", flush=True)
        print(f"{part}: {time.perf_counter() - start:.1f} s in all", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_configs.json").write_text(json.dumps(LOG, indent=1))


if __name__ == "__main__":
    run()
