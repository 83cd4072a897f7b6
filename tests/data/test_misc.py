import importlib.util
from pathlib import Path

import numpy as np
import pytest

from collabalign.config import ConfigError
from collabalign.data import SYNTHETIC_TOPICS, glue_from_hub, hh_rlhf_from_hub, shared_data_dir, tiny_preferences
from collabalign.data.synthetic import _POLITE, _RUDE
from collabalign.data.tldr import tldr_comparisons_from_hub


def test_tiny_preferences_deterministic_and_only_tone_differs():
    pairs = tiny_preferences(40, np.random.default_rng(0))
    assert pairs.pairs == tiny_preferences(40, np.random.default_rng(0)).pairs and len(pairs) == 40
    assert {p.attributes["topic"] for p in pairs} <= set(SYNTHETIC_TOPICS)
    for p in pairs:
        polite = next(o for o in _POLITE if p.chosen.startswith(o))
        rude = next(o for o in _RUDE if p.rejected.startswith(o))
        assert p.chosen.removeprefix(polite) == p.rejected.removeprefix(rude)
    with pytest.raises(ValueError):
        tiny_preferences(0, np.random.default_rng(0))


def test_shared_data_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"\$COLLABALIGN_DATA = '.*absent': not an existing directory"):
        shared_data_dir()
    monkeypatch.delenv("COLLABALIGN_DATA")
    project_root = Path(__file__).resolve().parents[2]
    assert (project_root / "pyproject.toml").is_file()
    beside = project_root.parent / "shared" / "data"
    assert shared_data_dir() == (beside if beside.is_dir() else None)


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="`datasets` is installed")
@pytest.mark.parametrize("call", [lambda: hh_rlhf_from_hub(), lambda: glue_from_hub("RTE"), tldr_comparisons_from_hub])
def test_hub_loaders_explain_missing_datasets(call):
    with pytest.raises(ImportError, match="pip install datasets"):
        call()
