"""The first-order Taylor expansion of a model around its starting point (Ortiz-Jimenez et al., 2023):

    f_lin(x; θ) = f(x; θ0) + J_θ f(x; θ0) · (θ − θ0)

over the backbone's trainable parameters (the adapters when the backbone is frozen); heads stay as they are
(linear layers already; a dense task's decoder reads the linearized feature pyramid). The Jacobian-vector product
is computed in forward mode with `torch.func.jvp`, and gradients flow to θ through the tangent θ − θ0."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.func import functional_call, jvp

from manytask.errors import ManytaskError
from manytask.models.decoders import Pyramid
from manytask.models.multitask import MultiTaskModel


class Linearized(nn.Module):
    def __init__(self, model: MultiTaskModel) -> None:
        super().__init__()
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.backbone.modules()):
            raise ManytaskError("a linearized backbone cannot have BatchNorm layers (their running statistics change "
                                "inside the Jacobian-vector product); build it with norm: none.")
        self.model = model
        self.names = [n for n, p in model.backbone.named_parameters() if p.requires_grad]
        self.start = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if p.requires_grad}

    def _apply(self, fn: Any, recurse: bool = True) -> Linearized:
        """`to`, `cuda`, `float`, ...: θ0 goes where the parameters go (it is no parameter or buffer: it must not
        travel in the model's state)."""
        super()._apply(fn, recurse)
        self.start = {n: fn(t) for n, t in self.start.items()}
        return self

    def features(self, x: Tensor) -> Tensor:
        return self._linearized(self.model.backbone, x)

    def pyramid(self, x: Tensor) -> list[Tensor]:
        return self._linearized(Pyramid(self.model.backbone), x)

    def _linearized(self, module: nn.Module, x: Tensor) -> Any:
        """f(x; θ0) + J f(x; θ0)·(θ − θ0) of `module` (the backbone, or a view of it), over the backbone's trainable
        parameters; works for any pytree of outputs (a feature vector, a list of maps)."""
        backbone = self.model.backbone
        prefix = "" if module is backbone else Pyramid.PREFIX
        current = dict(backbone.named_parameters())
        frozen = {prefix + n: p for n, p in current.items() if n not in self.start}
        frozen.update({prefix + n: b for n, b in backbone.named_buffers()})

        def f(trainable: dict[str, Tensor]) -> Any:
            return functional_call(module, {**frozen, **{prefix + n: p for n, p in trainable.items()}}, (x,))

        delta = {n: current[n] - self.start[n] for n in self.names}
        value, tangent = jvp(f, (self.start,), (delta,))
        if isinstance(value, Tensor):
            return value + tangent
        return [v + t for v, t in zip(value, tangent, strict=True)]

    def forward(self, x: Tensor, task: str) -> Tensor:
        return self.forward_with_features(x, task)[0]

    def forward_with_features(self, x: Tensor, task: str) -> tuple[Tensor, Tensor]:
        if task in self.model.dense:
            return self.model.decode(task, self.pyramid(x), x)
        features = self.features(x)
        return self.model.heads[task](features), features
