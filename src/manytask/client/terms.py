"""Loss terms on the parameters alone, written once for one client and for a stack of clients.

A `ParameterTerm` is scale · Σ_k piece(θ_k, a_k) over the parameters k it covers, with one operand a_k per
parameter (FedProx's anchor θ_global, FedDyn's gradient g). `piece` is the only place the term's arithmetic is
written: the sequential trainer sums it over one client's parameters (`loss`), and the batched executor maps the
same function over the rows of stacked parameters with `torch.func.vmap` (`stacked_loss`). A term may also give its
piece's gradient in θ where it is linear in θ and the operand (`LinearGradient`); the batched executor then adds it
to the stacked gradients in place instead of differentiating the term: a proximal term's autograd graph allocates and
passes over every parameter several times a step, the in-place sum twice."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor
from torch.func import vmap

from manytask.client.trainer import StepContext, TrainHook

Piece = Callable[[Tensor, Tensor], Tensor]  # (a parameter, its operand) -> its scalar summand
Move = Callable[[Tensor, Tensor], Tensor]  # (an operand, its parameter) -> the operand's next value


class LinearGradient(NamedTuple):
    """∂piece(θ_k, a_k)/∂θ_k = theta · θ_k + operand · a_k, for a piece whose gradient is linear in both."""
    theta: float
    operand: float


def squared_distance(theta: Tensor, anchor: Tensor) -> Tensor:
    """‖θ_k − a_k‖², one parameter's summand of a proximal term (FedProx's, pFedMe's)."""
    return (theta - anchor).pow(2).sum()


SQUARED_DISTANCE_GRADIENT = LinearGradient(2.0, -2.0)  # ∂‖θ − a‖²/∂θ = 2θ − 2a


class ParameterTerm(TrainHook):
    """scale · Σ_k piece(θ_k, a_k) over the parameters (by state-dict name, as trained) that `operands` holds;
    `gradient`, where given, is ∂piece/∂θ (`LinearGradient`)."""

    def __init__(self, params: Mapping[str, Tensor], operands: Mapping[str, Tensor], scale: float,
                 piece: Piece, gradient: LinearGradient | None = None) -> None:
        self.params = dict(params)
        self.operands = {k: v for k, v in operands.items() if k in self.params}
        self.scale = scale
        self.piece = piece
        self.gradient = gradient

    def loss(self, step: StepContext) -> Tensor | None:
        if self.scale == 0:
            return None
        total = torch.zeros(())
        for name, operand in self.operands.items():
            total = total + self.piece(self.params[name], operand)
        return self.scale * total

    def stacked_loss(self, params: Mapping[str, Tensor], operands: Mapping[str, Tensor],
                     present: Mapping[str, Tensor]) -> Tensor:
        """The sum over stacked rows of this term: `params[k]` and `operands[k]` are stacked, (rows, ...), and
        `present[k]`, (rows,), is 1 where a row's term covers k, 0 elsewhere."""
        total = torch.zeros((), device=next(iter(params.values())).device)
        for name, operand in operands.items():
            total = total + (vmap(self.piece)(params[name], operand) * present[name]).sum()
        return self.scale * total


class MovingParameterTerm(ParameterTerm):
    """A `ParameterTerm` whose operands move as training goes: after every `every` steps, a_k ← move(a_k, θ_k)
    (pFedMe's local model w, which follows its personalized θ after each mini-batch's K steps). The batched
    executor moves the stacked operands itself and returns them (`PlanResult.moved`); a program training one
    client at a time runs the same `move`."""

    def __init__(self, params: Mapping[str, Tensor], operands: Mapping[str, Tensor], scale: float, piece: Piece,
                 move: Move, every: int, gradient: LinearGradient | None = None) -> None:
        super().__init__(params, operands, scale, piece, gradient)
        self.move = move
        self.every = every


class FeatureTerm(TrainHook, ABC):
    """A loss term on the backbone features of every batch a step trains on, against frozen models the client
    holds (MOON's model-contrastive term): scale · Σ over the step's batches of the batch mean of
    `per_sample(z, anchor_zs)`, with z = `module`(features) of the model being trained and anchor_zs[i] =
    `module`(backbone(x)) of frozen anchor i (in eval mode, no gradient). The batched executor evaluates it for a
    stack of clients from `anchors` (each a list of states loaded in order over the initial model); the sequential
    trainer calls `loss`."""

    module: str  # the model's submodule applied to features; it trains with the model
    anchors: list[list[Mapping[str, Tensor]]]
    scale: float

    @abstractmethod
    def per_sample(self, z: Tensor, anchor_zs: list[Tensor]) -> Tensor:
        """The term of each sample of one batch, (batch,)."""


StatePiece = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class FeatureStateTerm(TrainHook):
    """A loss term on each batch's backbone features and labels that carries a state of its own from step to step
    (SFMTL-Graph's class anchors): scale · Σ over the step's batches of `piece`'s loss, where
    `piece(features, labels, mask, state) -> (loss, new state)` (mask: 1 on the batch's real samples) is the only
    place the arithmetic is written. The sequential trainer calls `loss`, which moves `state`; the batched executor
    maps `piece` over the rows of the clients' stacked states with `torch.func.vmap`, so it must not read a value
    back to the host."""

    def __init__(self, state: Tensor, scale: float, piece: StatePiece) -> None:
        self.state = state
        self.scale = scale
        self.piece = piece

    def loss(self, step: StepContext) -> Tensor | None:
        total = None
        for task, (_, y) in step.batches.items():
            features = step.features[task]
            mask = torch.ones(y.shape, dtype=features.dtype, device=features.device)
            loss, self.state = self.piece(features, y, mask, self.state)
            total = loss if total is None else total + loss
        return None if total is None else self.scale * total
