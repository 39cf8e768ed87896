"""`LocalCluster`: a SuperLink and N SuperNodes on loopback, for trying a deployment on one machine (and for the
tests). Every daemon binds 127.0.0.1 only, is started with its own log file, and is stopped by PID. With `auth`, the
SuperLink accepts only SuperNodes whose public keys were registered (Flower's `--enable-supernode-auth`): the
cluster makes each node a key pair and registers it with `flwr supernode register` before the node starts. With
`database`, the SuperLink keeps its state in that SQLite file, so a SuperLink killed and started again knows its runs
and nodes. Nodes in `late` are not started with the cluster (`start_node` starts them later); any node, and the
SuperLink, can be killed and started again (fault drills, `drill.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from manytask.engine.flower.credentials import NodeKey, TLSFiles, write_node_key
from manytask.errors import ManytaskError
from manytask.extras import missing_extra

QUIET_FLOWER = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
HOST = "127.0.0.1"
REGISTERED = "SuperNode ID:"  # what a SuperNode logs once the SuperLink has given it its node ID
CONNECTION = "local-cluster"  # the cluster's entry in its own FLWR_HOME, for `flwr supernode register`


def flower_env(flwr_home: Path) -> dict[str, str]:
    """Environment for Flower's commands: quiet, offline, this interpreter's bin first on PATH (Flower starts
    its child processes by bare command name) and a private FLWR_HOME."""
    bin_dir = str(Path(sys.executable).parent)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, **QUIET_FLOWER, "PATH": path, "FLWR_HOME": str(flwr_home)}


def flower_command(name: str) -> str:
    """Path of one of Flower's console scripts next to this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        raise missing_extra(f"'{name}'", "flwr")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, process: subprocess.Popen, log: Path) -> None:
    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex((HOST, port)) == 0

    _wait_at_start(listening, timeout, process, log, f"nothing listened on {HOST}:{port}")


def wait_for_log_line(text: str, timeout: float, process: subprocess.Popen, log: Path) -> None:
    """Until a daemon's log has a line with `text` (it reads the log from the start each time: logs here are
    a few lines long when this is called)."""
    _wait_at_start(lambda: text in log.read_text(errors="replace"), timeout, process, log, f"no '{text}' in its log")


def _wait_at_start(ready: Callable[[], bool], timeout: float, process: subprocess.Popen, log: Path,
                   missing: str) -> None:
    """Poll `ready` until it holds; a ManytaskError naming `log` if the daemon exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ManytaskError(f"a Flower daemon exited at start (code {process.returncode}); see {log}.")
        if ready():
            return
        time.sleep(0.1)
    raise ManytaskError(f"{missing} within {timeout:.0f} s; see {log}.")


class LocalCluster:
    def __init__(self, nodes: int, workdir: Path, tls: TLSFiles | None = None, port: int | None = None,
                 data_paths: list[Path | None] | None = None, auth: bool = False,
                 state_root: Path | None = None, database: Path | None = None, late: Collection[int] = ()) -> None:
        if nodes < 1:
            raise ManytaskError(f"a cluster needs at least one SuperNode, got {nodes}.")
        if auth and tls is None:
            raise ManytaskError("SuperNode authentication needs TLS (Flower requires it): give the cluster its TLS "
                                "files (local-cluster --tls-dir, or --auth alone to have loopback ones made).")
        if data_paths is not None and len(data_paths) != nodes:
            raise ManytaskError(f"{len(data_paths)} data paths for {nodes} SuperNodes; give one per node.")
        if not set(late) <= set(range(nodes)):
            raise ManytaskError(f"late SuperNode(s) {sorted(set(late) - set(range(nodes)))} are not among the "
                                f"{nodes} nodes 0-{nodes - 1}.")
        self.nodes = nodes
        self.data_paths = data_paths or [None] * nodes  # each node's `data-path` (exported partitions), or none
        self.workdir = Path(workdir)
        self.tls = tls
        self.port = port or free_port()
        self.auth = auth
        self.state_root = state_root  # SuperNode k saves its client states in state_root/supernode-k
        self.database = database  # the SuperLink's SQLite state (None: in memory, lost with the process)
        self.late = set(late)  # nodes the cluster does not start with itself
        self.keys: list[NodeKey] = []  # with auth: each SuperNode's key pair, registered before it starts
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen | None] = [None] * nodes  # node k's current process (None: not started)
        self.others: list[subprocess.Popen] = []  # SuperNodes started beside the cluster's own (`start_extra_node`)
        self.retired: list[subprocess.Popen] = []  # killed processes of nodes started again since
        self.reported: set[int] = set()  # SuperNodes whose exit `dead_nodes` has already returned
        self.starts: dict[str, int] = {}  # how often each daemon was started: its later starts log to NAME.K.log
        self.logs: dict[int, Path] = {}  # pid -> the daemon's log

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return flower_env(self.workdir / "flwr_home")

    def start(self, timeout: float = 60.0) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_superlink(timeout)
        if self.auth:
            self.keys = [self.register(write_node_key(self.workdir / "keys", f"supernode{i}"))
                         for i in range(self.nodes)]
        self.start_node(*sorted(set(range(self.nodes)) - self.late), timeout=timeout)
        return self

    def start_superlink(self, timeout: float = 60.0) -> None:
        """Start the SuperLink (again, after `kill_superlink`: on the same port and database)."""
        link_security = (
            ["--insecure"] if self.tls is None else
            ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
             "--ssl-keyfile", str(self.tls.server_key)]
        )
        database = [] if self.database is None else ["--database", str(Path(self.database).resolve())]
        self.superlink = self._spawn(
            "superlink", [flower_command("flower-superlink"), *link_security, "--host", HOST, "--port",
                          str(self.port), "--disable-runtime-dependency-installation", *database,
                          *(["--enable-supernode-auth"] if self.auth else [])],
        )
        wait_for_port(self.port, timeout, self.superlink, self.log_of(self.superlink))

    def kill_superlink(self) -> None:
        """SIGKILL the SuperLink and what it started (its ServerApp): a crashed SuperLink machine."""
        assert self.superlink is not None
        _signal_group(self.superlink, signal.SIGKILL)
        self.superlink.wait(timeout=30)
        self.retired.append(self.superlink)

    def start_node(self, *indices: int, timeout: float = 60.0) -> None:
        """Start SuperNodes (a late one, or one killed before: same partition, data and state folder) and wait
        until each has registered with the SuperLink."""
        ports = {index: free_port() for index in indices}
        for index, port in ports.items():
            previous = self.supernodes[index]
            if previous is not None:
                if previous.poll() is None:
                    raise ManytaskError(f"SuperNode {index} is running; kill it before starting it again.")
                self.retired.append(previous)
            self.supernodes[index] = self._spawn_node(f"supernode{index}", port, index,
                                                      self.keys[index] if self.auth else None)
            self.reported.discard(index)
        started = [(index, self._node(index)) for index in ports]
        for index, process in started:
            wait_for_port(ports[index], timeout, process, self.log_of(process))
        for _, process in started:
            # logged once the node has registered with the SuperLink, after it started its flower-superexec:
            # from here a run sees every node, and every node's process group is complete
            wait_for_log_line(REGISTERED, timeout, process, self.log_of(process))

    def register(self, key: NodeKey, timeout: float = 120.0) -> NodeKey:
        """Register a SuperNode's public key with the SuperLink (`flwr supernode register`, over the cluster's own
        connection entry); the key, for the node to start with."""
        assert self.tls is not None  # `auth` needs TLS (checked at construction)
        home = self.workdir / "flwr_home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = {json.dumps(self.address)}\n'
            f"root-certificates = {json.dumps(str(Path(self.tls.ca_cert).resolve()))}\n")
        done = subprocess.run([flower_command("flwr"), "supernode", "register", str(key.public), CONNECTION],
                              env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise ManytaskError(f"registering {key.public} with the SuperLink failed: "
                                f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}")
        return key

    def start_extra_node(self, name: str, partition: int, key: NodeKey | None) -> subprocess.Popen:
        """One more SuperNode serving `partition`, signing with `key` (registered or not: an unregistered one is
        refused by an authenticating SuperLink and exits); its process, logged to `name`.log."""
        process = self._spawn_node(name, free_port(), partition, key)
        self.others.append(process)
        return process

    def _spawn_node(self, name: str, port: int, partition: int, key: NodeKey | None) -> subprocess.Popen:
        security = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls.ca_cert)]
        signing = [] if key is None else ["--auth-supernode-private-key", str(key.private)]
        return self._spawn(name, [
            flower_command("flower-supernode"), *security, *signing, "--superlink", self.address, "--host", HOST,
            "--port", str(port), "--node-config", self.node_config(partition),
        ])

    def node_config(self, index: int) -> str:
        """Flower's `--node-config` of SuperNode `index`: its partition, its own data folder when it has one, and
        the folder it saves its client states in when the cluster has a `state_root`."""
        config = f"partition-id={index} num-partitions={self.nodes}"
        path = self.data_paths[index]
        if path is not None:
            config += f" data-path={json.dumps(str(Path(path).resolve()))}"
        if self.state_root is not None:
            config += f" state-path={json.dumps(str((Path(self.state_root) / f'supernode-{index}').resolve()))}"
        return config

    def kill_node(self, index: int) -> None:
        """SIGKILL one SuperNode and its children (a crashed machine), for failure tests."""
        process = self._node(index)
        _signal_group(process, signal.SIGKILL)
        process.wait(timeout=30)

    def dead_nodes(self) -> list[int]:
        """SuperNodes that exited since the last call, each returned once. Each one's process group is killed: a
        SuperNode that dies alone leaves its children (flower-superexec, flwr-clientapp) running otherwise."""
        dead = [i for i, p in enumerate(self.supernodes)
                if p is not None and i not in self.reported and p.poll() is not None]
        for index in dead:
            _signal_group(self._node(index), signal.SIGKILL)
        self.reported.update(dead)
        return dead

    def describe_exit(self, index: int) -> str:
        """One line on a SuperNode that exited: which, its exit code (negative: the signal) and where its log is."""
        process = self._node(index)
        return (f"SuperNode {index} (pid {process.pid}) exited with code {process.returncode}; "
                f"its log: {self.log_of(process)}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every daemon we started, and its process group, then wait; SIGKILL what lingers."""
        daemons = [p for p in [*self.supernodes, *self.others, *self.retired, self.superlink] if p is not None]
        for process in daemons:
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in daemons:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=10)
            _signal_group(process, signal.SIGKILL)  # children (superexec, apps) outliving their parent

    def pids(self) -> list[int]:
        return [p.pid for p in [self.superlink, *self.supernodes, *self.others] if p is not None]

    def log_of(self, process: subprocess.Popen) -> Path:
        return self.logs[process.pid]

    def _node(self, index: int) -> subprocess.Popen:
        process = self.supernodes[index]
        if process is None:
            raise ManytaskError(f"SuperNode {index} has not been started.")
        return process

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.stop()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not orphan the daemons
        try:
            self.stop()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        """Start a daemon in its own session, logging to NAME.log (NAME.K.log when started for the K-th time)."""
        count = self.starts[name] = self.starts.get(name, 0) + 1
        path = self.workdir / (f"{name}.log" if count == 1 else f"{name}.{count}.log")
        with path.open("wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir, start_new_session=True
            )
        self.logs[process.pid] = path
        return process


def _signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
