"""The first-order Taylor expansion of a model around its starting point (Ortiz-Jimenez et al., 2023):

    f_lin(x; θ) = f(x; θ0) + J_θ f(x; θ0) · (θ − θ0)

over the backbone's trainable parameters (the adapters when the backbone is frozen); heads stay as they are
(they are linear already). The Jacobian-vector product is computed in forward mode with `torch.func.jvp`, and
gradients flow to θ through the tangent θ − θ0."""

from __future__ import annotations

from torch import Tensor, nn
from torch.func import functional_call, jvp

from manytask.models.multitask import MultiTaskModel


class Linearized(nn.Module):
    def __init__(self, model: MultiTaskModel) -> None:
        super().__init__()
        self.model = model
        self.names = [n for n, p in model.backbone.named_parameters() if p.requires_grad]
        self.start = {n: p.detach().clone() for n, p in model.backbone.named_parameters() if p.requires_grad}

    def features(self, x: Tensor) -> Tensor:
        backbone = self.model.backbone
        current = dict(backbone.named_parameters())
        frozen = {n: p for n, p in current.items() if n not in self.start}
        frozen.update(dict(backbone.named_buffers()))

        def f(trainable: dict[str, Tensor]) -> Tensor:
            return functional_call(backbone, {**frozen, **trainable}, (x,))

        delta = {n: current[n] - self.start[n] for n in self.names}
        value, tangent = jvp(f, (self.start,), (delta,))
        return value + tangent

    def forward(self, x: Tensor, task: str) -> Tensor:
        return self.forward_with_features(x, task)[0]

    def forward_with_features(self, x: Tensor, task: str) -> tuple[Tensor, Tensor]:
        features = self.features(x)
        return self.model.heads[task](features), features
