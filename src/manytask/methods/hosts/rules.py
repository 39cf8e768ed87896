"""Server rules: what a host's server does with the round's mean update, as pure functions of tensors.

A rule is `init(θ) -> state` and `step(θ, state, round) -> (θ, state)`, over the parameters some update holds, with
`round.mean` = Δ = Σ_n p_n (θ_n − θ_sent), the weighted mean update (FedAvg's weights), and `round.counts` the
number of updates that hold each key (a host may summarize its round otherwise: FedNova's is normalized). Its state
is a fixed set of named tensor dicts (`state_names`), declared once: the server checkpoints it, and a checkpoint
with any other name is an error. `RuleServer` is the whole server side of such a host: round summary, rule, buffers
averaged with FedAvg's weights."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import torch
from torch import Tensor

from manytask.methods.base import Setup
from manytask.methods.common.aggregation import Weight, weighted_average
from manytask.methods.common.global_model import PART_PREFIX
from manytask.methods.common.updates import Update, is_parameter
from manytask.methods.hosts.base import HostParams
from manytask.methods.hosts.server import HostServer

Tensors = dict[str, Tensor]
RuleState = dict[str, Tensors]  # state name -> parameter key -> tensor


@dataclass(frozen=True)
class RoundDelta:
    mean: Tensors  # Δ_k = Σ_n p_n Δ_{n,k} over the updates that hold k
    counts: dict[str, int]  # |P_k|: the updates that hold k


def round_delta(deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[Mapping[str, Weight]]) -> RoundDelta:
    mean = weighted_average(deltas, weights)
    return RoundDelta(mean, {k: sum(k in delta for delta in deltas) for k in mean})


class ServerRule(Protocol):
    state_names: ClassVar[tuple[str, ...]]

    def init(self, theta: Mapping[str, Tensor]) -> RuleState: ...

    def step(self, theta: Mapping[str, Tensor], state: RuleState, round: RoundDelta) -> tuple[Tensors, RuleState]: ...


@dataclass(frozen=True)
class Plain:
    """θ ← θ + Δ, no state: FedAvg's step on the parameters, for hosts whose round summary is their rule (FedNova's
    normalized mean update)."""

    state_names: ClassVar[tuple[str, ...]] = ()

    def init(self, theta: Mapping[str, Tensor]) -> RuleState:
        return {}

    def step(self, theta: Mapping[str, Tensor], state: RuleState, round: RoundDelta) -> tuple[Tensors, RuleState]:
        return {k: theta[k] + d for k, d in round.mean.items()}, {}


@dataclass(frozen=True)
class Momentum:
    """FedACG's server step (Kim et al., CVPR 2024, Algorithm 1): m ← λ m + Δ;  θ ← θ + m."""

    lam: float
    state_names: ClassVar[tuple[str, ...]] = ("momentum",)

    def init(self, theta: Mapping[str, Tensor]) -> RuleState:
        return {"momentum": {k: torch.zeros_like(v) for k, v in theta.items()}}

    def step(self, theta: Mapping[str, Tensor], state: RuleState, round: RoundDelta) -> tuple[Tensors, RuleState]:
        momentum = {k: self.lam * state["momentum"][k] + d for k, d in round.mean.items()}
        return {k: theta[k] + m for k, m in momentum.items()}, {"momentum": momentum}


@dataclass(frozen=True)
class Adaptive:
    """FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Algorithm 2),
    per entry:
        m ← β₁ m + (1 − β₁) Δ
        v ← v + Δ²                              (adagrad)
        v ← β₂ v + (1 − β₂) Δ²                  (adam)
        v ← v − (1 − β₂) Δ² sign(v − Δ²)        (yogi)
        θ ← θ + η m / (√v + τ)
    with m₀ = 0 and v₀ = τ² (the paper's v₋₁ ≥ τ²); no bias correction, as in the paper."""

    kind: Literal["adagrad", "adam", "yogi"]
    lr: float
    beta1: float
    beta2: float
    tau: float
    state_names: ClassVar[tuple[str, ...]] = ("m", "v")

    def init(self, theta: Mapping[str, Tensor]) -> RuleState:
        return {"m": {k: torch.zeros_like(v) for k, v in theta.items()},
                "v": {k: torch.full_like(v, self.tau ** 2) for k, v in theta.items()}}

    def step(self, theta: Mapping[str, Tensor], state: RuleState, round: RoundDelta) -> tuple[Tensors, RuleState]:
        delta = round.mean
        m = {k: self.beta1 * state["m"][k] + (1 - self.beta1) * d for k, d in delta.items()}
        v = {k: self._second(state["v"][k], d * d) for k, d in delta.items()}
        return {k: theta[k] + self.lr * m[k] / (v[k].sqrt() + self.tau) for k in delta}, {"m": m, "v": v}

    def _second(self, v: Tensor, square: Tensor) -> Tensor:
        if self.kind == "adagrad":
            return v + square
        if self.kind == "adam":
            return self.beta2 * v + (1 - self.beta2) * square
        return v - (1 - self.beta2) * square * torch.sign(v - square)


@dataclass(frozen=True)
class Dynamic:
    """FedDyn's server step (Acar et al., ICLR 2021, Algorithm 1), per key k held by some update, with m_k the
    copies in the federation that train k (`holders`):
        h ← h − α (|P_k| / m_k) Δ_k;   θ ← θ + Δ_k − h / α   (= Σ_n p_n θ_n − h / α)."""

    alpha: float
    holders: Mapping[str, int]
    state_names: ClassVar[tuple[str, ...]] = ("h",)

    def init(self, theta: Mapping[str, Tensor]) -> RuleState:
        return {"h": {k: torch.zeros_like(v) for k, v in theta.items()}}

    def step(self, theta: Mapping[str, Tensor], state: RuleState, round: RoundDelta) -> tuple[Tensors, RuleState]:
        alpha = self.alpha
        h = {k: state["h"][k] - alpha * (round.counts[k] / self.holders[k]) * d for k, d in round.mean.items()}
        return {k: theta[k] + d - h[k] / alpha for k, d in round.mean.items()}, {"h": h}


class RuleServer(HostServer):
    """A host server whose rule is a `ServerRule` (`rule(params)` builds it): θ and the rule's state move on the
    parameters the round's updates hold; the others keep their values."""

    def __init__(self, setup: Setup, params: HostParams) -> None:
        super().__init__(setup, params)
        self.rule = self.build_rule()
        parameters = {k: v for k, v in self.global_state.items() if is_parameter(k, v)}
        self.parts.update(self.rule.init(parameters))

    @abstractmethod
    def build_rule(self) -> ServerRule:
        """The host's server rule, from its params."""

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """The global model and the rule's declared state; any other server state is an error, not a silent miss."""
        names = {k[len(PART_PREFIX):].partition("/")[0] for k in state if k.startswith(PART_PREFIX)}
        unknown = sorted(names - set(self.rule.state_names))
        if unknown:
            raise ValueError(f"unknown server state '{unknown[0]}' for {type(self).__name__}: its rule keeps "
                             f"{', '.join(self.rule.state_names)}")
        super().load_state_dict(state)

    def round_summary(self, updates: list[Update]) -> RoundDelta:
        """What the rule steps on: the weighted mean update (FedNova's is normalized by each client's local work)."""
        return round_delta([u.deltas() for u in updates], [u.weights for u in updates])

    def aggregate_updates(self, round_index: int, updates: list[Update]) -> dict[str, float]:
        round = self.round_summary(updates)
        state = {name: {k: self.parts[name][k] for k in round.mean} for name in self.rule.state_names}
        theta, state = self.rule.step(self.global_state, state, round)
        self.average_buffers(updates)
        self.global_state.update(theta)
        for name, values in state.items():
            self.parts[name].update(values)
        return {}
