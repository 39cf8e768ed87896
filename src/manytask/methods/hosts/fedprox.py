"""FedProx (Li et al., 2020, "Federated Optimization in Heterogeneous Networks"): FedAvg whose clients add the
proximal term (μ/2)·‖w − w_global‖² to their loss. The server is FedAvg's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from manytask.client.terms import SQUARED_DISTANCE_GRADIENT, ParameterTerm, squared_distance
from manytask.client.trainer import TrainHook
from manytask.methods.base import ClientContext, MethodDef
from manytask.methods.hosts.base import TrainedCopy
from manytask.methods.hosts.fedavg import FedAvgClient, FedAvgParams, FedAvgServer
from manytask.methods.registry import HOST, register_method
from manytask.search_space import Space, log_range


class FedProxParams(FedAvgParams):
    # ranges for manytask tune: FedProx sweeps μ over {0.001, 0.01, 0.1, 1}
    SEARCH_SPACE: ClassVar[Space] = {"mu": log_range(1e-3, 1.0)}
    mu: float = Field(default=0.01, ge=0, description="proximal strength μ")


def proximal_term(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], mu: float) -> Tensor:
    """(μ/2) Σ_k ‖θ_k − θ^global_k‖² over the parameters present in `anchor` (FedProx, eq. 2)."""
    total = torch.zeros(())
    for name, reference in anchor.items():
        total = total + squared_distance(params[name], reference)
    return 0.5 * mu * total


class ProximalHook(ParameterTerm):
    """(μ/2)·‖θ − θ_anchor‖² over the parameters (by state-dict name, as trained: a linearized model trains the same
    tensors under other names) that the anchor holds."""

    def __init__(self, params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], mu: float) -> None:
        super().__init__(params, {k: v.detach() for k, v in anchor.items() if k in params}, 0.5 * mu,
                         squared_distance, SQUARED_DISTANCE_GRADIENT)


class FedProxClient(FedAvgClient):
    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        return [ProximalHook(dict(copy.model.named_parameters()), copy.received, self.params.mu)]


register_method(
    "fedprox", MethodDef(FedProxClient, FedAvgServer, family=HOST), FedProxParams,
    "FedProx: FedAvg with a client proximal term μ/2‖w − w_global‖²",
)
