"""`ModelPool`: the models a client program trains, built once per process and reset between clients instead of
built again (building and seeding a model per client per round was most of the engine's overhead, issue 16)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from manytask.methods.base import ClientContext
from manytask.models.multitask import MultiTaskModel, load_state, overwritten


class ModelPool:
    """The models one client program trains, built once and reset between clients instead of built again.

    A reset copies the initial values of every parameter and buffer back and restores the requires_grad flags, so a
    taken model is its `build_model()` in its initial state, bit for bit, at a fraction of the cost of building and
    seeding a new one. Models taken while serving one client context stay distinct; all of them are free again once
    the program serves another context (programs run one client call at a time)."""

    def __init__(self, build: Callable[[], tuple[MultiTaskModel, nn.Module]]) -> None:
        self.build = build
        self.free: list[_Pooled] = []
        self.taken: list[_Pooled] = []
        self.owner: ClientContext | None = None

    def take(self, ctx: ClientContext, state: Mapping[str, Tensor] | None = None
             ) -> tuple[MultiTaskModel, nn.Module]:
        """A model in its initial state with `state` loaded over it (`load_state`); the tensors the load overwrites
        are not reset first (a host's payload is most of its model: copying it twice was a sequential round's
        largest overhead over a bare loop after the aggregation)."""
        if ctx is not self.owner:
            self.free += self.taken
            self.taken, self.owner = [], ctx
        if self.free:
            pooled = self.free.pop()
            pooled.reset(skip=set(map(id, overwritten(pooled.model, state or {}))))
        else:
            pooled = _Pooled(*self.build())
        load_state(pooled.model, state or {})
        self.taken.append(pooled)
        return pooled.model, pooled.module


class _Pooled:
    """A built model and what resetting it needs: its tensors with their initial values, its parameters' flags."""

    def __init__(self, model: MultiTaskModel, module: nn.Module) -> None:
        self.model, self.module = model, module
        parts = (model, module)
        params = list({id(p): p for part in parts for p in part.parameters()}.values())
        tensors = params + list({id(b): b for part in parts for b in part.buffers()}.values())
        self.initial = [(t, t.detach().clone()) for t in tensors]
        self.flags = [(p, p.requires_grad) for p in params]

    def reset(self, skip: set[int]) -> None:
        """Back to the initial values, but for the tensors whose ids are in `skip` (about to be overwritten)."""
        with torch.no_grad():
            for tensor, value in self.initial:
                if id(tensor) not in skip:
                    tensor.copy_(value)
        for param, flag in self.flags:
            param.requires_grad_(flag)
            param.grad = None
