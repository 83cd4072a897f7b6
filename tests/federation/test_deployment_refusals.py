"""What a loopback SuperLink with TLS and SuperNode authentication refuses: a SuperNode whose key was never
registered, one that does not hold the CA certificate the SuperLink's certificate is signed by, and one that talks
plaintext. Each gives up after its retries, and the SuperLink never lists it online."""

import shutil
import time

import pytest

from collabalign.federation.deploy import CONNECTION, HOST, LoopbackDeployment, free_port, write_node_key

pytestmark = pytest.mark.flower
if shutil.which("flower-superlink") is None:
    pytest.skip("flower-superlink is not on PATH (activate the project's virtual environment)", allow_module_level=True)


def test_unregistered_keys_clients_without_the_ca_and_plaintext_clients_are_refused(tmp_path):
    with LoopbackDeployment(tmp_path, env={"OMP_NUM_THREADS": "1"}) as deployment:
        deployment.start(nodes=1)  # one registered node, for a SuperLink that does admit the right client
        deployment.wait_status([0], "online")
        stranger, _ = write_node_key(tmp_path / "keys", "stranger")  # never registered
        registered = {}
        for name in ("no-ca",):  # a registered key of its own: only TLS stands in its way
            registered[name], public = write_node_key(tmp_path / "keys", name)
            deployment.flwr("supernode", "register", str(public), CONNECTION)
        base = ["flower-supernode", "--superlink", f"{HOST}:{deployment.port}", "--max-retries", "2",
                "--max-wait-time", "20", "--node-config", "partition-id=0 num-partitions=1"]
        attempts = {
            "unregistered": [*base, "--root-certificates", str(deployment.ca), "--auth-supernode-private-key",
                             str(stranger), "--port", str(free_port())],
            "no-ca": [*base, "--auth-supernode-private-key", str(registered["no-ca"]), "--port", str(free_port())],
            "plaintext": [*base, "--insecure", "--port", str(free_port())],  # no TLS (and so no node key)
        }
        processes = {name: deployment._spawn(name, command) for name, command in attempts.items()}
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        outcome = {name: p.poll() for name, p in processes.items()}
        for p in processes.values():
            if p.poll() is None:
                p.kill()
        nodes = deployment.flwr("supernode", "ls", "loopback", "--format", "json")
    assert all(code not in (None, 0) for code in outcome.values()), outcome  # each gave up with an error
    logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace") for name in attempts}
    assert "Failed to activate SuperNode" in logs["unregistered"]  # reached the SuperLink, which refused its key
    assert "certificate verify failed" in logs["no-ca"]  # could not trust the SuperLink's certificate
    assert "Connection attempt failed" in logs["plaintext"] and "Failed to activate" not in logs["plaintext"]
    assert nodes.count('"online"') == 1  # only the registered node with the CA and TLS
