"""The simulated GPU (`simulated_cuda.py`) refuses what a GPU refuses and computes what the CPU computes, so that
placement tests on a machine without a GPU can fail."""

import numpy as np
import pytest
import torch
from torch import nn

from manytask.config import validate
from manytask.engine.resident import ResidentData
from manytask.launch import run_config
from tests.conftest import small_config_dict
from tests.simulated_cuda import simulated_cuda

SAME_DEVICE = "Expected all tensors to be on the same device"


def test_a_model_moved_to_the_device_trains_to_the_cpus_values_and_reports_the_device():
    torch.manual_seed(0)
    host = nn.Linear(3, 2)
    x = torch.randn(8, 3)
    with simulated_cuda() as sim:
        model = nn.Linear(3, 2).to("cuda")
        model.load_state_dict(host.state_dict())
        data = x.to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            model(data).square().sum().backward()
            optimizer.step()
        assert model.weight.device == torch.device("cuda", 0) and model.weight.is_cuda and not model.weight.is_cpu
        assert model.weight.grad.is_cuda
        loss = model(data).square().sum().item()
        assert sim.host_reads == 1 and sim.to_device == 3  # two parameters and the data; `.item()` read once
        trained = {k: v.cpu() for k, v in model.state_dict().items()}
        assert sim.to_host == 2
    optimizer = torch.optim.SGD(host.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        optimizer.zero_grad()
        host(x).square().sum().backward()
        optimizer.step()
    assert loss == host(x).square().sum().item()
    assert all(torch.equal(trained[k], v) for k, v in host.state_dict().items())


def test_what_a_gpu_refuses_is_refused():
    with simulated_cuda():
        device = torch.ones(4, device="cuda")
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            device + torch.ones(4)
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            torch.stack([device, torch.zeros(4)])
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            nn.Linear(4, 2)(device)  # the model was never moved
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            device + torch.from_numpy(np.ones(4, np.float32))  # host memory viewed by torch is on the host
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            device.numpy()
        assert float(device.cpu().numpy().sum()) == 4.0


def test_what_a_gpu_allows_across_devices_is_allowed():
    with simulated_cuda() as sim:
        device = torch.ones(4, device="cuda")
        assert (device * torch.tensor(2.0)).is_cuda  # a 0-d host tensor joins an elementwise device op
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            torch.stack([device.sum(), torch.tensor(2.0)])  # but not a stack
        target = torch.zeros(4)
        target.copy_(device)
        device[:2] = torch.full((2,), 5.0)
        copies = sim.to_device
        assert device[torch.tensor([0, 3])].is_cuda and sim.to_device == copies + 1  # the host index is copied
        assert target.tolist() == [1.0] * 4 and not target.is_cuda
        assert device.cpu().tolist() == [5.0, 5.0, 1.0, 1.0]
        assert torch.zeros(2, device=device.device).is_cuda and torch.zeros_like(device).is_cuda
        assert device.to(torch.float64).is_cuda and device.to(target).is_cpu


def test_the_functorch_transforms_return_tensors_where_their_inputs_are():
    with simulated_cuda():
        weights = torch.randn(5, 2, 3, device="cuda")
        x = torch.randn(4, 3, device="cuda")
        batched = torch.func.vmap(lambda w: (x @ w.T).sum())(weights)
        gradient = torch.func.grad(lambda w: (x @ w.T).sum())(weights[0])
        _, tangent = torch.func.jvp(lambda w: (x @ w.T).sum(), (weights[0],), (torch.ones(2, 3, device="cuda"),))
        assert batched.is_cuda and gradient.is_cuda and tangent.is_cuda
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            batched + torch.zeros(5)


def test_torch_answers_for_the_simulated_gpu_only_inside_it():
    real = torch.cuda.is_available()
    with simulated_cuda():
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
    assert torch.cuda.is_available() == real
    assert torch.ones(2).to(torch.float64).dtype == torch.float64  # no mode left behind


def test_a_run_whose_training_data_stays_on_the_host_is_caught(tmp_path, monkeypatch):
    """The check the device tests rely on: with the clients' data left on the host (a placement bug planted in
    `ResidentData`), a simulated-GPU run fails as a GPU run would, and without the bug it runs."""
    config = validate(small_config_dict(rounds=1, method="fedavg", device="cuda"))
    with simulated_cuda():
        run_config(config, tmp_path / "fine")
    monkeypatch.setattr(ResidentData, "_resident", lambda self, key, host: host)
    with simulated_cuda(), pytest.raises(RuntimeError, match=SAME_DEVICE):
        run_config(config, tmp_path / "planted")
