"""Suite-wide: the slowest test files are collected first, so that under pytest-xdist (`make test` runs
`-n 3 --dist loadfile --no-loadscope-reorder`, which keeps this order) they start at once instead of holding the run
open at its end. The first, the Flower deployments (two loopback deployments for the whole file), runs about 4
minutes using about half a core (much of its time goes to starting Flower's and the app's processes and waiting on
them), so `make test` runs three workers on two cores: the other two take what it leaves idle."""

SLOW_FIRST = ("federation/test_deployment.py", "experiments/test_fslora_glue.py", "models/test_text_reward.py",
              "test_readme.py", "federation/test_flower.py", "experiments/pshare_lora/test_run.py", "test_fuzz_cli.py",
              "test_fuzz_commands.py", "methods/pshare_lora/test_federated.py", "test_demo.py")


def pytest_collection_modifyitems(session, config, items):
    """Stable reorder: items of the SLOW_FIRST files (in that order) first, the rest as collected."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)
