"""Data and client states kept on the training device between calls (`engine/resident.py`), checked on torch's
`meta` device: a real device whose tensors carry shapes and dtypes but no values, so moves and bytes are countable
on a machine without a GPU."""

from __future__ import annotations

import torch

from manytask.engine.resident import ResidentData, ResidentStates, data_bytes

META = torch.device("meta")


def _data(client: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {f"t{client}": (torch.full((10, 4), float(client)), torch.zeros(10, dtype=torch.long))}  # 240 bytes


def _test(tasks: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {task: (torch.ones(5, 4), torch.zeros(5, dtype=torch.long)) for task in tasks}  # 120 bytes each


def test_a_clients_data_moves_to_the_device_once_while_it_fits():
    loads = []
    resident = ResidentData(lambda c: loads.append(c) or _data(c), _test, META, capacity=1000)
    first = resident.client(3)
    again = resident.client(3)
    assert first["t3"][0].device == META and first["t3"][0] is again["t3"][0]  # the same device copy
    assert resident.moves == 1 and loads == [3]
    tests = resident.test(["a", "b"])
    assert resident.test(["b"])["b"][0] is tests["b"][0] and resident.moves == 3


def test_past_its_capacity_the_least_recently_used_copy_is_dropped(capsys):
    assert data_bytes(_data(0)) == 240
    resident = ResidentData(_data, _test, META, capacity=500)  # two clients' data fit
    for client in (0, 1, 0, 2):  # 2 evicts 1, the least recently used
        resident.client(client)
    assert resident.moves == 3
    resident.client(0)
    assert resident.moves == 3  # still held
    resident.client(1)
    assert resident.moves == 4  # moved again
    assert "the least recently used move at each use" in capsys.readouterr().err


def test_data_larger_than_the_capacity_moves_at_every_call():
    resident = ResidentData(_data, _test, META, capacity=100)
    resident.client(0)
    resident.client(0)
    assert resident.moves == 2


def test_on_the_cpu_nothing_moves():
    resident = ResidentData(_data, _test, torch.device("cpu"), capacity=0)
    held = _data(1)
    resident._host[1] = held
    assert resident.client(1)["t1"][0] is held["t1"][0] and resident.moves == 0


def test_client_states_stay_on_the_device_while_they_fit_and_spill_to_the_host_after(capsys):
    states = ResidentStates(META, capacity=100)
    first = {"w": torch.empty(16, device=META)}  # 64 bytes
    states.keep(0, first)
    states.keep(0, first)  # its own bytes are not counted twice
    assert first["w"].device == META and set(states._held) == {0}
    second = {"w": torch.empty(16)}  # 64 more do not fit: this state goes (here: stays) on the host
    states.keep(1, second)
    assert second["w"].device == torch.device("cpu") and set(states._held) == {0}
    assert "the client states exceed" in capsys.readouterr().err
    states.keep(0, {"w": torch.empty(4, device=META)})  # client 0's state shrank to 16 bytes: now both fit
    states.keep(1, second)
    assert set(states._held) == {0, 1}
