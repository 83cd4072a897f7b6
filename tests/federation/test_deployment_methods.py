"""FSLoRA and FIRM on a real Flower deployment on the loopback (TLS, SuperNode authentication, a node worker and a
private-state folder per SuperNode, `flwr run .` of the project's app): the saved adapters equal, bit for bit, those of
the in-process simulator on the same job with the clients trained one after another (the same float32 arithmetic on
one thread). Each FSLoRA device's rank is the one its SuperNode declares in its node config, not the config's. A file
apart from test_deployment.py, so the two run side by side under pytest-xdist."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.cli import CONFIG_DIR
from collabalign.federation.deploy import LoopbackDeployment

pytestmark = pytest.mark.flower
if shutil.which("flower-superlink") is None:
    pytest.skip("flower-superlink is not on PATH (activate the project's virtual environment)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

DECLARED = {0: {"rank": 4}, 1: {"rank": 2}}  # the SuperNodes' node configs; the config says ranks [2, 4]
SMALL = {  # each method's deployment config on the tiny Llama, two clients
    "fslora": ["model=tiny-llama", "ranks=[2, 4]", "lora.rank=4", "rounds=2", "max_length=24"],
    "firm": ["model=tiny-llama", "clients=2", "rounds=1", "max_new_tokens=4", "lora.blocks=1"],
}


def saved_tensors(folder: Path) -> dict[str, np.ndarray]:
    return {f"{p.parent.name}/{p.name}/{k}": v for p in sorted(folder.glob("adapters/*/*.safetensors"))
            for k, v in load_file(str(p)).items()}


def test_fslora_and_firm_on_the_deployment_equal_the_simulator(tmp_path):
    with LoopbackDeployment(tmp_path, env={"OMP_NUM_THREADS": "1"}, state_dir=tmp_path / "state",
                            workers=True) as deployment:
        deployment.node_settings = DECLARED
        deployment.start(nodes=2)
        deployment.wait_status([0, 1], "online")
        for method, overrides in SMALL.items():
            config = CONFIG_DIR / "deploy" / f"{method}.yaml"
            run = deployment.run(ROOT, {"config": str(config), "overrides": "; ".join(overrides),
                                        "out": str(tmp_path / method)}, name=method)
            assert run.wait(timeout=600) == 0, deployment.log(method)
            simulated_as = overrides + (["ranks=[4, 2]"] if method == "fslora" else [])  # as the nodes declared
            job = jobs.build(jobs.read_spec(config, simulated_as))
            job.options = job.options.model_copy(update={"batched": False})  # one by one, as the nodes
            job.run().save(tmp_path / f"{method}-simulated")
            deployed, simulated = saved_tensors(tmp_path / method), saved_tensors(tmp_path / f"{method}-simulated")
            assert sorted(deployed) == sorted(simulated) and simulated, method
            for key, value in simulated.items():
                np.testing.assert_array_equal(deployed[key], value, err_msg=f"{method} {key}")
        assert json.loads((tmp_path / "fslora" / "manifest.json").read_text())["metrics"]["ranks"] == [4, 2]
