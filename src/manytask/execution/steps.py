"""The optimizer side of a batched local step: each row of a stacked parameter is one client's tensor, and every
operation here is row-wise, so each client gets exactly the update its own optimizer would give it (up to float
rounding), in a number of operations that does not grow with the clients.

- `clip_per_client`: `torch.nn.utils.clip_grad_norm_` per client, its norm over all of that client's gradients;
- `BatchedSGD`: `torch.optim.SGD` (momentum, coupled weight decay; no dampening, no Nesterov), or under masks
  `SparseSGDM` (client/optimizers.py);
- `BatchedAdamW`: `torch.optim.AdamW` with its defaults (betas 0.9/0.999, eps 1e-8) and the config's weight decay.
Each step moves the rows still training, a prefix of every stack: the optimizer's state is kept for all rows and
stepped on the same prefix (rows only ever stop)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from manytask.client.trainer import TrainConfig

CLIP_EPS = 1e-6  # clip_grad_norm_'s


def _rows(per_row: Tensor, like: Tensor) -> Tensor:
    """A (rows,) tensor shaped to broadcast against a stacked (rows, ...) tensor."""
    return per_row.view(-1, *([1] * (like.dim() - 1)))


def clip_per_client(grads: list[Tensor], clients: Sequence[Tensor | None], count: int, max_norm: float) -> list[Tensor]:
    """Every client's gradients scaled, in place, by min(1, max_norm / (‖g_client‖ + 1e-6)), its norm taken over
    all its rows of all leaves; `clients[i]` maps leaf i's rows to clients (None: row r is client r). Leaves whose
    rows belong to the same clients (the backbone's; one head group's) are summed and scaled together: one norm per
    leaf (no copy of a gradient), a few ops per group."""
    squares = torch.zeros(count, dtype=grads[0].dtype, device=grads[0].device)
    groups = _owner_groups(clients)
    for owner, members in groups:
        if not grads[members[0]].shape[0]:  # a head group none of whose pairs trains at this step
            continue
        norms = torch.stack([_row_norms(grads[i]) for i in members])
        per_row = norms.square().sum(0)
        squares = squares + per_row if owner is None else squares.index_add(0, owner, per_row)
    coef = (max_norm / (squares.sqrt() + CLIP_EPS)).clamp(max=1.0)
    for owner, members in groups:  # in place: the gradients are this step's own
        own = coef if owner is None else coef.index_select(0, owner)
        for i in members:
            grads[i].mul_(_rows(own, grads[i]))
    return grads


def _row_norms(grad: Tensor) -> Tensor:
    """‖row‖₂ of every row of a stacked gradient, without copying a strided one."""
    return torch.linalg.vector_norm(grad, dim=tuple(range(1, grad.dim()))) if grad.dim() > 1 else grad.abs()


def _owner_groups(clients: Sequence[Tensor | None]) -> list[tuple[Tensor | None, list[int]]]:
    """The leaves by the clients of their rows: views of one owner tensor (the same storage and length) are one."""
    groups: dict[tuple[int, int] | None, tuple[Tensor | None, list[int]]] = {}
    for i, owner in enumerate(clients):
        key = None if owner is None else (owner.data_ptr(), owner.shape[0])
        groups.setdefault(key, (owner, []))[1].append(i)
    return list(groups.values())


class BatchedSGD:
    """With `masks` (per leaf, each row's 0/1 mask, or None), `SparseSGDM`: the decayed gradient is masked before
    the momentum, so a masked entry never moves."""

    def __init__(self, config: TrainConfig, lr: float, masks: list[Tensor | None] | None = None) -> None:
        self.lr, self.momentum, self.weight_decay = lr, config.momentum, config.weight_decay
        self.masks = masks
        self.buffers: list[Tensor] = []

    def step(self, params: list[Tensor], grads: list[Tensor]) -> None:
        """One step of the rows in `params` (prefix views of the stacks) with their gradients."""
        with torch.no_grad():
            if self.weight_decay:
                grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
            if self.masks is not None:  # the gradients are this step's own: masked in place
                masked = [(g, m[: len(g)]) for g, m in zip(grads, self.masks, strict=True) if m is not None]
                torch._foreach_mul_([g for g, _ in masked], [m for _, m in masked])
            if self.momentum:
                if not self.buffers:  # the first step's gradients become the buffers (autograd made them for it)
                    self.buffers = grads
                else:
                    prefix = _prefix(self.buffers, grads)
                    torch._foreach_mul_(prefix, self.momentum)
                    torch._foreach_add_(prefix, grads)
                grads = _prefix(self.buffers, grads)
            torch._foreach_add_(params, grads, alpha=-self.lr)


class BatchedAdamW:
    def __init__(self, config: TrainConfig, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.lr, self.weight_decay, self.betas, self.eps = lr, config.weight_decay, betas, eps
        self.first: list[Tensor] = []
        self.second: list[Tensor] = []
        self.steps = 0

    def step(self, params: list[Tensor], grads: list[Tensor]) -> None:
        """One step of the rows in `params` (prefix views of the stacks) with their gradients."""
        beta1, beta2 = self.betas
        with torch.no_grad():
            if not self.first:  # the first step trains every row
                self.first = [torch.zeros_like(p) for p in params]
                self.second = [torch.zeros_like(p) for p in params]
            first, second = _prefix(self.first, grads), _prefix(self.second, grads)
            self.steps += 1  # every row still training has taken as many steps: rows only ever stop
            if self.weight_decay:
                torch._foreach_mul_(params, 1 - self.lr * self.weight_decay)
            torch._foreach_lerp_(first, grads, 1 - beta1)
            torch._foreach_mul_(second, beta2)
            torch._foreach_addcmul_(second, grads, grads, 1 - beta2)
            correction1 = 1 - beta1 ** self.steps
            root2 = math.sqrt(1 - beta2 ** self.steps)
            denominators = torch._foreach_sqrt(second)
            torch._foreach_div_(denominators, root2)
            torch._foreach_add_(denominators, self.eps)
            updates = torch._foreach_div(first, denominators)
            torch._foreach_add_(params, updates, alpha=-self.lr / correction1)


def _prefix(state: list[Tensor], like: list[Tensor]) -> list[Tensor]:
    """Views of the optimizer's state on the rows `like` covers (a prefix)."""
    return [s[: len(t)] for s, t in zip(state, like, strict=True)]


def batched_optimizer(config: TrainConfig, lr: float, masks: list[Tensor | None] | None = None
                      ) -> BatchedSGD | BatchedAdamW:
    """The config's optimizer, or `SparseSGDM` (SGD with momentum under masks) where the plans bring masks."""
    if masks is None and config.optimizer == "adamw":
        return BatchedAdamW(config, lr)
    return BatchedSGD(config, lr, masks)
