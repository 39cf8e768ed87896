"""Attack simulation (`adversaries:`, issue 17): each attack corrupts exactly what it says, attackers are chosen
deterministically, and through a whole run the server refuses what it must, ending exactly where it would have had
the attackers dropped out; the divergence guard is what refuses a ×1e3 update."""

import numpy as np
import pytest
import torch

from manytask.config import validate
from manytask.engine.adversaries import EXTRA_ARRAY, Adversary, AdversaryConfig, attacking_clients
from manytask.engine.client_runner import ClientRunner
from manytask.engine.local import InProcessTransport
from manytask.engine.loop import FitOutcome, RoundLoop
from manytask.errors import ManytaskError
from manytask.experiment import Experiment
from manytask.messages import Message, MessageError, decode, encode
from manytask.methods.common import aggregation
from manytask.methods.common.guard import far_beyond_median, update_norms
from manytask.rundir import RunDir
from tests.conftest import small_config_dict
from tests.simulated_cuda import simulated_cuda

SENT = Message({"w": np.float32([1.0, 2.0]), "head.a.b": np.float32([0.0])})
REPLY = Message({"w": np.float32([1.5, 1.0]), "head.a.b": np.float32([2.0]), "flags": np.array([True, False])},
                {"n/a": 10, "loss/a": 0.5})


def attacked(attack: str, **settings) -> bytes:
    adversary = Adversary(AdversaryConfig(clients=[3], attack=attack, **settings), frozenset({3}), seed=0)
    return adversary.upload(3, 0, SENT, REPLY)


def test_honest_clients_upload_their_reply_unchanged():
    adversary = Adversary(AdversaryConfig(clients=[3], attack="garbage"), frozenset({3}), seed=0)
    assert adversary.upload(2, 0, SENT, REPLY) is REPLY


def test_scale_and_sign_flip_move_each_array_along_its_update_from_what_was_sent():
    scaled = decode(attacked("scale", factor=10))
    assert scaled.arrays["w"].tolist() == [1.0 + 10 * 0.5, 2.0 + 10 * -1.0]
    assert scaled.arrays["head.a.b"].tolist() == [20.0]
    assert scaled.arrays["flags"].tolist() == [True, False] and scaled.scalars == REPLY.scalars
    flipped = decode(attacked("sign-flip"))
    assert flipped.arrays["w"].tolist() == [0.5, 3.0] and flipped.arrays["head.a.b"].tolist() == [-2.0]


def test_count_attacks_change_only_the_counts():
    assert decode(attacked("inflate-count", factor=1e6)).scalars == {"n/a": 10_000_000, "loss/a": 0.5}
    missing = decode(attacked("missing-count"))
    assert missing.scalars == {"loss/a": 0.5} and missing.arrays.keys() == REPLY.arrays.keys()


def test_shape_and_field_attacks():
    assert decode(attacked("wrong-shape")).arrays["w"].tolist() == [1.5]  # broadcastable against (2,)
    extra = decode(attacked("extra-array"))
    assert extra.arrays[EXTRA_ARRAY].shape == (1000, 1000) and extra.arrays["w"].tolist() == [1.5, 1.0]


def test_noise_is_seeded_by_round_and_client_and_has_the_asked_spread():
    big = Message({"w": np.zeros(20_000, np.float32)}, {"n/a": 1})
    adversary = Adversary(AdversaryConfig(clients=[0, 1], attack="noise", std=0.5), frozenset({0, 1}), seed=0)
    noisy = decode(adversary.upload(0, 4, None, big)).arrays["w"]
    assert np.array_equal(noisy, decode(adversary.upload(0, 4, None, big)).arrays["w"])
    assert not np.array_equal(noisy, decode(adversary.upload(1, 4, None, big)).arrays["w"])
    assert abs(float(noisy.std()) - 0.5) < 0.01 and abs(float(noisy.mean())) < 0.01


@pytest.mark.parametrize("attack", ["garbage", "truncate"])
def test_byte_attacks_send_bytes_that_do_not_decode(attack):
    data = attacked(attack)
    assert len(data) == len(encode(REPLY)) // (2 if attack == "truncate" else 1)
    with pytest.raises(MessageError):
        decode(data)


def test_attackers_are_the_listed_ids_or_a_seeded_fraction():
    assert attacking_clients(AdversaryConfig(clients=[1, 4], attack="scale"), 10, seed=0) == {1, 4}
    drawn = attacking_clients(AdversaryConfig(fraction=0.3, attack="scale"), 10, seed=5)
    assert len(drawn) == 3 and drawn == attacking_clients(AdversaryConfig(fraction=0.3, attack="scale"), 10, seed=5)
    assert len(attacking_clients(AdversaryConfig(fraction=0.01, attack="scale"), 10, seed=0)) == 1
    with pytest.raises(ManytaskError, match=r"adversaries\.clients names \[12\]"):
        attacking_clients(AdversaryConfig(clients=[12], attack="scale"), 10, seed=0)


@pytest.mark.parametrize("adversaries", [
    {"attack": "scale"}, {"clients": [0], "fraction": 0.5, "attack": "scale"}, {"clients": [], "attack": "scale"},
    {"clients": [0], "attack": "melt"}, {"clients": [0], "attack": "noise", "std": 0},
])
def test_bad_adversary_settings_are_refused_before_anything_runs(adversaries):
    with pytest.raises(ManytaskError, match="adversaries"):
        validate(small_config_dict(adversaries=adversaries))


# distances in column chunks of 2^14 entries, or of one
@pytest.mark.parametrize("columns", [1 << 14, 1])
def test_the_guard_refuses_updates_far_beyond_the_median(monkeypatch, columns):
    monkeypatch.setattr(aggregation, "SUM_COLUMNS", columns)
    sent = {"w": torch.zeros(2), "b": torch.ones(1)}
    replies = {0: {"w": torch.tensor([3.0, 4.0]), "n": torch.tensor([7])},  # an integer array is no parameter
               1: {"w": torch.tensor([1.0, 0.0]), "b": torch.tensor([2.0])},
               2: {"copy/x/w": torch.tensor([0.0, 1.0]), "copy/y/w": torch.tensor([6.0, 8.0])},  # the larger copy
               3: {"w": torch.tensor([0.0, 2.0])}}
    assert update_norms(dict.fromkeys(replies, sent), replies) == {0: 5.0, 1: 2 ** 0.5, 2: 10.0, 3: 2.0}
    assert torch.equal(sent["w"], torch.zeros(2))  # the reference is subtracted from a copy
    blown_up = {"w": torch.tensor([3e24, 4e24])}  # squares past float32's range: measured in float64
    assert update_norms({0: sent}, {0: blown_up})[0] == pytest.approx(5e24, rel=1e-6)
    half = {"w": torch.tensor([3.0, 4.0], dtype=torch.bfloat16)}  # a dtype numpy lacks
    assert update_norms({0: {"w": torch.zeros(2, dtype=torch.bfloat16)}}, {0: half}) == {0: 5.0}
    with simulated_cuda() as sim:  # replies on the device: the same norms, read once for the round
        on_gpu = {c: {k: v.cuda() for k, v in r.items()} for c, r in replies.items()}
        reads = sim.host_reads
        assert update_norms(dict.fromkeys(replies, sent), on_gpu) == {0: 5.0, 1: 2 ** 0.5, 2: 10.0, 3: 2.0}
        assert sim.host_reads == reads + 1
        assert update_norms({0: sent}, {0: {"w": blown_up["w"].cuda()}})[0] == pytest.approx(5e24, rel=1e-6)
    norms = {0: 1.0, 1: 2.0, 2: 3.0, 3: 251.0}  # median 2.5: 3 is above 100×, by 1
    assert list(far_beyond_median(norms, 100.0)) == [3]
    assert far_beyond_median(norms, 0) == {} and far_beyond_median({0: 1.0, 1: 1e9}, 100.0) == {}
    assert "100× the round's median 2.5" in far_beyond_median({0: 1.0, 1: 2.0, 2: 3.0, 3: 250.0}, 10.0)[3]


class Dropping:
    """The local transport with the given clients dropped every round: what a refused reply must equal."""

    def __init__(self, experiment: Experiment, dropped: set[int]) -> None:
        self.inner, self.dropped = InProcessTransport(ClientRunner(experiment)), dropped

    def fit(self, round_index, payloads, simulated_drops) -> FitOutcome:
        outcome = self.inner.fit(round_index, payloads, simulated_drops)
        for client in self.dropped & set(outcome.replies):
            del outcome.replies[client]
            outcome.failures[client] = "dropped"
        return outcome

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _run(tmp_path, name, adversaries=None, dropped=frozenset(), rounds=2, **method):
    config = validate(small_config_dict(method={"name": "fedavg", **method}, rounds=rounds, eval_every=rounds,
                                        adversaries=adversaries))
    experiment = Experiment.build(config)
    run_dir = RunDir(tmp_path / name)
    run_dir.start("", experiment.federation.to_json())
    loop = RoundLoop(experiment, run_dir, Dropping(experiment, set(dropped)))
    loop.run()
    return loop.server.state_dict(), run_dir.read_metrics()


REFUSED = ["garbage", "truncate", "wrong-shape", "missing-count", "extra-array", "inflate-count", "scale"]


def test_refused_attacks_leave_the_model_exactly_as_if_the_attacker_dropped_out(tmp_path):
    dropped_state, dropped_rows = _run(tmp_path, "dropped", dropped={1})
    for attack in REFUSED:
        state, rows = _run(tmp_path, attack, {"clients": [1], "attack": attack})
        assert all(list(row["failures"]) == ["1"] for row in rows), (attack, rows[0]["failures"])
        assert state.keys() == dropped_state.keys(), attack
        assert all(torch.equal(state[k], dropped_state[k]) for k in state), attack
        assert rows[-1]["eval"] == dropped_rows[-1]["eval"], attack


def test_without_the_guard_a_scaled_update_is_aggregated_and_wrecks_the_model(tmp_path):
    _, honest_rows = _run(tmp_path, "honest", rounds=6)
    _, guarded = _run(tmp_path, "guarded", {"clients": [1], "attack": "scale"}, rounds=6)
    assert "divergence guard" in guarded[0]["failures"]["1"]
    _, unguarded = _run(tmp_path, "unguarded", {"clients": [1], "attack": "scale"}, rounds=6, guard=0)
    assert unguarded[0]["failures"] == {}
    assert unguarded[-1]["average"] < honest_rows[-1]["average"] - 0.2  # ×1e3 from one of 4 clients
    assert guarded[-1]["average"] > honest_rows[-1]["average"] - 0.1


@pytest.mark.parametrize("attack", ["sign-flip", "noise"])
def test_plausible_attacks_pass_screening_and_the_run_completes(tmp_path, attack):
    _, rows = _run(tmp_path, attack, {"clients": [1], "attack": attack, "std": 0.01})
    assert all(row["failures"] == {} for row in rows) and "average" in rows[-1]


def test_the_summary_and_report_name_the_attack_and_every_refused_client(tmp_path):
    from manytask.launch import run_config
    from manytask.report.report import write_report

    config = validate(small_config_dict(rounds=2, adversaries={"clients": [1], "attack": "garbage"}))
    summary = run_config(config, tmp_path / "run")["fedavg"]
    assert summary["failed_clients"] == {"1": {"rounds": 2, "last_round": 2, "reason": (
        "reply does not decode: not a manytask message (bad magic bytes)")}}
    assert summary["adversaries"] == {"clients": [1], "attack": "garbage", "factor": 1000.0, "std": 1.0,
                                      "attackers": [1]}
    report = write_report(tmp_path / "run").read_text()
    assert "- attack simulated: garbage by clients [1]" in report
    assert "- client 1: failed 2 round(s), the last in round 2: reply does not decode" in report
