"""A host of your own, composed from manytask's pieces without editing the package: FedProx's local objective (the
tasks' losses + (μ/2)‖θ − θ_global‖²) with a heavy-ball server (FedAvgM: m ← β m + Δ, θ ← θ + m).

A host is a local objective, a server rule and its params (docs/architecture.md). Here:
- the objective adds one `ParameterTerm`, with its gradient stated so the batched executor adds it in place;
- the server is a `RuleServer` with the `Momentum` rule, whose state (`momentum`) is checkpointed by name;
- the params are a pydantic model with a search space for `manytask tune`.

Use it from a config with `imports: [examples/custom_method.py]` and `method: fedavgm-prox`."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from manytask.client.terms import SQUARED_DISTANCE_GRADIENT, ParameterTerm, squared_distance
from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostParams
from manytask.methods.hosts.rules import Momentum, RuleServer
from manytask.methods.registry import HOST, register_method
from manytask.search_space import Space, log_range, uniform


class FedAvgMProxParams(HostParams):
    SEARCH_SPACE: ClassVar[Space] = {"mu": log_range(1e-3, 1.0), "beta": uniform(0.0, 0.9)}
    mu: float = Field(default=0.01, ge=0, description="proximal strength μ of (μ/2)‖θ − θ_global‖²")
    beta: float = Field(default=0.5, ge=0, lt=1, description="server momentum β")


class FedAvgMProxClient(HostClient):
    params: FedAvgMProxParams

    def hooks(self, ctx, copy):
        anchor = {k: v.detach() for k, v in copy.received.items()}
        return [ParameterTerm(dict(copy.model.named_parameters()), anchor, 0.5 * self.params.mu, squared_distance,
                              SQUARED_DISTANCE_GRADIENT)]


class FedAvgMServer(RuleServer):
    params: FedAvgMProxParams

    def build_rule(self) -> Momentum:
        return Momentum(self.params.beta)


register_method(
    "fedavgm-prox", MethodDef(FedAvgMProxClient, FedAvgMServer, family=HOST), FedAvgMProxParams,
    "example: FedProx's clients, a heavy-ball server (examples/custom_method.py)",
)
