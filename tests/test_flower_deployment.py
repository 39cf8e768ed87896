"""Real Flower deployments on loopback: a SuperLink and SuperNodes as separate processes, runs submitted with
`flwr run`. Same numbers as the local engine, a killed SuperNode, TLS, and no listener beyond loopback."""

import json

import pytest

from manytask.config import validate
from manytask.run import resume, run_config
from tests.conftest import small_config_dict
from tests.flower_support import listeners_of, write_test_certificates

pytest.importorskip("flwr")
from manytask.engine.flower.cluster import LocalCluster, TLSFiles

pytestmark = pytest.mark.slow
THREE_CLIENTS = {"num_clients": 3, "tasks": {"kind": "dirichlet", "zeta": 1.0}, "samples": {"kind": "iid"}}


def _deployed(cluster, tmp_path, **overrides):
    flower = {"superlink": cluster.address, "round_timeout": 120, **overrides.pop("flower", {})}
    return small_config_dict(federation=THREE_CLIENTS, engine="flower", flower=flower, eval_every=2, **overrides)


def _assert_loopback_only(cluster):
    addresses = listeners_of(cluster.pids())
    assert len(addresses) >= 1 + cluster.nodes, addresses  # the SuperLink and each SuperNode listen
    assert all(a.startswith("127.0.0.1:") for a in addresses), addresses


def test_fedavg_and_fedprox_on_three_supernodes_match_the_local_engine(tmp_path):
    methods = ["fedavg", {"name": "fedprox", "mu": 0.1}]
    local = run_config(validate(small_config_dict(federation=THREE_CLIENTS, method=methods, rounds=2, eval_every=2)),
                       tmp_path / "local")
    with LocalCluster(3, tmp_path / "cluster") as cluster:
        _assert_loopback_only(cluster)
        deployed = run_config(validate(_deployed(cluster, tmp_path, method=methods, rounds=2)), tmp_path / "flower")
        _assert_loopback_only(cluster)
    for label in ("fedavg", "fedprox"):
        assert deployed[label]["tasks"] == local[label]["tasks"], label
        assert deployed[label]["bytes_up"] == local[label]["bytes_up"]
        assert deployed[label]["bytes_down"] == local[label]["bytes_down"]


def test_a_killed_supernode_becomes_a_logged_dropout_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    with LocalCluster(3, tmp_path / "cluster") as cluster:
        config = _deployed(cluster, tmp_path, method="fedavg", rounds=3, flower={"round_timeout": 40})
        assert run_config(validate(config), run_dir, stop_after=1) is None  # round 1 done, checkpointed
        cluster.kill_node(2)  # between rounds 1 and 2: driven by the round counter, not by a clock
        summary = resume(run_dir)["fedavg"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["dropped"] == []
    assert all(2 in r["dropped"] and "2" in r["failures"] for r in rows[1:]), [r["failures"] for r in rows]
    assert all(set(r["bytes_up"]) == {"0", "1"} for r in rows[1:])
    assert summary["rounds"] == 3 and summary["tasks"]


def test_tls_deployment_completes_two_rounds(tmp_path):
    ca, cert, key = write_test_certificates(tmp_path / "certs")
    with LocalCluster(3, tmp_path / "cluster", tls=TLSFiles(ca, cert, key)) as cluster:
        config = _deployed(cluster, tmp_path, method="fedavg", rounds=2, flower={"root_certificates": str(ca)})
        summary = run_config(validate(config), tmp_path / "run")["fedavg"]
        log = (tmp_path / "cluster" / "superlink.log").read_text()
    assert summary["rounds"] == 2
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert "--insecure" not in log and "insecure" not in log.lower()
