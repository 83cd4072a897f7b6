"""Bad config values are errors naming the field, checked before any work; every shipped config still validates."""

import importlib
import os

import pytest
import yaml

from collabalign.commands import CONFIG_DIR, load_config
from collabalign.config import ConfigError, read_yaml
from collabalign.experiments import EXPERIMENTS

# experiment configs; the deployment configs under deploy/ are read by `collabalign deploy` (tests/test_jobs.py)
SHIPPED = sorted(p for p in CONFIG_DIR.rglob("*.yaml") if p.parent.name != "deploy")
QUICKSTART = CONFIG_DIR / "quickstart" / "quick.yaml"


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(CONFIG_DIR)) for p in SHIPPED])
def test_every_shipped_config_validates(path):
    name, module, cfg, _ = load_config(path)
    assert module.Config.model_validate(cfg.model_dump()) == cfg  # the dump is itself a valid config


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_every_default_config_validates(name):
    config = importlib.import_module(EXPERIMENTS[name]).Config
    assert config.model_validate({}) == config()


@pytest.mark.parametrize("path, override, field", [
    (QUICKSTART, "train.rounds=0", "train.rounds = 0"),
    (QUICKSTART, "train.rounds=-3", "train.rounds = -3"),
    (QUICKSTART, "train.lr=.nan", "train.lr = nan"),
    (QUICKSTART, "train.lr=.inf", "train.lr = inf"),
    (QUICKSTART, "train.lr=0", "train.lr = 0"),
    (QUICKSTART, "train.batch_size=0", "train.batch_size = 0"),
    (QUICKSTART, "seeds=[]", "seeds = []"),
    (QUICKSTART, "seeds=[-1]", "seeds.0 = -1"),
    (QUICKSTART, "model.targets=[]", "model.targets = []"),
    (QUICKSTART, "data.test_fraction=1.0", "data.test_fraction = 1.0"),
    (CONFIG_DIR / "fslora" / "quick.yaml", "federation.ratios=[0.5, 1.5]", "federation.ratios.1 = 1.5"),
    (CONFIG_DIR / "fslora" / "quick.yaml", "federation.momentum=1.0", "federation.momentum = 1.0"),
    (CONFIG_DIR / "firm" / "quick.yaml", "momdp.gamma=1.0", "momdp.gamma = 1.0"),
    (CONFIG_DIR / "firm" / "quick.yaml", "solver.objectives=[1, 2]", "solver.objectives.0 = 1"),
    (CONFIG_DIR / "pshare_lora" / "quick.yaml", "problem.rho=1.5", "problem.rho = 1.5"),
    (CONFIG_DIR / "pshare_lora" / "quick.yaml", "federated.fraction=0", "federated.fraction = 0"),
    (CONFIG_DIR / "affpcl" / "quick.yaml", "rl.td_gamma=-0.1", "rl.td_gamma = -0.1"),
    (CONFIG_DIR / "meta_reward" / "quick.yaml", "bandit.temperatures=[0.5, -1.0]", "bandit.temperatures.1 = -1.0"),
])
def test_a_bad_value_names_its_field(path, override, field):
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert field in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("value", ["nan", ".nan", ".inf", "-.inf", "1e400"])
def test_a_non_finite_float_in_a_config_file_names_its_field(tmp_path, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"experiment: quickstart\ntrain:\n  lr: {value}\n")
    with pytest.raises(ConfigError, match=r"train\.lr = .*: Input should be a finite number"):
        load_config(path)


@pytest.mark.parametrize("path, override, field", [
    (QUICKSTART, "seeds=[0, 1, 0]", "seeds = [0, 1, 0]"),
    (CONFIG_DIR / "fslora" / "quick.yaml", "seeds=[3, 3]", "seeds = [3, 3]"),
    (CONFIG_DIR / "pshare_lora" / "quick.yaml", "sweep.seeds=[1, 1]", "sweep.seeds = [1, 1]"),
    (CONFIG_DIR / "pshare_lora" / "quick.yaml", "text.seeds=[0, 0]", "text.seeds = [0, 0]"),
    (CONFIG_DIR / "pshare_lora" / "quick.yaml", "methods=[global, global]", "methods = ['global', 'global']"),
    (CONFIG_DIR / "firm" / "quick.yaml", "quadratic.betas=[0.0, 0.01, 0.01]", "quadratic.betas"),
    (CONFIG_DIR / "firm" / "quick.yaml", "lm.beta_sweep=[0.5, 0.5]", "lm.beta_sweep"),
    (CONFIG_DIR / "meta_reward" / "quick.yaml", "bandit.beta_grid=[1.0, 4.0, 1.0]", "bandit.beta_grid"),
    (CONFIG_DIR / "affpcl" / "quick.yaml", "reward.datasets=[synthetic, synthetic]", "reward.datasets"),
])
def test_a_repeated_seed_method_or_beta_names_its_field(path, override, field):
    with pytest.raises(ConfigError, match="repeated value") as err:
        load_config(path, [override])
    assert field in str(err.value)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="minibatch"):
        load_config(CONFIG_DIR / "firm" / "quick.yaml", ["toy.minibatch=32"])
    with pytest.raises(ConfigError, match="fixed_k"):
        load_config(CONFIG_DIR / "fslora" / "quick.yaml", ["ablations.fixed_k=16"])
    with pytest.raises(ConfigError, match="budget_task"):
        load_config(CONFIG_DIR / "fslora" / "quick.yaml", ["glue.tasks=[RTE]", "glue.budget_task=SST-2"])
    with pytest.raises(ConfigError, match="exceeds d1"):
        load_config(CONFIG_DIR / "pshare_lora" / "quick.yaml", ["problem.k=40"])


@pytest.mark.parametrize("content, message", [
    (bytes(range(256)), "not a UTF-8 text file"),
    (b"seeds: [0]\n\xff\xfe\n", "not a UTF-8 text file"),
    (b"\x00\x01\x02 binary", "not valid YAML"),
    (b"a: [1, 2\n", "not valid YAML: line 2"),
    (b"- a list\n", "top level must be a mapping"),
])
def test_a_config_file_that_is_not_yaml_text_names_the_file(tmp_path, content, message):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as err:
        read_yaml(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_a_directory_or_unreadable_config_file_names_the_file(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="a directory, not a config file"):
        read_yaml(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"seed": 0}))
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads anything: the refusal it would get, made by hand

        def refused(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr("collabalign.config.open", refused, raising=False)
    with pytest.raises(ConfigError, match=f"{path}: cannot read the config file \\(Permission denied\\)"):
        read_yaml(path)
