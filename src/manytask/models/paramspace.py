"""`ParamSpace`: a named subset of a model's parameters <-> one flat vector, both ways, exactly.

Task vectors, masks, top-k selection and sign statistics all operate on these flat vectors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn


class ParamSpace:
    def __init__(self, shapes: Mapping[str, torch.Size | tuple[int, ...]]) -> None:
        self.names = list(shapes)
        self.shapes = {n: torch.Size(s) for n, s in shapes.items()}
        self.numels = [self.shapes[n].numel() for n in self.names]
        self.dim = sum(self.numels)

    @classmethod
    def of(cls, model: nn.Module, include: Callable[[str], bool] | Iterable[str] | None = None) -> ParamSpace:
        """The space of `model`'s parameters selected by a name predicate or name list (all when None)."""
        if include is None:
            keep: Callable[[str], bool] = lambda name: True  # noqa: E731
        elif callable(include):
            keep = include
        else:
            chosen = set(include)
            keep = chosen.__contains__
        return cls({n: p.shape for n, p in model.named_parameters() if keep(n)})

    def flatten(self, tensors: Mapping[str, Tensor] | nn.Module) -> Tensor:
        """Concatenate the space's tensors (from a state dict or a model) into one float vector."""
        source = dict(tensors.named_parameters()) if isinstance(tensors, nn.Module) else tensors
        if not self.names:
            return torch.zeros(0)
        return torch.cat([source[n].detach().reshape(-1) for n in self.names])

    def flatten_many(self, states: Sequence[Mapping[str, Tensor]]) -> Tensor:
        """`flatten` of every state, as the rows of one ``[len(states), dim]`` matrix (one stack per tensor and one
        concatenation, whatever the number of states)."""
        if not self.names:
            return torch.zeros(len(states), 0)
        return torch.cat([torch.stack([state[n].detach() for state in states]).reshape(len(states), -1)
                          for n in self.names], dim=1)

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """Split a flat vector back into named tensors of the original shapes (copies)."""
        return {n: v.clone() for n, v in self.views(vector).items()}

    def views(self, vector: Tensor) -> dict[str, Tensor]:
        """`unflatten` as views into `vector`, for a reader that copies what it keeps."""
        if vector.numel() != self.dim:
            raise ValueError(f"vector has {vector.numel()} entries, the space has {self.dim}")
        chunks = torch.split(vector, self.numels)
        return {n: c.view(self.shapes[n]) for n, c in zip(self.names, chunks, strict=True)}

    def assign(self, model: nn.Module, vector: Tensor) -> None:
        """Write a flat vector into the model's parameters in place."""
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in self.unflatten(vector).items():
                params[name].copy_(value)
