"""TaLoS's sensitivity masks (shared/specs/talos_fl.md): the least sensitive backbone parameters, by the diagonal of
the Fisher information, are the ones sparse fine-tuning may move.

    F_jj = (1/N) Σ_i (∂/∂θ_j log p_θ(ŷ_i | x_i))²,   ŷ_i ~ p_θ(· | x_i)   (one label per example, sampled)

Per-example gradients come from `torch.func` (vmap of grad over a functional call), never a loop over examples.
Iterative calibration over R rounds: round r marks the ρ_r = 1 − (1 − ρ*)^(r/R) fraction of scored entries as
sensitive, keeping every entry an earlier round marked and adding the still-active ones with the highest F (nested
masks: the sensitive set only grows), and soft-zeroes them (× `soft_zero`) before the next round's scores; the
weights are restored afterwards. The rounds run over many clients at once (`nested_calibration`; a round's clients
in talos/batched.py); one label per example is drawn with the algorithm of `torch.multinomial`, so one client's
mask is the same either way up to float rounding. With ρ* of the scored entries sensitive, the final mask keeps
exactly the other d − round(ρ*·d) trainable (True).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from manytask.errors import ManytaskError
from manytask.models.multitask import BACKBONE_PREFIX
from manytask.models.transformers_backbones import eager_attention

# Not scored (nor fine-tuned) by default: embeddings (patch, position), the class token and a transformer's final
# norm; the heads are not backbone parameters at all. Block-internal norms (layernorm_before/after) are scored.
EXCLUDED = re.compile(r"embeddings|cls_token|position|(^|\.)layernorm\.")
Masks = dict[str, Tensor]


def scored_parameters(model: nn.Module, scored: Sequence[str] | None = None, prefix: str = BACKBONE_PREFIX
                      ) -> list[str]:
    """Names of the trainable parameters under `prefix` (the backbone's) TaLoS scores: those matching one of the
    `scored` regular expressions, or by default every one outside `EXCLUDED`."""
    patterns = None if scored is None else [re.compile(p) for p in scored]
    names = []
    for name, param in model.named_parameters():
        if not param.requires_grad or not name.startswith(prefix):
            continue
        wanted = not EXCLUDED.search(name) if patterns is None else any(p.search(name) for p in patterns)
        if wanted:
            names.append(name)
    return names


def exponential_draws(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """q ~ Exp(1) of `shape` from a CPU `generator`: what `torch.multinomial` draws to sample one label per row."""
    return torch.empty(shape).exponential_(1, generator=generator)


def labels_from(probabilities: Tensor, draws: Tensor) -> Tensor:
    """One label per row, argmax p / q with q ~ Exp(1) (`exponential_draws`): a draw from p, exactly what
    `torch.multinomial(p, 1, generator)` returns on the CPU for the same generator (its own algorithm), and
    computable on any device and for many clients at once."""
    return (probabilities / draws.to(probabilities.device)).argmax(dim=-1)


@torch.no_grad()
def sample_labels(model: nn.Module, task: str, x: Tensor, generator: torch.Generator) -> Tensor:
    """One label per example drawn from the model's own predictive distribution p_θ(· | x)."""
    probabilities = torch.softmax(model(x, task).float(), dim=1)
    return labels_from(probabilities, exponential_draws(tuple(probabilities.shape), generator))


def fisher_diagonal(
    model: nn.Module, batches: Iterable[tuple[str, Tensor]], names: Sequence[str], generator: torch.Generator,
    raw_logit: bool = False,
) -> dict[str, Tensor]:
    """F_jj over every example of `batches` ((task, inputs) pairs) for the parameters `names`, with per-example
    gradients of log p(ŷ | x) (or of the raw logit of ŷ, the original TaLoS code's choice). Evaluation mode, so
    BatchNorm uses its running statistics and one example's score never depends on the others."""
    with evaluating(model):
        return _fisher(model, batches, names, generator, raw_logit)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """`model` in evaluation mode with its plain attention (`eager_attention`) within the block."""
    was_training = model.training
    model.eval()
    try:
        with eager_attention(model):
            yield
    finally:
        model.train(was_training)


def log_probability(logits: Tensor, label: Tensor, raw_logit: bool) -> Tensor:
    """One example's score: log p(label | x) from its logits (or the raw logit), written so vmap can batch it."""
    values = logits if raw_logit else torch.log_softmax(logits, dim=0)
    return values.gather(0, label.unsqueeze(0))[0]


def _fisher(
    model: nn.Module, batches: Iterable[tuple[str, Tensor]], names: Sequence[str], generator: torch.Generator,
    raw_logit: bool,
) -> dict[str, Tensor]:
    params = dict(model.named_parameters())
    fixed = {**{n: p.detach() for n, p in params.items() if n not in names}, **dict(model.named_buffers())}
    totals = {n: torch.zeros_like(params[n]) for n in names}
    count = 0
    for task, x in batches:
        y = sample_labels(model, task, x, generator)

        def score(scored: dict[str, Tensor], xi: Tensor, yi: Tensor, task: str = task) -> Tensor:
            logits = functional_call(model, {**fixed, **scored}, (xi.unsqueeze(0), task))[0]
            return log_probability(logits, yi, raw_logit)

        per_example = vmap(grad(score), in_dims=(None, 0, 0))({n: params[n].detach() for n in names}, x, y)
        for name, grads in per_example.items():
            totals[name] += grads.pow(2).sum(dim=0)
        count += len(x)
    return {name: total / max(count, 1) for name, total in totals.items()}


def most_sensitive(scores: Mapping[str, Tensor], fraction: float, per_layer: bool = False) -> Masks:
    """Per client (the scores' first dimension), True on the round(fraction·d) highest scores, over all scored
    entries at once (global ranking) or within each parameter tensor; ties go to the lower index (a stable sort), so
    the choice is deterministic."""
    if per_layer:
        return {name: _top(s.flatten(1), fraction).view_as(s) for name, s in scores.items()}
    return unflatten(_top(flatten(scores, rows=True), fraction), scores, rows=True)


def _top(values: Tensor, fraction: float) -> Tensor:
    """Per row of `values` (clients × entries), True on its round(fraction·d) highest."""
    order = torch.sort(values, dim=1, descending=True, stable=True).indices[:, : round(fraction * values.shape[1])]
    return torch.zeros(values.shape, dtype=torch.bool, device=values.device).scatter_(1, order, True)


def sparsity_at(round_: int, rounds: int, sparsity: float) -> float:
    """ρ_r = 1 − (1 − ρ*)^(r/R) for r = 1..R: the exponential schedule that reaches ρ* at round R."""
    return 1.0 - (1.0 - sparsity) ** (round_ / rounds)


def check_calibration(sparsity: float, rounds: int) -> None:
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity ρ* must lie in [0, 1); got {sparsity}")
    if rounds < 1:
        raise ValueError(f"calibration needs at least one round; got {rounds}")


def nested_calibration(
    scores_at: Callable[[Masks], dict[str, Tensor]], original: Mapping[str, Tensor], sparsity: float, rounds: int,
    soft_zero: float, per_layer: bool,
) -> Masks:
    """TaLoS's iterative calibration of clients at once (every tensor's first dimension is the client): round r
    scores the weights (`scores_at`: F per client, of the `original` weights with the sensitive entries soft-zeroed),
    keeps every entry an earlier round marked sensitive and adds the still-active ones with the highest F up to
    the ρ_r fraction (nested masks), and soft-zeroes them (× `soft_zero`) for the next round. The mask: True on
    the entries left trainable."""
    check_calibration(sparsity, rounds)
    sensitive: Masks = {name: torch.zeros_like(p, dtype=torch.bool) for name, p in original.items()}
    weights = dict(original)
    for r in range(1, rounds + 1):
        scores = scores_at(weights)
        # entries already sensitive rank first: only the still-active ones compete for the round's new places
        ranked = {name: scores[name].masked_fill(sensitive[name], float("inf")) for name in original}
        sensitive = most_sensitive(ranked, sparsity_at(r, rounds, sparsity), per_layer)
        weights = {name: torch.where(sensitive[name], value * soft_zero, value) for name, value in original.items()}
    return {name: ~mask for name, mask in sensitive.items()}


class _AsBackbone(nn.Module):
    """A plain classifier (inputs -> logits) seen as the project's model: its parameters under `backbone.`, its
    forward ignoring the task."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.backbone = module

    def forward(self, x: Tensor, task: str = "") -> Tensor:
        return self.backbone(x)


def calibrate_mask(
    model: nn.Module, batches: Iterable[tuple[str, Tensor] | Tensor], sparsity: float, rounds: int = 10,
    soft_zero: float = 0.01, scored: Sequence[str] | None = None, per_layer: bool = False, raw_logit: bool = False,
    seed: int = 0,
) -> Masks:
    """The TaLoS mask of `model` on calibration `batches`: parameter name -> bool tensor, True = among the least
    sensitive (1 − ρ*) fraction = trainable. The model's weights are as they were after.

    `model` is the project's (a backbone with heads: `batches` are (task, inputs) pairs, and the backbone's
    parameters are scored) or any classifier module taking a batch of inputs to logits (`batches` are input
    tensors, or a DataLoader's (inputs, labels) pairs, whose labels are not read: the Fisher samples the model's
    own predictions; and all its parameters are scored, less `EXCLUDED` or as `scored` says, by its own parameter
    names)."""
    if not hasattr(model, "heads"):
        wrapped = _AsBackbone(model)
        exact = [f"^{re.escape(BACKBONE_PREFIX + name)}$" for name in scored_parameters(model, scored, prefix="")]
        pairs = [("", _inputs_of(b)) for b in batches]
        masks = _calibrate(wrapped, pairs, sparsity, rounds, soft_zero, exact, per_layer, raw_logit, seed)
        return {name.removeprefix(BACKBONE_PREFIX): mask for name, mask in masks.items()}
    return _calibrate(model, list(batches), sparsity, rounds, soft_zero, scored, per_layer, raw_logit, seed)


def _inputs_of(batch: Tensor | Sequence[Any]) -> Tensor:
    """A plain classifier's batch: its inputs alone, the first item of a DataLoader's (inputs, labels, ...), or the
    inputs of a (task, inputs) pair."""
    if isinstance(batch, Tensor):
        return batch
    if isinstance(batch, Sequence) and len(batch) == 2 and isinstance(batch[0], str):  # the project's (task, inputs)
        return batch[1]
    if isinstance(batch, Sequence) and batch and isinstance(batch[0], Tensor):
        return batch[0]
    raise ManytaskError(f"calibrate_mask of a plain module takes batches of input tensors or (inputs, labels) pairs "
                        f"as a DataLoader yields them, not {type(batch).__name__}.")


def _calibrate(model: nn.Module, batches: Sequence[tuple[str, Tensor]], sparsity: float, rounds: int,
               soft_zero: float, scored: Sequence[str] | None, per_layer: bool, raw_logit: bool, seed: int) -> Masks:
    check_calibration(sparsity, rounds)
    names = scored_parameters(model, scored)
    params = dict(model.named_parameters())
    original = {name: params[name].detach().clone() for name in names}
    generator = torch.Generator().manual_seed(seed)

    def scores_at(weights: Masks) -> dict[str, Tensor]:
        with torch.no_grad():
            for name in names:
                params[name].copy_(weights[name][0])
        return {n: f.unsqueeze(0) for n, f in fisher_diagonal(model, batches, names, generator, raw_logit).items()}

    try:
        masks = nested_calibration(scores_at, {n: v.unsqueeze(0) for n, v in original.items()}, sparsity, rounds,
                                   soft_zero, per_layer)
    finally:
        with torch.no_grad():
            for name in names:
                params[name].copy_(original[name])
    return {name: mask[0] for name, mask in masks.items()}


def flatten(tensors: Mapping[str, Tensor], rows: bool = False) -> Tensor:
    """All entries in one vector: parameter order, then row-major; with `rows`, one such vector per row of the
    tensors' first dimension (clients × entries)."""
    return torch.cat([t.flatten(1) if rows else t.flatten() for t in tensors.values()], dim=-1)


def unflatten(flat: Tensor, like: Mapping[str, Tensor], rows: bool = False) -> dict[str, Tensor]:
    """Inverse of `flatten`, shaped like the tensors of `like` (same names, same order)."""
    sizes = [t[0].numel() if rows else t.numel() for t in like.values()]
    pieces = flat.split(sizes, dim=-1)
    return {name: piece.reshape(t.shape) for (name, t), piece in zip(like.items(), pieces, strict=True)}


def pack_masks(masks: Mapping[str, Tensor]) -> Tensor:
    """All masks as one bit per entry (uint8, in `masks` order): how a client keeps its mask between rounds. Packed
    on the host in numpy (no op on the device)."""
    return torch.from_numpy(np.packbits(np.concatenate([m.cpu().numpy().ravel() for m in masks.values()])))


def unpack_masks(bits: Tensor, like: Mapping[str, Tensor]) -> Masks:
    """Inverse of `pack_masks`, shaped like the tensors of `like` (same names, same order), on the host."""
    sizes = [t.numel() for t in like.values()]
    flat = np.unpackbits(bits.cpu().numpy(), count=sum(sizes)).astype(np.bool_)
    pieces = np.split(flat, np.cumsum(sizes)[:-1])
    return {name: torch.from_numpy(piece.reshape(t.shape)) for (name, t), piece in zip(like.items(), pieces,
                                                                                       strict=True)}
