import pytest
import torch

from collabalign.config import ConfigError, Strict, load
from collabalign.seeding import Seeds


def test_seeds_reproducible_and_independent():
    s = Seeds(7)
    assert s.numpy("data", 3).random() == Seeds(7).numpy("data", 3).random()
    assert s.numpy("data", 3).random() != s.numpy("data", 4).random()
    assert s.numpy("data").random() != s.numpy("init").random()
    assert s.numpy("data").random() != Seeds(8).numpy("data").random()
    assert torch.equal(torch.rand(3, generator=s.torch("x")), torch.rand(3, generator=Seeds(7).torch("x")))


class Inner(Strict):
    lr: float = 0.1
    steps: int = 3


class Outer(Strict):
    seed: int = 0
    train: Inner = Inner()


def test_yaml_and_dotted_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 3\ntrain:\n  lr: 0.5\n")
    cfg = load(Outer, p, ["train.steps=9", "seed=4"])
    assert cfg.seed == 4 and cfg.train.lr == 0.5 and cfg.train.steps == 9


@pytest.mark.parametrize(
    "override, needle",
    [("train.steps=abc", "train.steps = 'abc'"), ("train.nope=1", "train.nope = 1"), ("seed", "key.path=value"),
     ("seed.x=1", "'seed' is a value")],
)
def test_bad_overrides_name_key_and_value(tmp_path, override, needle):
    p = tmp_path / "c.yaml"
    p.write_text("seed: 3\n")
    with pytest.raises(ConfigError) as err:
        load(Outer, p, [override])
    assert needle in str(err.value)


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load(Outer, p)
    with pytest.raises(ConfigError, match="no such config"):
        load(Outer, tmp_path / "missing.yaml")
