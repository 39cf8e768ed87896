"""FedDyn (Acar et al., ICLR 2021, "Federated Learning Based on Dynamic Regularization"), Algorithm 1.

Client n minimizes L_n(θ) − ⟨g_n, θ⟩ + (α/2)‖θ − θ_sent‖² over the received parameters its copy trains (not
buffers), where g_n, its gradient term from earlier rounds (zeros at first), lives in client state (one per
`per_task` copy); after training g_n ← g_n − α(θ_n − θ_sent).

Server state h (per parameter key, zeros at first, `parts["h"]`). Per key k, over the updates P_k that hold it, with
p_n = w_n / Σ_m w_m (per entry for tensor weights) and m_k the trained copies in the federation that hold k:
    h ← h − α (|P_k| / m_k) Σ_n p_n (θ_n − θ_sent);   θ ← Σ_n p_n θ_n − h / α.
With equal weights this is the paper's h ← h − (α/m) Σ_{n∈P} (θ_n − θ^{t−1}), θ ← (1/|P|) Σ_{n∈P} θ_n − h/α.
m_k: every client for backbone and role-form keys, the holders of t for a head of task t; with `per_task` a client
trains one copy per held task, so it counts once per copy that holds k (the paper's devices are our copies).
Keys no update holds keep θ and h. Buffers are averaged with FedAvg's weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from manytask.client.terms import LinearGradient, ParameterTerm
from manytask.client.trainer import TrainHook
from manytask.execution.plan import StateUpdate
from manytask.methods.base import ClientContext, MethodDef
from manytask.methods.client_state import StatePart
from manytask.methods.common.aggregation import Weight
from manytask.methods.common.updates import is_parameter
from manytask.methods.hosts.base import HostClient, HostParams, TrainedCopy
from manytask.methods.hosts.fedprox import ProximalHook
from manytask.methods.hosts.rules import Dynamic, RuleServer, round_delta
from manytask.methods.registry import HOST, register_method
from manytask.models.multitask import is_buffer, state_keys, task_of_key
from manytask.search_space import Space, log_range

GRADIENT_PREFIX = "feddyn_g/"  # client state: g_n per parameter


class FedDynParams(HostParams):
    # ranges for manytask tune: FedDyn's α ∈ {0.1, 0.01, 0.001}
    SEARCH_SPACE: ClassVar[Space] = {"alpha": log_range(1e-3, 0.1)}
    alpha: float = Field(default=0.01, gt=0, description="dynamic regularization strength α")


def inner_product(theta: Tensor, gradient: Tensor) -> Tensor:
    """⟨g_k, θ_k⟩, one parameter's summand of FedDyn's linear term."""
    return (theta * gradient).sum()


INNER_PRODUCT_GRADIENT = LinearGradient(0.0, 1.0)  # ∂⟨g_k, θ_k⟩/∂θ_k = g_k


def linear_term(params: Mapping[str, Tensor], gradients: Mapping[str, Tensor]) -> Tensor:
    """−Σ_k ⟨g_k, θ_k⟩, the linear part of FedDyn's local objective."""
    total = torch.zeros(())
    for name, gradient in gradients.items():
        total = total + inner_product(params[name], gradient)
    return -1.0 * total


def gradient_step(alpha: float) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """g ← g − α (θ − θ_sent) (Algorithm 1, the client's state update), one parameter (or a stack of them)."""

    def step(gradient: Tensor, trained: Tensor, sent: Tensor) -> Tensor:
        return gradient - alpha * (trained - sent)

    return step


def updated_gradients(
    gradients: Mapping[str, Tensor], trained: Mapping[str, Tensor], sent: Mapping[str, Tensor], alpha: float
) -> dict[str, Tensor]:
    """g_n ← g_n − α (θ_n − θ_sent) for every parameter g_n covers."""
    return StateUpdate(dict(gradients), dict(sent), gradient_step(alpha)).apply(dict(trained))


def dynamic_server_step(
    theta: Mapping[str, Tensor], h: Mapping[str, Tensor], deltas: Sequence[Mapping[str, Tensor]],
    weights: Sequence[Mapping[str, Weight]], holders: Mapping[str, int], alpha: float,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(θ, h) after FedDyn's server step (`rules.Dynamic`) over these updates' deltas Δ_n = θ_n − θ_sent."""
    new_theta, state = Dynamic(alpha, holders).step(theta, {"h": dict(h)}, round_delta(deltas, weights))
    return new_theta, state["h"]


class LinearTermHook(ParameterTerm):
    """Adds −⟨g, θ⟩ over the parameters `gradients` holds."""

    def __init__(self, params: Mapping[str, Tensor], gradients: Mapping[str, Tensor]) -> None:
        super().__init__(params, gradients, -1.0, inner_product, INNER_PRODUCT_GRADIENT)


class FedDynClient(HostClient):
    params: FedDynParams

    def regularized(self, copy: TrainedCopy) -> dict[str, Tensor]:
        """The received parameters this copy trains: the ones FedDyn's terms and g_n cover."""
        trained = set(state_keys(copy.model, copy.tasks))
        return {k: v for k, v in copy.received.items() if k in trained and is_parameter(k, v)}

    def gradients(self, ctx: ClientContext, copy: TrainedCopy) -> dict[str, Tensor]:
        """g_n of this copy, zeros before its first round."""
        prefix = copy.state_prefix + GRADIENT_PREFIX
        return {k: ctx.state[prefix + k] if prefix + k in ctx.state else torch.zeros_like(v)
                for k, v in self.regularized(copy).items()}

    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        params = dict(copy.model.named_parameters())
        return [ProximalHook(params, self.regularized(copy), self.params.alpha),
                LinearTermHook(params, self.gradients(ctx, copy))]

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        return {"gradient g": StatePart.of([k for k in keys if not is_buffer(k)],
                                           [c + GRADIENT_PREFIX for c in copies])}

    @cached_property
    def step(self) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        return gradient_step(self.params.alpha)

    def state_update(self, ctx: ClientContext, copy: TrainedCopy) -> StateUpdate:
        """g_n ← g_n − α (θ_n − θ_sent), kept under `feddyn_g/`."""
        return StateUpdate(self.gradients(ctx, copy), self.regularized(copy), self.step, GRADIENT_PREFIX)


class FedDynServer(RuleServer):
    params: FedDynParams

    def build_rule(self) -> Dynamic:
        keys = [k for k, v in self.global_state.items() if is_parameter(k, v)]
        return Dynamic(self.params.alpha, {k: self.holders(k) for k in keys})

    def holders(self, key: str) -> int:
        """m_k: the copies in the federation that train `key` (one per client, or one per held task with
        `per_task`)."""
        task = task_of_key(key)
        if task is not None:
            return sum(task in tasks for tasks in self.setup.holdings.values())
        return sum(len(tasks) if self.params.per_task else 1 for tasks in self.setup.holdings.values())


register_method(
    "feddyn", MethodDef(FedDynClient, FedDynServer, family=HOST), FedDynParams,
    "FedDyn: clients add the dynamic regularizer −⟨g, θ⟩ + α/2‖θ − θ_sent‖², the server corrects by h",
)
