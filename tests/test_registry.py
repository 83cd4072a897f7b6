"""One registry of methods: every entry resolves to its entry point, config class and job, and the docs' table is
the registry's."""

import importlib
from pathlib import Path

import pytest

from collabalign.examples import write_examples
from collabalign.registry import FEDERATED, METHODS, methods_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_resolves_to_its_entry_point_config_and_job(name, tmp_path):
    method = METHODS[name]
    module = importlib.import_module(method.module)
    assert callable(getattr(module, method.train)) and hasattr(getattr(module, method.config), "model_fields")
    assert method.job is None or callable(getattr(module, method.job))
    assert set(method.node_settings.values()) <= set(getattr(module, method.config).model_fields)
    assert method.data in write_examples(tmp_path)


def test_federated_are_the_methods_with_a_job_and_each_has_a_deployment_config():
    assert set(FEDERATED) == {n for n, m in METHODS.items() if m.job}
    assert {p.stem for p in (ROOT / "src" / "collabalign" / "configs" / "deploy").glob("*.yaml")} == set(FEDERATED)


def test_the_architecture_docs_hold_the_registry_table():
    assert methods_table() in (ROOT / "docs" / "architecture.md").read_text(), (
        "docs/architecture.md's methods table differs from the registry; paste registry.methods_table():\n"
        + methods_table())
