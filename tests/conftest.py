"""Suite-wide: the test files run longest first, so that under pytest-xdist (`make test` runs `-n 3 --dist loadfile
--no-loadscope-reorder`, which keeps this order) the short ones fill in at the end instead of one long file holding
the run open. The Flower deployments come first (two loopback deployments for the whole file: about 3 minutes, in which
Flower's and the app's processes, mostly started for one message each, take most of a core); the files on Flower's
simulation engine (Ray), which also wait more than they compute, come where they follow it on its worker or run
beside two busy ones; the rest by CPU seconds, most first (measured per file as every test's own and its child
processes' CPU time). `make test` runs three workers on two cores: the others take what the waiting leaves idle."""

SLOW_FIRST = ("federation/test_deployment.py", "experiments/test_fslora_glue.py", "models/test_text_reward.py",
              "federation/test_flower.py", "methods/test_fed_tune.py", "experiments/test_affpcl.py", "test_fuzz.py",
              "test_readme.py", "experiments/pshare_lora/test_run.py", "experiments/test_quickstart.py",
              "methods/pshare_lora/test_federated.py", "experiments/test_firm_lm.py",
              "experiments/test_firm_synthetic.py", "experiments/test_fed_tune.py", "test_durable_runs.py",
              "test_fuzz_commands.py", "test_fuzz_cli.py", "test_bad_input.py", "test_cli_hostile.py",
              "methods/fslora/test_glue.py", "experiments/test_meta_reward_sentiment.py", "entry/test_cli_train.py",
              "policy/test_ppo.py", "test_demo.py", "entry/test_fslora.py", "entry/test_firm.py",
              "policy/test_steps.py")


def pytest_collection_modifyitems(session, config, items):
    """Stable reorder: items of the SLOW_FIRST files (in that order) first, the rest as collected."""
    def rank(item) -> int:
        path = item.nodeid.split("::")[0].removeprefix("tests/")
        return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)
