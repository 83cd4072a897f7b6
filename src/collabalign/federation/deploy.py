"""A Flower deployment on this machine's loopback, for the deployment test and the engine benchmark: a SuperLink
with TLS and SuperNode authentication, SuperNodes that sign in with their own keys, and `flwr run` of the project's
app (`collabalign.app`). Every process it starts is stopped, with everything it spawned, by process id.

How Flower 1.41 is set up here: the SuperLink serves its Fleet, Control and Runtime APIs over HTTPS on one port
(``flower-superlink --host H --port P --ssl-ca-certfile CA --ssl-certfile CERT --ssl-keyfile KEY``);
``--enable-supernode-auth`` admits only SuperNodes whose public key (EC on a NIST curve, OpenSSH format) was
registered through the Control API (``flwr supernode register KEY.pub CONNECTION``); a SuperNode checks the
SuperLink's certificate (``--root-certificates CA``) and signs every request with its private key
(``--auth-supernode-private-key KEY``); its partition comes with ``--node-config "partition-id=I num-partitions=N"``.
The `flwr` CLI finds the SuperLink through a named connection in ``$FLWR_HOME/config.toml`` (address and
root-certificates).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CONNECTION = "loopback"  # the SuperLink connection's name in $FLWR_HOME/config.toml
HOST = "127.0.0.1"


def flower_path(path: str) -> str:
    """`path` (a PATH) with the folder of this Python first, where pip installed Flower's CLIs with it; a
    RuntimeError when `flower-superlink` is not there (a deployment cannot start without it)."""
    path = str(Path(sys.executable).parent) + os.pathsep + path
    if shutil.which("flower-superlink", path=path) is None:
        raise RuntimeError(f"flower-superlink is not installed beside {sys.executable} (pip install "
                           "'flwr[simulation]')")
    return path


def free_port() -> int:
    """A TCP port on the loopback nobody listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def write_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA and a server certificate it signs for 127.0.0.1 and localhost: (ca.crt, server.pem,
    server.key)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "collabalign test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.crt", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    return paths


def write_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's EC key pair in OpenSSH format: (private key, public key)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    return private, public


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop(0))
        todo += children.get(tree[-1], [])
    return tree


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_tree(process: subprocess.Popen, sig: int = signal.SIGKILL, grace_s: float = 10) -> None:
    """Sends `sig` to `process` (started as a session leader), its process group and everything it spawned, by
    process and group id; what is still alive after `grace_s` gets SIGKILL."""
    tree = process_tree(process.pid)
    for s in (sig, signal.SIGKILL):
        for kill, target in [(os.killpg, process.pid), *((os.kill, pid) for pid in tree if _alive(pid))]:
            try:
                kill(target, s)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while process.poll() is None or any(map(_alive, tree)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return


class LoopbackDeployment:
    """A SuperLink and SuperNodes under `root` (certificates, keys, ``flwr-home``, logs); use as a context manager so
    every process is stopped, also when a test fails."""

    def __init__(self, root: Path, env: dict[str, str] | None = None, state_dir: Path | None = None,
                 workers: bool = False, isolation: Literal["subprocess", "process"] = "subprocess"):
        self.root, self.state_dir, self.workers, self.isolation = root, state_dir, workers, isolation
        self.env = {**os.environ, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", **(env or {}),
                    "FLWR_HOME": str(root / "flwr-home")}  # the app runs in this environment, as it is
        self.env["PATH"] = flower_path(self.env.get("PATH", ""))
        self.port = free_port()
        self.ca, self.cert, self.key = write_tls(root / "tls")
        self.link: subprocess.Popen | None = None
        self.nodes: dict[int, subprocess.Popen] = {}
        # partition -> what runs beside its SuperNode: its node worker (`workers`), its SuperExec (process isolation)
        self.beside: dict[int, list[subprocess.Popen]] = {}
        self.node_settings: dict[int, dict[str, int | float | str]] = {}  # partition -> what its node config declares
        self.socket_dir: Path | None = None  # the node workers' sockets
        self.keys: dict[int, Path] = {}
        self.node_ids: dict[int, str] = {}  # partition -> the SuperLink's node id (fixed by the node's key)

    def __enter__(self) -> LoopbackDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        with open(self.root / f"{name}.log", "ab") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
                                    start_new_session=True)

    def flwr(self, *args: str, timeout: float = 120) -> str:
        """A `flwr` CLI command against this SuperLink; its stdout (raises with the output if it fails)."""
        done = subprocess.run(["flwr", *args], env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def start(self, nodes: int, timeout: float = 60) -> None:
        """The SuperLink, then `nodes` registered SuperNodes with partition ids 0..nodes-1."""
        home = Path(self.env["FLWR_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
                                          f'address = "{HOST}:{self.port}"\nroot-certificates = "{self.ca}"\n')
        self.link = self._spawn("superlink", [
            "flower-superlink", "--host", HOST, "--port", str(self.port), "--ssl-ca-certfile", str(self.ca),
            "--ssl-certfile", str(self.cert), "--ssl-keyfile", str(self.key), "--enable-supernode-auth"])
        deadline = time.monotonic() + timeout
        while not self._listening():
            if self.link.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the SuperLink did not start; see {self.root / 'superlink.log'}")
            time.sleep(0.2)
        self.register(range(nodes))
        for i in range(nodes):
            self.start_node(i, nodes)

    def register(self, partitions: Iterable[int]) -> None:
        """A key for each of `partitions` not yet registered, registered with the SuperLink (the `flwr` CLI calls side
        by side: each spends seconds importing)."""
        new = [p for p in partitions if p not in self.keys]
        public = {}
        for p in new:
            self.keys[p], public[p] = write_node_key(self.root / "keys", f"node{p}")
        with ThreadPoolExecutor(max(1, len(new))) as pool:
            outs = pool.map(lambda p: self.flwr("supernode", "register", str(public[p]), CONNECTION, "--format",
                                                "json"), new)
            for p, out in zip(new, outs, strict=True):
                self.node_ids[p] = str(json.loads(out[out.index("{"):])["node-id"])

    def _listening(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex((HOST, self.port)) == 0

    def start_node(self, partition: int, partitions: int) -> None:
        """SuperNode `partition` (registered with the SuperLink the first time; a restart keeps its key, so it
        rejoins as the same node)."""
        self.register([partition])
        beside, port = self.beside.setdefault(partition, []), free_port()
        if self.workers:
            beside.append(self._spawn(f"worker{partition}", [
                sys.executable, "-m", "collabalign.cli", "node-worker", str(self.worker_socket(partition))]))
        self.nodes[partition] = self._spawn(f"supernode{partition}", [
            "flower-supernode", "--superlink", f"{HOST}:{self.port}", "--root-certificates", str(self.ca),
            "--auth-supernode-private-key", str(self.keys[partition]), "--port", str(port), "--isolation",
            self.isolation, "--node-config", self.node_config(partition, partitions)])
        if self.isolation == "process":  # the SuperNode's ClientApps are started by a SuperExec of its own
            beside.append(self._spawn(f"superexec{partition}", [
                "flower-superexec", "--runtime-api-address", f"{HOST}:{port}", "--insecure"]))

    def node_config(self, partition: int, partitions: int) -> str:
        """The SuperNode's node config: its partition and, with a `state_dir`, its own private-state folder."""
        config = f"partition-id={partition} num-partitions={partitions}"
        if self.state_dir is not None:
            config += f" state-dir={json.dumps(str(self.state_dir / f'node{partition}'))}"
        if self.workers:
            config += f" worker={json.dumps(str(self.worker_socket(partition)))}"
        for key, value in self.node_settings.get(partition, {}).items():
            config += f" {key}={json.dumps(value)}"
        return config

    def worker_socket(self, partition: int) -> Path:
        """The Unix socket node `partition`'s worker listens on, in a short temporary folder (a socket's path may have
        at most ~107 bytes, less than a deep run folder's)."""
        if self.socket_dir is None:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="collabalign-"))
        return self.socket_dir / f"{partition}.sock"

    def status(self) -> dict[int, str]:
        """Each registered SuperNode's status as the SuperLink sees it ('online', 'offline', ...), by partition."""
        out = self.flwr("supernode", "ls", CONNECTION, "--format", "json")
        by_id = {n["node-id"]: n["status"] for n in json.loads(out[out.index("{"):])["nodes"]}
        return {partition: by_id.get(node, "unknown") for partition, node in self.node_ids.items()}

    def wait_status(self, partitions: list[int], status: str, timeout: float = 150) -> None:
        """Until the SuperLink sees each of `partitions` with `status`."""
        deadline = time.monotonic() + timeout
        while any(s != status for p, s in self.status().items() if p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"SuperNodes {partitions} not {status} after {timeout:g} s; logs in {self.root}")
            time.sleep(1)

    def kill_node(self, partition: int) -> None:
        """SIGKILL SuperNode `partition` and its node worker, with everything they spawned (a crashed machine)."""
        kill_tree(self.nodes.pop(partition))
        for process in self.beside.pop(partition, []):
            kill_tree(process)

    def run(self, app: Path, run_config: dict[str, str | int | float], name: str = "run") -> subprocess.Popen:
        """`flwr run APP` with `run_config` (written as TOML), streaming its log to ``NAME.log`` until the run ends."""
        path = self.root / f"{name}.toml"
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in run_config.items()))
        return self._spawn(name, ["flwr", "run", str(app), CONNECTION, "--run-config", str(path), "--stream"])

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """Every SuperNode, then the SuperLink, each with everything it spawned."""
        for partition in list(self.nodes):
            kill_tree(self.nodes.pop(partition), signal.SIGTERM)
        for partition in list(self.beside):
            for process in self.beside.pop(partition):
                kill_tree(process, signal.SIGTERM)
        if self.link is not None:
            kill_tree(self.link, signal.SIGTERM)
            self.link = None
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
