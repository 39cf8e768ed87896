"""FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021, "Adaptive Federated Optimization"): FedAvg's clients,
and a server that treats the mean update Δ as a pseudo-gradient for an adaptive optimizer (`rules.Adaptive`).
Defaults are the paper's: β₁ 0.9, β₂ 0.99, τ 1e-3; server lr η 0.01 (the middle of its grid for Adam and Yogi)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostParams
from manytask.methods.hosts.rules import Adaptive, RuleServer
from manytask.methods.registry import HOST, register_method
from manytask.search_space import Space, log_range


class AdaptiveParams(HostParams):
    SEARCH_SPACE: ClassVar[Space] = {"server_lr": log_range(1e-3, 1.0), "tau": log_range(1e-5, 1e-1)}
    server_lr: float = Field(default=0.01, gt=0, description="server learning rate η of the adaptive rule")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="first-moment decay β₁")
    beta2: float = Field(default=0.99, ge=0, lt=1, description="second-moment decay β₂ (adam, yogi)")
    tau: float = Field(default=1e-3, gt=0, description="adaptivity τ: v starts at τ², the step divides by √v + τ")


def _server(kind: Literal["adagrad", "adam", "yogi"]) -> type[RuleServer]:
    class AdaptiveServer(RuleServer):
        params: AdaptiveParams

        def build_rule(self) -> Adaptive:
            p = self.params
            return Adaptive(kind, p.server_lr, p.beta1, p.beta2, p.tau)

        @property
        def step_scale(self) -> float:
            return 1.0  # `server_lr` is the adaptive rule's own η (Reddi et al.'s server learning rate)

    AdaptiveServer.__name__ = AdaptiveServer.__qualname__ = f"Fed{kind.capitalize()}Server"
    return AdaptiveServer


for _kind in ("adagrad", "adam", "yogi"):
    register_method(
        f"fed{_kind}", MethodDef(HostClient, _server(_kind), family=HOST), AdaptiveParams,
        f"Fed{_kind.capitalize()}: FedAvg's clients, the server runs {_kind} on the mean update (Reddi et al. 2021)",
    )
