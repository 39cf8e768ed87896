"""FedAvg (McMahan et al., 2017, "Communication-Efficient Learning of Deep Networks from Decentralized Data") for
multi-task clients: a shared backbone averaged over all participants, each task head averaged over the
participants that hold the task.

Server rule (`common.aggregation`): for every parameter k, θ_k ← Σ_n w_{n,k} θ_{n,k} / Σ_n w_{n,k} over the
clients n that uploaded k, with w_{n,k} = |D_n^t| for a head of task t and w_{n,k} = Σ_t |D_n^t| for the backbone.
`linearize` trains the model linearized around its start (NTK-FedAvg, Ortiz-Jimenez et al., 2023).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostModel, HostParams
from manytask.methods.hosts.server import HostServer
from manytask.methods.registry import HOST, register_method
from manytask.models.linearized import Linearized
from manytask.models.multitask import MultiTaskModel


class FedAvgParams(HostParams):
    linearize: bool = Field(default=False, description="train the model linearized around its start (NTK-FedAvg)")


class FedAvgModel(HostModel):
    """The model, or its linearization, captured before any update so that every client and the server
    linearize around the same pretrained point."""

    params: FedAvgParams

    def build_model(self) -> tuple[MultiTaskModel, nn.Module]:
        model = self.setup.build_model()
        return model, Linearized(model) if self.params.linearize else model


class FedAvgClient(FedAvgModel, HostClient):
    pass


class FedAvgServer(FedAvgModel, HostServer):
    pass


register_method(
    "fedavg", MethodDef(FedAvgClient, FedAvgServer, family=HOST), FedAvgParams,
    "FedAvg: backbone averaged over participants, each head over its task's holders",
)


class NtkFedAvgParams(FedAvgParams):
    linearize: Literal[True] = True


register_method(
    "ntk-fedavg", MethodDef(FedAvgClient, FedAvgServer, family=HOST), NtkFedAvgParams,
    "NTK-FedAvg: FedAvg on the model linearized around the pretrained point (forward-mode JVP)",
)
