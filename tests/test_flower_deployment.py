"""Real Flower deployments on loopback: a SuperLink and SuperNodes as separate processes, runs submitted with
`flwr run`. Same numbers as the local engine, TLS and SuperNode authentication, no listener beyond loopback, exact
resume after every daemon's restart and after the SuperLink's death mid-round, and `local-cluster` noticing a dead
SuperNode. Killed nodes in a running deployment: tests/test_flower_churn.py. The transport's handling of lost nodes
is also checked against a fake Grid (fast), where a node can die in the middle of a run at an exact round."""

import json
import os
import select
import signal
import subprocess
import sys
from itertools import pairwise

import pytest
import torch

from manytask.config import validate
from manytask.errors import ManytaskError
from manytask.launch import resume, run_config
from manytask.rundir import RunDir
from tests.conftest import small_config_dict
from tests.flower_support import FakeGrid, listeners_of

pytest.importorskip("flwr")
from flwr.supercore.task_identity import TaskIdentity

from manytask.engine.flower import transport as transport_module
from manytask.engine.flower.cluster import LocalCluster, flower_env
from manytask.engine.flower.credentials import write_loopback_certificates, write_node_key
from manytask.engine.flower.deployment import flwr_cli, json_in, run_drill
from manytask.engine.flower.drill import Drill
from manytask.engine.flower.transport import GridTransport

# -ww: ps otherwise cuts `args` at $COLUMNS where that is set (a CI runner may set it)
PS_CHILDREN = ["ps", "-ww", "-o", "pid=,args=", "--ppid"]
THREE_CLIENTS = {"num_clients": 3, "tasks": {"kind": "dirichlet", "zeta": 1.0}, "samples": {"kind": "iid"}}


def _deployed(cluster, tmp_path, **overrides):
    flower = {"superlink": cluster.address, "round_timeout": 120, **overrides.pop("flower", {})}
    return small_config_dict(federation=THREE_CLIENTS, engine="flower", flower=flower, eval_every=2, **overrides)


def _assert_loopback_only(cluster):
    addresses = listeners_of(cluster.pids())
    assert len(addresses) >= 1 + cluster.nodes, addresses  # the SuperLink and each SuperNode listen
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


@pytest.mark.slow
def test_local_cluster_command_reports_a_dead_supernode_and_reaps_its_children(tmp_path):
    """The SuperNode's own process dies alone (its flower-superexec child lives on): the command says so once and
    kills what the node left behind, and keeps the cluster up until told to stop."""
    command = [sys.executable, "-m", "manytask.cli", "flower", "local-cluster", "--nodes", "1",
               "--workdir", str(tmp_path / "cluster")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as cli:
        try:
            started = _read_until(cli, "Ctrl-C stops the cluster")
            node = _supernode_pid(cli.pid)
            left_behind = [pid for pid in _group(node) if pid != node]  # flower-superexec: the cluster is up
            assert left_behind, "the SuperNode's flower-superexec was not running when the cluster said it was up"
            watched = [os.pidfd_open(pid) for pid in left_behind]
            os.kill(node, signal.SIGKILL)
            line = _read_until(cli, "the run goes on without it")[-1]
            assert f"SuperNode 0 (pid {node}) exited with code -9; its log: " in line, line
            assert "supernode0.log" in line
            for fd in watched:  # readable once the process has ended; the bound only ends a failing test
                assert select.select([fd], [], [], 120)[0] == [fd], "a process the dead SuperNode left runs on"
                os.close(fd)
        finally:
            cli.send_signal(signal.SIGTERM)
            rest = cli.communicate(timeout=60)[0]
    assert "SuperLink on 127.0.0.1:" in "".join(started) and "cluster stopped." in rest
    assert "exited with code" not in rest  # said once


def _read_until(process: subprocess.Popen, text: str) -> list[str]:
    """Lines of the process's output up to the first that contains `text` (fails at EOF)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no line with {text!r} in: {''.join(lines)}")


def _supernode_pid(parent: int) -> int:
    out = subprocess.run([*PS_CHILDREN, str(parent)], capture_output=True, text=True).stdout
    return next(int(line.split()[0]) for line in out.splitlines() if "flower-supernode" in line)


def _group(pgid: int) -> list[int]:
    """PIDs of the members of one process group."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid="], capture_output=True, text=True).stdout
    return [int(pid) for pid, group in (line.split() for line in out.splitlines()) if int(group) == pgid]


@pytest.mark.slow
def test_a_tls_cluster_admits_only_registered_nodes_listens_on_loopback_and_matches_the_local_engine(tmp_path):
    """TLS and `auth`: the cluster makes and registers its nodes' keys; a node signing with an unregistered key
    (claiming client 0's partition) is refused and exits. FedAvg and FedProx then run on the registered nodes with
    the local engine's metrics and bytes; nothing listens beyond loopback, and the SuperLink runs without
    `--insecure`."""
    methods = ["fedavg", {"name": "fedprox", "mu": 0.1}]
    tls = write_loopback_certificates(tmp_path / "certs")
    local = run_config(validate(small_config_dict(federation=THREE_CLIENTS, method=methods, rounds=2, eval_every=2,
                                                  execution="sequential")), tmp_path / "local")
    with LocalCluster(3, tmp_path / "cluster", tls=tls, auth=True) as cluster:
        _assert_loopback_only(cluster)
        rogue = cluster.start_extra_node("rogue", 0, write_node_key(tmp_path / "rogue", "rogue"))
        assert rogue.wait(timeout=120) != 0
        config = _deployed(cluster, tmp_path, method=methods, rounds=2,
                           flower={"root_certificates": str(tls.ca_cert)})
        deployed = run_config(validate(config), tmp_path / "flower")
        _assert_loopback_only(cluster)
        assert "--enable-supernode-auth" in cluster.superlink.args
    assert "Failed to activate SuperNode" in (tmp_path / "cluster" / "rogue.log").read_text()
    assert "insecure" not in (tmp_path / "cluster" / "superlink.log").read_text().lower()
    for label in ("fedavg", "fedprox"):
        for key in ("tasks", "bytes_up", "bytes_down", "failed_clients"):
            assert deployed[label][key] == local[label][key], (label, key)
    assert sorted(p.name for p in (tmp_path / "cluster" / "keys").iterdir()) == [
        f"supernode{i}{suffix}" for i in range(3) for suffix in ("", ".pub")]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["feddyn", "sfmtl-graph"])
def test_a_deployed_run_resumes_exactly_after_every_supernode_and_the_superlink_restart(tmp_path, method):
    """Nodes that save their client states (`state-path`): a run stopped after round 2 (`stop_after`, between
    rounds), its SuperLink and every SuperNode stopped and started anew on the same folders, then resumed (a new
    Flower run, fresh `context.state`), gives the uninterrupted run's metrics and bytes (the local engine's, which
    an uninterrupted deployment gives: the FedAvg and FedProx test above)."""
    from tests.test_sfmtl import PERSONAL

    four = {"benchmark": {**PERSONAL["benchmark"], "num_clients": 4},  # SFMTL-Graph's rotated-masked clients
            "federation": {**PERSONAL["federation"], "num_clients": 4}, "model": PERSONAL["model"]}
    setting = {"federation": THREE_CLIENTS} if method == "feddyn" else four
    nodes = setting["federation"]["num_clients"]
    config = small_config_dict(**{**setting, "method": method, "rounds": 3, "eval_every": 2})
    full = run_config(validate({**config, "execution": "sequential"}), tmp_path / "full")[method]
    states = tmp_path / "states"
    with LocalCluster(nodes, tmp_path / "first", state_root=states) as cluster:
        port = cluster.port
        config.update(engine="flower", flower={"superlink": cluster.address, "round_timeout": 120})
        assert run_config(validate(config), tmp_path / "cut", stop_after=2) is None
    saved = sorted(p.relative_to(states).parts[0] for p in states.glob("*/*/*/round-*.mtk"))
    assert len(saved) > 0 and all(name.startswith("supernode-") for name in saved)
    with LocalCluster(nodes, tmp_path / "second", port=port, state_root=states):  # every daemon new
        resumed = resume(tmp_path / "cut")[method]
    for key in ("tasks", "bytes_up", "bytes_down", "failed_clients"):
        assert resumed[key] == full[key], key
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3] and all(not r["failures"] for r in rows)


@pytest.mark.slow
def test_a_run_whose_superlink_was_killed_mid_round_resumes_exactly_on_the_restarted_superlink(tmp_path):
    """A drill holds FedDyn's round 3 once its training messages are on the SuperLink (before any reply is read);
    its action SIGKILLs the SuperLink with its ServerApp. The SuperLink is started again on the same port and SQLite
    database (the SuperNodes reconnect on their own), the run is resumed: the uninterrupted run's metrics and
    bytes. The database kept the killed run: the restarted SuperLink lists both runs."""
    config = small_config_dict(federation=THREE_CLIENTS, method="feddyn", rounds=3, eval_every=2)
    full = run_config(validate({**config, "execution": "sequential"}), tmp_path / "full")["feddyn"]
    with LocalCluster(3, tmp_path / "cluster", state_root=tmp_path / "states",
                      database=tmp_path / "superlink.db") as cluster:
        config.update(engine="flower", flower={"superlink": cluster.address, "round_timeout": 120})

        def kill_the_superlink() -> bool:
            cluster.kill_superlink()
            return False  # the run stays held: its SuperLink is gone

        drill = Drill({"mid-3": kill_the_superlink})
        assert run_drill(validate(config), tmp_path / "cut", drill) is None and drill.done == ["mid-3"]
        run_dir = RunDir(tmp_path / "cut")
        assert [row["round"] for row in run_dir.read_metrics()] == [1, 2]
        cluster.start_superlink()
        resumed = resume(tmp_path / "cut")["feddyn"]
        runs = json_in(flwr_cli(["ls", "manytask", "--format", "json"], flower_env(tmp_path / "cut/flower/home")))
    for key in ("tasks", "bytes_up", "bytes_down", "failed_clients"):
        assert resumed[key] == full[key], key
    assert [row["round"] for row in run_dir.read_metrics()] == [1, 2, 3]
    assert all(not row["failures"] for row in run_dir.read_metrics())
    assert len(runs["runs"]) == 2 and (tmp_path / "cluster" / "superlink.2.log").is_file()


def test_a_node_without_the_state_the_server_names_says_what_it_holds(tmp_path):
    from manytask.engine.flower.node_states import NodeStates

    saved = NodeStates(tmp_path, "run-a", 1)
    saved.save(1, {"w": torch.ones(2)}, keep_from=0)
    saved.save(2, {"w": torch.full((2,), 2.0)}, keep_from=0)
    saved.save(3, {"w": torch.full((2,), 3.0)}, keep_from=2)  # the server's checkpoint may name round 2 or later
    assert saved.rounds() == [2, 3] and torch.equal(saved.load(2)["w"], torch.full((2,), 2.0))
    assert saved.load(0) == {}
    with pytest.raises(ValueError, match=r"no saved state of round 1 .* it holds rounds \[2, 3\] of this run"):
        saved.load(1)
    with pytest.raises(ValueError, match=r"holds states of other runs only \(run-a\)"):
        NodeStates(tmp_path, "run-b", 1).load(3)
    (saved.folder / "round-3.mtk").rename(saved.folder / "round-4.mtk")  # a file under another round's name
    with pytest.raises(ValueError, match="is tagged"):
        saved.load(4)


def test_authentication_without_tls_is_refused_in_one_sentence(tmp_path):
    with pytest.raises(ManytaskError, match="needs TLS"):
        LocalCluster(2, tmp_path, auth=True)


# -- the transport against a fake Grid: a node dies (or comes back) at an exact point of a run ------------------------

FAKE_TIMEOUT = 0.5


@pytest.fixture
def grid(monkeypatch):
    """A FakeGrid of nodes 10, 11, 12 serving clients 0, 1, 2, in a process set up as a ServerApp's is."""
    monkeypatch.setattr(transport_module, "PULL_INTERVAL", 0.01)
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    return FakeGrid({10: 0, 11: 1, 12: 2})


def _transport(grid):
    return GridTransport(grid, 3, "config", round_timeout=FAKE_TIMEOUT, connect_timeout=5)


def _fake_round(transport, index):
    """One fit round to all three clients: (failures, whether it waited). A round that waits for nobody collects
    every reply with one pull; one that waits polls again until its deadline. Counted, not timed."""
    pulls = transport.grid.pulls
    outcome = transport.fit(index, {0: b"x", 1: b"x", 2: b"x"}, set())
    assert set(outcome.replies) | set(outcome.failures) == {0, 1, 2}
    return outcome.failures, transport.grid.pulls - pulls > 1


def test_a_node_silent_in_one_round_is_lost_and_not_waited_for_again(grid):
    transport = _transport(grid)
    assert _fake_round(transport, 0)[0] == {}
    grid.state[12] = "dead"  # killed during round 2, still listed by the SuperLink
    failures, waited = _fake_round(transport, 1)
    assert failures == {2: "no reply within 0.5 s"} and waited
    for index in (2, 3, 4):
        failures, waited = _fake_round(transport, index)
        assert failures == {2: "its SuperNode gave no reply in round 2 within 0.5 s; not waited for since"}
        assert not waited
    assert grid.sent_to(12, "train") == 2  # rounds 1 and 2 only
    assert grid.sent_to(12, "query") == 2  # the handshake and one probe, still pending: no pile-up
    assert transport.evaluate({0: b"x", 2: b"x"}).keys() == {0}


def test_a_lost_node_that_answers_its_probe_is_back_for_the_next_round(grid):
    transport = _transport(grid)
    grid.state[12] = "dead"
    _fake_round(transport, 0)
    grid.state[12] = "up"  # it was only slow, or its network came back
    failures, waited = _fake_round(transport, 1)  # its probe is answered on the way, the round does not wait
    assert set(failures) == {2} and not waited and transport.lost == {}
    assert _fake_round(transport, 2)[0] == {}


def test_an_offline_node_is_lost_at_once_and_a_restarted_one_takes_over_its_client(grid):
    transport = _transport(grid)
    grid.state[12] = "offline"  # heartbeats expired: the SuperLink answers for it at once
    failures, waited = _fake_round(transport, 0)
    assert failures[2].startswith("error 5") and not waited
    assert transport.lost[2] == ("its SuperNode went offline in round 1 (the SuperLink missed its heartbeats); "
                                 "not waited for since")
    grid.partition[13], grid.state[13] = 2, "up"  # the restarted SuperNode registers with a new node id
    assert _fake_round(transport, 1)[0] == {} and transport.nodes[2] == 13


def test_a_node_restarted_before_the_server_noticed_its_death_takes_over_and_nobody_waits(grid):
    """Killed between rounds and started again at once: the SuperLink lists both ids (the dead one until its
    heartbeats expire); the new node answers its handshake and serves the client, the dead id is sent nothing (so
    nothing waits for it)."""
    transport = _transport(grid)
    assert _fake_round(transport, 0)[0] == {}
    grid.state[12], grid.partition[13], grid.state[13] = "dead", 2, "up"
    assert _fake_round(transport, 1)[0] == {}
    assert transport.nodes[2] == 13 and grid.sent_to(12, "train") == 1 and grid.sent_to(13, "train") == 1


def test_a_node_dead_before_the_handshake_is_unreached_until_a_new_node_serves_its_client(grid):
    grid.state[12] = "dead"  # a resumed run whose node died: still listed, so its handshake times out once
    transport = _transport(grid)
    failures, waited = _fake_round(transport, 0)
    assert "handshake" in failures[2] and not waited
    grid.state[12], grid.partition[13], grid.state[13] = "offline", 2, "up"
    assert _fake_round(transport, 1)[0] == {} and transport.nodes[2] == 13 and transport.unreached == {}


def _named_states(grid, round_name):
    """Per node, (state_round, keep_from) of the train message it was sent in `round_name`."""
    from manytask.engine.flower.records import control_of

    sent = [m for m in grid.pushed if m.metadata.message_type == "train" and m.metadata.group_id == round_name]
    return {m.metadata.dst_node_id: (int(control_of(m.content)["state_round"]), int(control_of(m.content)["keep_from"]))
            for m in sent}


def test_a_server_that_crashed_mid_round_names_the_states_of_its_checkpoint_again(grid):
    """A node saves a state per round; the server names the one to load (the client's last replied round) and the
    oldest it may still name (as of its last checkpoint). Round 3's replies arrive, then the server dies before its
    checkpoint: the server resumed from round 2's checkpoint names round-2 states again, which its nodes still
    hold (keep_from never passed them)."""
    transport = _transport(grid)
    _fake_round(transport, 0)
    _fake_round(transport, 1)
    states = transport.client_states()  # the checkpoint after round 2
    grid.state[12] = "dead"  # client 2 misses round 3: its named state stays round 2's
    _fake_round(transport, 2)
    assert _named_states(grid, "3") == {10: (2, 2), 11: (2, 2), 12: (2, 2)}
    assert transport.replied == {0: 3, 1: 3, 2: 2}
    grid.state[12] = "up"
    resumed = _transport(grid)
    resumed.restore_client_states(states)
    grid.pushed.clear()
    _fake_round(resumed, 2)  # round 3 again, after the crash
    assert _named_states(grid, "3") == {10: (2, 2), 11: (2, 2), 12: (2, 2)}
    with pytest.raises(ManytaskError, match="cannot hand to SuperNodes"):
        resumed.restore_client_states({0: {"w": torch.ones(1)}})


def test_polls_for_replies_wait_a_share_of_the_rounds_age():
    """A reply is picked up at most `PULL_WAIT_SHARE` of the round's age late (1 ms early on), never later than one
    `PULL_INTERVAL`: a fixed 0.2 s held the bench's 30-client rounds on Flower's simulation to 0.21 or 0.41 s."""
    wait = transport_module.pull_wait
    assert wait(0.0) == transport_module.SHORTEST_PULL_WAIT == 0.001
    assert wait(1.0) == pytest.approx(0.05)
    assert wait(3.0) == pytest.approx(0.15)
    assert wait(60.0) == transport_module.PULL_INTERVAL == 0.2
    ages = [0.0]
    while ages[-1] < 0.2:  # a round's polls in its first 0.2 s
        ages.append(ages[-1] + wait(ages[-1]))
    assert 40 < len(ages) < 80
    assert all(later - earlier <= max(0.001, 0.05 * earlier) + 1e-12 for earlier, later in pairwise(ages))


@pytest.mark.slow
def test_supernodes_read_only_their_own_exported_partitions_and_a_wrong_folder_fails_its_node(tmp_path):
    """export-partitions writes one folder per client and the server's test sets; each SuperNode gets only its own
    folder (copied to a place of its own, the export's client folders then deleted), and the deployment gives the
    local engine's numbers on the original config. A node given another client's folder, or none, fails that
    client in one sentence, recorded in the run; the others finish the run."""
    import shutil

    from typer.testing import CliRunner

    from manytask.cli import app
    from manytask.config_sources import load_yaml

    config = small_config_dict(federation=THREE_CLIENTS, rounds=2, eval_every=2, execution="sequential")
    local = run_config(validate(config), tmp_path / "local")
    source = tmp_path / "source.yaml"
    source.write_text(json.dumps(config))
    parts = tmp_path / "parts"
    exported = CliRunner().invoke(app, ["export-partitions", str(source), str(parts)])
    assert exported.exit_code == 0, exported.output
    nodes = []
    for k in range(3):  # each node's machine holds its own folder only
        nodes.append(shutil.copytree(parts / f"client-{k}", tmp_path / f"machine-{k}" / "data"))
        shutil.rmtree(parts / f"client-{k}")
    from safetensors import safe_open

    with safe_open(parts / "server" / "test.safetensors", "pt") as server:
        assert all(key.startswith("test/") for key in server.keys())  # noqa: SIM118  (no client rows there)
    deploy = load_yaml(parts / "config.yaml")

    def on(cluster, **overrides):
        return validate({**deploy, "engine": "flower", "flower": {"superlink": cluster.address, "round_timeout": 120},
                         **overrides})

    with LocalCluster(3, tmp_path / "cluster", data_paths=nodes) as cluster:
        deployed = run_config(on(cluster), tmp_path / "flower")
    assert deployed["fedavg"]["tasks"] == local["fedavg"]["tasks"]
    assert deployed["fedavg"]["bytes_up"] == local["fedavg"]["bytes_up"]
    with LocalCluster(3, tmp_path / "wrong", data_paths=[nodes[0], nodes[2], None]) as cluster:
        run_config(on(cluster, rounds=1), tmp_path / "refused")
    failures = [json.loads(line)["failures"] for line in (tmp_path / "refused" / "metrics.jsonl").read_text()
                .splitlines()]
    assert set(failures[0]) == {"1", "2"}, failures
    assert f"data-path '{nodes[2]}' holds client 2's partition, not client 1's" in failures[0]["1"]
    assert "this SuperNode (partition-id 2) has no data-path in its node config" in failures[0]["2"]


def test_a_supernode_holding_other_data_is_refused_at_the_handshake(grid):
    """Each node answers the handshake with its client's data fingerprint; the server compares it with the data it
    expects for that client and refuses the run in one sentence where they differ."""
    expected = {0: "a0", 1: "a1", 2: "a2"}.__getitem__
    grid.data = {10: "a0", 11: "a1", 12: "a2"}
    assert GridTransport(grid, 3, "config", round_timeout=FAKE_TIMEOUT, connect_timeout=5,
                         client_data=expected).nodes == {0: 10, 1: 11, 2: 12}
    grid.data[12] = "b2"  # this node's benchmark drew other data
    with pytest.raises(ManytaskError, match=r"the SuperNode serving client 2 \(node 12\) holds other training data "
                                            r"than the server expects \(data fingerprint b2, expected a2\)"):
        GridTransport(grid, 3, "config", round_timeout=FAKE_TIMEOUT, connect_timeout=5, client_data=expected)

