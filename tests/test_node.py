"""The node side of a deployment (node.py) without Flower's processes: a node worker answers a message with the same
bytes the ClientApp's own process would, refuses a node config that does not fit the job in one line, and a ClientApp
whose worker is gone fails that message with the reason."""

import threading

import pytest

from collabalign import jobs, node
from collabalign.commands import CONFIG_DIR
from collabalign.config import ConfigError
from collabalign.seeding import Seeds

RUN = {"config": str(CONFIG_DIR / "deploy" / "fslora.yaml"),
       "overrides": "model=tiny-llama; ranks=[2, 4]; lora.rank=4; max_length=24"}
NODE = {"partition-id": 1, "num-partitions": 2}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "n.sock"
    threading.Thread(target=node.serve, args=(path,), daemon=True).start()
    for _ in range(200):
        if path.exists():
            break
        threading.Event().wait(0.05)
    return path


def train_message() -> bytes:
    job = jobs.build(jobs.spec_of(RUN))
    cid = list(job.clients)[1]
    return job.algorithm.configure(job.algorithm.init(Seeds(0)), 1, [cid])[cid].serialise()


def test_the_worker_answers_as_the_clientapp_process_would(worker):
    payload = train_message()
    assert node.ask(worker, "query", RUN, NODE, 0, b"", b"")[0] == node.handle("query", RUN, NODE, 0, b"", b"")[0]
    here = node.handle("train", RUN, NODE, 1, payload, b"")
    there = node.ask(worker, "train", RUN, NODE, 1, payload, b"")
    assert there == here and len(here[0]) > 0


def test_a_node_config_that_does_not_fit_the_job_is_one_line(worker):
    bad = {"partition-id": 0, "num-partitions": 3}
    with pytest.raises(ConfigError, match="num-partitions=3: the job has 2 clients"):
        node.handle("query", RUN, bad, 0, b"", b"")
    with pytest.raises(node.NodeError, match="ConfigError: node config partition-id=0 num-partitions=3"):
        node.ask(worker, "query", RUN, bad, 0, b"", b"")


def test_a_missing_worker_is_a_clear_error(tmp_path):
    with pytest.raises(node.NodeError, match="no node worker at"):
        node.ask(tmp_path / "none.sock", "query", RUN, NODE, 0, b"", b"")
