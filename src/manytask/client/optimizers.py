"""Optimizers the trainer builds through a factory: the config's SGD/AdamW, and `SparseSGDM`, SGD with momentum
and weight decay under a fixed mask whose masked entries never move (FL + TaLoS, shared/specs/talos_fl.md).

A factory takes the named trainable parameters and the round's lr, so a method can pick an optimizer per
parameter name (a mask per parameter, groups) without copying the training loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor, nn

NamedParameters = list[tuple[str, nn.Parameter]]
OptimizerFactory = Callable[[NamedParameters, float], torch.optim.Optimizer]


def config_optimizer(name: str, momentum: float, weight_decay: float) -> OptimizerFactory:
    """The factory of a run's `train.optimizer`: SGD (momentum, weight decay) or AdamW (weight decay)."""

    def build(named: NamedParameters, lr: float) -> torch.optim.Optimizer:
        params = [p for _, p in named]
        if name == "adamw":
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)

    return build


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
                self.state[param]["mask"] = masks[name].to(torch.bool)

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
