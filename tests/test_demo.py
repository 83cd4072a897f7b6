"""`collabalign demo` trains each method through its entry point, saves every result and writes one report with a
plot per method (here on the tiny random Llama, each training cut short: `SHORTER`; `make demo` runs it on the real
small models with the demo's own settings)."""

import importlib
import json
import re

from collabalign import demo

# entry point -> settings replacing the demo's (fewer rounds, epochs, steps and tokens; a given lr, not lr: auto's
# grid of fits, which is the entry points' own tests')
SHORTER = {"pshare_lora.train_pshare_lora": {"epochs": 1, "lr": 3e-3},
           "meta_reward.train_meta_reward": {"sft_steps": 2, "outer_steps": 5, "test_steps": 2},
           "firm.train_firm": {"rounds": 1, "max_new_tokens": 4},
           "fslora.train_fslora": {"rounds": 2, "lr": 1e-3},
           "affpcl.train_affpcl": {"steps": 200}}


def shortened(train, update: dict):
    def run(config, *args, **kwargs):
        return train(type(config)(**config.model_dump() | update), *args, **kwargs)

    return run


def test_demo_trains_saves_and_reports_each_method(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "SMOLLM2", "tiny-llama")
    monkeypatch.setattr(demo, "MINILM", "tiny-llama")
    for target, update in SHORTER.items():
        package, name = target.split(".")
        module = importlib.import_module(f"collabalign.methods.{package}")
        monkeypatch.setattr(module, name, shortened(getattr(module, name), update))
    report = demo.run_demo(tmp_path)
    text = report.read_text()
    for title in demo.PARTS:
        assert f"## {title}" in text
    for link in re.findall(r"\]\((plots/[^)]+)\)", text):
        assert (tmp_path / link).is_file(), link
    plots = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    slugs = ["affpcl", "firm", "fslora", "meta_reward", "pshare"]
    assert plots == sorted([f"{s}.png" for s in slugs] + [f"{s}-baseline.png" for s in slugs])  # and its baseline
    assert text.count("held-out items: difference") == len(list(tmp_path.glob("*/manifest.json")))  # a sentence each
    manifests = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/manifest.json")}
    assert set(manifests) == {"pshare-pshare_si", "pshare-global", "meta_reward", "firm", "fslora", "affpcl-affpcl",
                              "affpcl-il", "affpcl-fedavg"}
    assert (tmp_path / "firm" / "adapters" / "policy" / "adapter_config.json").exists()
    assert (tmp_path / "pshare-pshare_si" / "adapters" / "user-cai" / "head.safetensors").exists()
