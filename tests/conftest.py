"""Suite-wide: the slowest test files are collected first, so that under pytest-xdist (`make test` runs
`-n 3 --dist loadfile --no-loadscope-reorder`, which keeps this order) they start at once instead of holding
the run open at its end. The first two, the Flower deployments, use about 0.7 of a core each while they run (much of
their time goes to starting Flower's and the app's processes), so `make test` runs three workers on two cores: the
third takes what the deployments leave idle (on idle cores the suite took 877 s on three workers, 895 s on two)."""

SLOW_FIRST = ("federation/test_deployment_methods.py", "federation/test_deployment_pshare.py",
              "experiments/test_fslora_glue.py", "federation/test_deployment.py", "models/test_text_reward.py",
              "federation/test_flower.py", "experiments/pshare_lora/test_run.py", "test_fuzz_cli.py",
              "methods/pshare_lora/test_federated.py", "test_demo.py")


def pytest_collection_modifyitems(session, config, items):
    """Stable reorder: items of the SLOW_FIRST files (in that order) first, the rest as collected."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)
