"""Optimizers the trainer builds through a factory: the config's SGD/AdamW, and `SparseSGDM`, SGD with momentum
and weight decay under a fixed mask whose masked entries never move (FL + TaLoS, shared/specs/talos_fl.md).

A factory takes the named trainable parameters and the round's lr, so a method can pick an optimizer per
parameter name (a mask per parameter, groups) without copying the training loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import torch
from torch import Tensor, nn

NamedParameters = list[tuple[str, nn.Parameter]]


class LocalOptimizer(Protocol):
    """What the trainer needs of an optimizer."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> object: ...


OptimizerFactory = Callable[[NamedParameters, float], LocalOptimizer]


def config_optimizer(name: str, momentum: float, weight_decay: float) -> OptimizerFactory:
    """The factory of a run's `train.optimizer`: SGD (momentum, weight decay) or AdamW (weight decay)."""

    def build(named: NamedParameters, lr: float) -> LocalOptimizer:
        params = [p for _, p in named]
        if name == "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        return PlainSGD(params, lr, momentum, weight_decay)

    return build


class PlainSGD:
    """`torch.optim.SGD(params, lr, momentum, weight_decay)` (no dampening, no Nesterov) with the arithmetic of its
    per-tensor path, operation for operation, so it gives torch's numbers bit for bit (tests/test_trainer.py). It
    leaves out the optimizer machinery (parameter groups, profiler and compiler hooks around `step`, state dicts)
    that cost more than a small client's whole step; only the trainer's local loop uses it."""

    def __init__(self, params: list[nn.Parameter], lr: float, momentum: float, weight_decay: float) -> None:
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.buffers: list[Tensor | None] = [None] * len(params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None

    def step(self) -> None:
        with torch.no_grad():
            for i, param in enumerate(self.params):
                grad = param.grad
                if grad is None:
                    continue
                if self.weight_decay:
                    grad = grad.add(param, alpha=self.weight_decay)
                if self.momentum:
                    buffer = self.buffers[i]
                    if buffer is None:
                        buffer = self.buffers[i] = torch.clone(grad).detach()
                    else:
                        buffer.mul_(self.momentum).add_(grad)
                    grad = buffer
                param.add_(grad, alpha=-self.lr)


class SparseSGDM(torch.optim.Optimizer):
    """SGD with momentum and (coupled) weight decay that only ever moves the entries where `mask` is True:
        g ← (∇ + wd·θ) ⊙ m,   v ← μ·v + g,   θ ← θ − lr·v   (entries with m = 0: g = v = 0, θ unchanged).
    Masking the gradient in a hook is not enough: weight decay and momentum would still move masked weights.
    Parameters without a mask are trained densely."""

    def __init__(
        self, named: Iterable[tuple[str, nn.Parameter]], masks: Mapping[str, Tensor], lr: float,
        momentum: float = 0.9, weight_decay: float = 0.0,
    ) -> None:
        named = list(named)
        unknown = sorted(set(masks) - {n for n, _ in named})
        if unknown:
            raise ValueError(f"masks for parameters that are not trained: {unknown[:3]}")
        super().__init__([p for _, p in named], {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})
        for name, param in named:
            if name in masks:
                if masks[name].shape != param.shape:
                    raise ValueError(f"mask of '{name}' has shape {tuple(masks[name].shape)}, not {tuple(param.shape)}")
                self.state[param]["mask"] = masks[name].to(device=param.device, dtype=torch.bool)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                grad = param.grad.add(param, alpha=group["weight_decay"]) if group["weight_decay"] else param.grad
                if "mask" in state:
                    grad = grad * state["mask"]
                if group["momentum"]:
                    buffer = state.get("momentum_buffer")
                    buffer = grad.clone() if buffer is None else buffer.mul_(group["momentum"]).add_(grad)
                    state["momentum_buffer"] = buffer
                    grad = buffer
                param.add_(grad, alpha=-group["lr"])
        return loss


def sparse_sgdm(masks: Mapping[str, Tensor], momentum: float, weight_decay: float) -> OptimizerFactory:
    """The factory of a `SparseSGDM` under fixed `masks` (the round's lr comes from the trainer)."""

    def build(named: NamedParameters, lr: float) -> torch.optim.Optimizer:
        return SparseSGDM(named, masks, lr, momentum, weight_decay)

    return build
