"""`MultiTaskModel`: one shared backbone plus one head per task (label spaces differ across tasks).

A task's head follows its kind: a linear layer on the backbone's feature vector for classification and
regression, an FCN decoder on the backbone's feature pyramid for dense tasks (`models/decoders.py`). A backbone
that only serves dense tasks drops its vector projection (`drop_vector_features`), so no weight travels that no
task trains."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor, nn

from manytask.errors import ManytaskError
from manytask.models.backbones import BACKBONES
from manytask.models.decoders import DecoderParams, FCNDecoder, supports_dense
from manytask.models.keyed_dropout import key_dropout
from manytask.seeding import seed_global_rng
from manytask.tasks.task import TaskSpec

BACKBONE_PREFIX = "backbone."
HEAD_PREFIX = "heads."
ROLE_HEAD_PREFIX = "head."  # a one-task client's only head, whatever its task's name ("role form")
BUFFER_PREFIX = "buffer/"  # buffers (BN running statistics) travel and are kept under this mark + their name


class MultiTaskModel(nn.Module):
    def __init__(
        self, backbone: nn.Module, specs: Mapping[str, TaskSpec], decoder: DecoderParams | None = None
    ) -> None:
        super().__init__()
        for name in specs:
            if "." in name:
                raise ValueError(f"task name '{name}' may not contain '.'")
        dense = [name for name, spec in specs.items() if spec.is_dense]
        if dense and not supports_dense(backbone):
            raise ManytaskError(
                f"dense tasks ({', '.join(dense)}) need an encoder with a feature pyramid (cnn, resnet18, swin); "
                f"the {type(backbone).__name__} backbone has none."
            )
        if dense and len(dense) == len(specs) and hasattr(backbone, "drop_vector_features"):
            backbone.drop_vector_features()
        self.backbone = backbone
        self.head_input = getattr(backbone, "head_input", None) or nn.Identity()  # ReLU before heads of signed features
        self.dense = frozenset(dense)
        self.heads = nn.ModuleDict({name: self._head(spec, decoder or DecoderParams()) for name, spec in specs.items()})

    def _head(self, spec: TaskSpec, decoder: DecoderParams) -> nn.Module:
        if spec.is_dense:
            return FCNDecoder(list(self.backbone.pyramid_channels), spec.num_outputs, decoder)
        return nn.Linear(self.backbone.out_features, spec.num_outputs)

    def forward(self, x: Tensor, task: str) -> Tensor:
        return self.forward_with_features(x, task)[0]

    def forward_with_features(self, x: Tensor, task: str) -> tuple[Tensor, Tensor]:
        """(the task head's outputs, the backbone features they were computed from). For a dense task the
        features are the deepest pyramid level, average-pooled (what MOON contrasts)."""
        if task in self.dense:
            return self.decode(task, self.backbone.pyramid(x), x)
        features = self.backbone(x)
        return self.heads[task](self.head_input(features)), features

    def forward_many(self, x: Tensor, tasks: Sequence[str]) -> dict[str, tuple[Tensor, Tensor]]:
        """`forward_with_features` of several tasks on one batch, running the encoder once (an all-in-one
        multi-task model: one image, every decoder)."""
        dense = [t for t in tasks if t in self.dense]
        maps = self.backbone.pyramid(x) if dense else None
        features = self.backbone(x) if len(dense) < len(tasks) else None
        opened = None if features is None else self.head_input(features)
        return {t: self.decode(t, maps, x) if t in self.dense else (self.heads[t](opened), features) for t in tasks}

    def decode(self, task: str, maps: list[Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        """A dense task's map at the size of `x` from the encoder's pyramid, and the pooled deepest level."""
        return self.heads[task](maps, tuple(x.shape[-2:])), maps[-1].mean(dim=(2, 3))


def head_prefix(task: str) -> str:
    """State-dict prefix of one task's head."""
    return f"{HEAD_PREFIX}{task}."


@lru_cache(maxsize=1 << 16)  # asked for every key of every message; a model has few distinct keys
def task_of_key(key: str) -> str | None:
    """The task a parameter (or marked buffer) belongs to, or None for shared (backbone) ones."""
    key = key.removeprefix(BUFFER_PREFIX)
    return key[len(HEAD_PREFIX) :].split(".", 1)[0] if key.startswith(HEAD_PREFIX) else None


def is_buffer(key: str) -> bool:
    return key.startswith(BUFFER_PREFIX)


class _Named:
    """A model's named tensors, walked once: parameters and buffers in model order, and what `load_state_dict`
    would fill (parameters and persistent buffers). Kept on the model (`model_tensors`): a built model's module
    tree does not change, and walking it on every send, load and upload was a large part of a small client's round."""

    def __init__(self, model: nn.Module) -> None:
        self.parameters = list(model.named_parameters())
        self.buffers = list(model.named_buffers())
        self.loadable = dict(model.state_dict(keep_vars=True))
        self.plain_loading = all(_loads_plainly(m) for m in model.modules())


def _loads_plainly(module: nn.Module) -> bool:
    """True when loading into `module` is a copy per tensor: no load hooks, and no loading logic of its own other
    than BatchNorm's (which only fills a missing `num_batches_tracked`)."""
    own = type(module)._load_from_state_dict
    default = own is nn.Module._load_from_state_dict or own is nn.modules.batchnorm._NormBase._load_from_state_dict
    return default and not module._load_state_dict_pre_hooks and not module._load_state_dict_post_hooks


def model_tensors(model: nn.Module) -> _Named:
    named = model.__dict__.get("_manytask_named")
    if named is None:
        named = model.__dict__["_manytask_named"] = _Named(model)
    return named


def state_keys(model: nn.Module, tasks: Iterable[str] | None = None) -> list[str]:
    """The keys `trainable_state` returns, without copying anything."""
    wanted = None if tasks is None else set(tasks)

    def kept(key: str) -> bool:
        return (task := task_of_key(key)) is None or wanted is None or task in wanted

    named = model_tensors(model)
    keys = [key for key, p in named.parameters if p.requires_grad and kept(key)]
    return keys + [BUFFER_PREFIX + key for key, _ in named.buffers if kept(key)]


def trainable_state(model: nn.Module, tasks: Iterable[str] | None = None) -> dict[str, Tensor]:
    """A detached copy of what training changes: the trainable parameters, shared ones (backbone, or only its
    adapters when the backbone is frozen) and the heads of `tasks` (all heads when None), then the buffers of the
    same parts (BN running statistics) as `buffer/<name>`. This is what methods send and keep; frozen pretrained
    weights are known to both sides and never travel."""
    named = model_tensors(model)
    values = {**dict(named.parameters), **{BUFFER_PREFIX + k: b for k, b in named.buffers}}
    return {key: values[key].detach().clone() for key in state_keys(model, tasks)}


def load_state(model: nn.Module, state: Mapping[str, Tensor]) -> list[str]:
    """Load parameters and marked buffers into `model` (keys it lacks are ignored, missing ones left as they
    are); returns the keys the model does not have. Exactly `load_state_dict(strict=False)`, done as one copy per
    tensor where the model has no loading logic of its own."""
    plain = {key.removeprefix(BUFFER_PREFIX): value for key, value in state.items()}
    named = model_tensors(model)
    if not named.plain_loading:
        return model.load_state_dict(plain, strict=False).unexpected_keys
    unexpected = [key for key in plain if key not in named.loadable]
    with torch.no_grad():
        for key, value in plain.items():
            target = named.loadable.get(key)
            if target is not None:
                target.copy_(_fitted(key, target, value))
    return unexpected


def overwritten(model: nn.Module, state: Mapping[str, Tensor]) -> list[Tensor]:
    """The model's tensors that `load_state(model, state)` overwrites whole (none where the model has loading logic
    of its own: what it writes is its business)."""
    named = model_tensors(model)
    if not named.plain_loading:
        return []
    targets = (named.loadable.get(key.removeprefix(BUFFER_PREFIX)) for key in state)
    return [t for t in targets if t is not None]


def merged_state(base: Mapping[str, Tensor], *states: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`base` (a model's tensors by name) with each of `states` loaded over it in turn, exactly as `load_state`
    would load them into that model: keys it lacks are ignored, a one-element vector fills a scalar, values take the
    target's dtype and device, and a shape mismatch is an error. Nothing is copied that need not be."""
    merged = dict(base)
    for state in states:
        for key, value in state.items():
            key = key.removeprefix(BUFFER_PREFIX)
            target = merged.get(key)
            if target is not None:
                merged[key] = _fitted(key, target, value).to(dtype=target.dtype, device=target.device)
    return merged


def _fitted(key: str, target: Tensor, value: Tensor) -> Tensor:
    """`value` as `load_state_dict` would copy it into `target`: a one-element vector fills a scalar (its rule for
    scalars stored that way), any other shape mismatch is an error."""
    if target.dim() == 0 and value.shape == (1,):
        value = value[0]
    if target.shape != value.shape:
        raise RuntimeError(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, "
                           f"the shape in the current model is {tuple(target.shape)}.")
    return value


def build_model(
    backbone: str, backbone_params: Mapping[str, Any], input_shape: tuple[int, ...],
    specs: Mapping[str, TaskSpec], seed: int, decoder: Mapping[str, Any] | None = None,
) -> MultiTaskModel:
    """Build the model with weights drawn from `seed` alone (the global RNG is left untouched); `decoder` holds
    the dense decoders' params (`DecoderParams`)."""
    entry = BACKBONES.get(backbone)
    params = BACKBONES.parse_params(backbone, dict(backbone_params))
    with torch.random.fork_rng(devices=[]):
        seed_global_rng(seed)
        model = MultiTaskModel(entry.target(tuple(input_shape), params), specs, DecoderParams(**(decoder or {})))
    key_dropout(model)  # random layers draw from a key: a client's masks alone or batched (models/keyed_dropout.py)
    return model


def to_role(state: Mapping[str, Tensor], task: str) -> dict[str, Tensor]:
    """`heads.<task>.*` -> `head.*`, shared (backbone) keys unchanged: the role form in which models of one-task
    clients whose tasks share one label space compare and average across clients."""
    prefix = head_prefix(task)
    return {ROLE_HEAD_PREFIX + k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def to_task(state: Mapping[str, Tensor], task: str) -> dict[str, Tensor]:
    """Inverse of `to_role`: `head.*` -> `heads.<task>.*`."""
    return {head_prefix(task) + k[len(ROLE_HEAD_PREFIX):] if k.startswith(ROLE_HEAD_PREFIX) else k: v
            for k, v in state.items()}
