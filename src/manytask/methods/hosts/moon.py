"""MOON (Li, He & Song, CVPR 2021, "Model-Contrastive Federated Learning"): FedAvg whose clients add a
model-contrastive term that pulls the representation of the local model towards the global model's and away from
the client's previous local model's.

Client rule (paper eq. 3-4): for every held task t and batch x, with z = P(f(x)) the projected backbone features of
the model being trained, z_glob and z_prev the same through frozen copies (eval mode, no gradient) of the received
global model and of the client's model after its previous round (the received model before its first round),
    ℓ_t = −log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) ),  averaged over the batch,
and the local loss is Σ_t L_t + μ·Σ_t ℓ_t. Server rule: FedAvg's.

The projection head P (Linear(width, width) → ReLU → Linear(width, projection_dim), the paper's two-layer head) is a
submodule `projection` of the model on both sides, so it trains, travels and is averaged like the backbone. Our
models keep one head per task on the backbone features (the paper's classifier sits on the projection instead): here
the projection feeds the contrastive term only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from manytask.client.terms import FeatureTerm
from manytask.client.trainer import StepContext, TrainHook
from manytask.methods.base import ClientContext, MethodDef
from manytask.methods.client_state import StatePart
from manytask.methods.hosts.base import HostClient, HostModel, HostParams, TrainedCopy
from manytask.methods.hosts.server import HostServer
from manytask.methods.registry import HOST, register_method
from manytask.models.multitask import MultiTaskModel, load_state, task_of_key
from manytask.search_space import Space, log_range, uniform
from manytask.seeding import derive_seed, seed_global_rng

PREVIOUS = "moon/previous/"  # client state: the client's model after its previous round (shared part)


class MoonParams(HostParams):
    # ranges for manytask tune: MOON sweeps μ over {0.1, 1, 5, 10}
    SEARCH_SPACE: ClassVar[Space] = {"mu": log_range(0.1, 10.0), "temperature": uniform(0.1, 1.0)}
    mu: float = Field(default=1.0, ge=0, description="weight μ of the model-contrastive term")
    temperature: float = Field(default=0.5, gt=0, description="temperature τ of the model-contrastive term")
    projection_dim: int = Field(default=256, ge=1, description="output width of the projection head")


def contrastive_logits(z: Tensor, z_glob: Tensor, z_prev: Tensor, temperature: float) -> Tensor:
    """[cos(z, z_glob), cos(z, z_prev)]/τ per sample, (batch, 2): the global model's representation is class 0."""
    return torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)],
                       dim=1) / temperature


def model_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor, temperature: float) -> Tensor:
    """MOON eq. 3 averaged over the batch, ℓ = −log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} +
    e^{cos(z, z_prev)/τ}) ): cross-entropy over `contrastive_logits`, the global model's representation being the
    positive."""
    return F.cross_entropy(contrastive_logits(z, z_glob, z_prev, temperature), torch.zeros(len(z), dtype=torch.long))


def projection_head(width: int, projection_dim: int, seed: int) -> nn.Sequential:
    """The paper's two-layer projection head, drawn from `seed` alone (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        seed_global_rng(seed)
        return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, projection_dim))


def representation(model: MultiTaskModel, x: Tensor) -> Tensor:
    """z = P(f(x)): the projected backbone features."""
    return model.projection(model.backbone(x))


class MoonModel(HostModel):
    """The model with its projection head; the same seed on both sides, so the server's initial head is every
    client's."""

    params: MoonParams

    def build_model(self) -> tuple[MultiTaskModel, nn.Module]:
        model = self.setup.build_model()
        seed = derive_seed(self.setup.seed, "moon-projection")
        model.projection = projection_head(model.backbone.out_features, self.params.projection_dim, seed)
        return model, model


class ModelContrastiveHook(FeatureTerm):
    """μ·Σ_t ℓ_t over the step's tasks, from the features of the forward pass already done (no second forward of
    the trained model); the global and previous models are frozen, built from their states when first needed."""

    module = "projection"

    def __init__(self, model: MultiTaskModel, anchors: list[list[dict[str, Tensor]]],
                 build: Callable[[], MultiTaskModel], params: MoonParams) -> None:
        self.model = model
        self.anchors = anchors  # the global model's state, then the previous model's states over it
        self.build = build
        self.scale = self.mu = params.mu
        self.temperature = params.temperature

    @cached_property
    def frozen(self) -> list[MultiTaskModel]:
        models = []
        for states in self.anchors:
            model = self.build()
            for state in states:
                load_state(model, state)
            models.append(model.eval().requires_grad_(False))
        return models

    def loss(self, step: StepContext) -> Tensor | None:
        if self.mu == 0:
            return None
        total = torch.zeros(())
        for task, features in step.features.items():
            x = step.batches[task][0]
            with torch.no_grad():
                z_glob, z_prev = (representation(anchor, x) for anchor in self.frozen)
            z = self.model.projection(features)
            total = total + model_contrastive_loss(z, z_glob, z_prev, self.temperature)
        return self.mu * total

    def per_sample(self, z: Tensor, anchor_zs: list[Tensor]) -> Tensor:
        z_glob, z_prev = anchor_zs
        logits = contrastive_logits(z, z_glob, z_prev, self.temperature)
        return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device), reduction="none")


class MoonClient(MoonModel, HostClient):
    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        prefix = copy.state_prefix + PREVIOUS
        previous = {k[len(prefix):]: v for k, v in ctx.state.items() if k.startswith(prefix)}
        build = self.build_model_only
        return [ModelContrastiveHook(copy.model, [[copy.received], [copy.received, previous]], build, self.params)]

    def build_model_only(self) -> MultiTaskModel:
        return self.build_model()[0]

    def kept(self, copy: TrainedCopy, keys: Sequence[str]) -> tuple[str, list[str]]:
        """The trained model's shared part (backbone, projection, their buffers): the next round's z_prev."""
        return PREVIOUS, shared_keys(keys)

    def state_parts(self, copies: tuple[str, ...], keys: list[str]) -> dict[str, StatePart]:
        return {"previous model": StatePart.of(shared_keys(keys), [c + PREVIOUS for c in copies])}


def shared_keys(keys: Sequence[str]) -> list[str]:
    return [k for k in keys if task_of_key(k) is None]


class MoonServer(MoonModel, HostServer):
    pass


register_method(
    "moon", MethodDef(MoonClient, MoonServer, family=HOST), MoonParams,
    "MOON: FedAvg with a model-contrastive term (global model positive, previous local model negative)",
)
