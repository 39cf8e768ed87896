"""The update convention: which arrays of a reply are trained versions of which arrays the server sent, their
deltas, and the sparse codecs that carry deltas cheaply.

- Parameters travel under their model state-dict names in both directions; buffers (BN running statistics) under
  `buffer/<state-dict name>` (`models.multitask.BUFFER_PREFIX`), so aggregators and plug-ins can tell them apart.
- A `per_task` reply holds one trained copy of the shared part per held task, as `copy/<task>/<name>`, plus the
  task's own head under its plain name. `reference_key` maps any reply key to the key it was sent under, and
  `copy_groups` splits a reply into its copies.
- Role form (`head.*`, one-task clients sharing one head) uses the same role names both ways.
So a wrapper sees (reference, trained) pairs for every parameter without knowing which host produced them.

Sparse codecs, per array `name` (the encoder picks the cheaper on the wire; booleans travel as packed bits):
- bitmap: `sparse/<name>/mask` (bool, the array's shape) + `sparse/<name>/values` (the kept entries, row-major);
- indices: `sparse/<name>/index` (int32 flat positions) + `sparse/<name>/values`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from manytask.models.multitask import is_buffer, task_of_key

COPY_PREFIX = "copy/"
SPARSE_PREFIX = "sparse/"
MASK, INDEX, VALUES = "mask", "index", "values"


def copy_key(task: str, key: str) -> str:
    """The reply key of a shared entry in `task`'s per-task copy."""
    return f"{COPY_PREFIX}{task}/{key}"


def reference_key(key: str) -> str:
    """The key a reply entry was sent under: `copy/<task>/<name>` -> `<name>`, anything else unchanged."""
    if key.startswith(COPY_PREFIX):
        return key[len(COPY_PREFIX) :].split("/", 1)[1]
    return key


def copy_groups(keys: Iterable[str]) -> dict[str | None, list[str]]:
    """Reply keys grouped by the trained copy they belong to, copies sorted by task: {None: all keys} for a joint
    reply; for a `per_task` reply, each task's `copy/<task>/…` keys followed by that task's head keys."""
    keys = list(keys)
    tasks = sorted({k[len(COPY_PREFIX) :].split("/", 1)[0] for k in keys if k.startswith(COPY_PREFIX)})
    if not tasks:
        return {None: keys}
    groups: dict[str | None, list[str]] = {task: [] for task in tasks}
    for task in tasks:
        prefix = f"{COPY_PREFIX}{task}/"
        groups[task] += [k for k in keys if k.startswith(prefix)]
        groups[task] += [k for k in keys if not k.startswith(COPY_PREFIX) and task_of_key(k) == task]
    return groups


def is_parameter(key: str, value: Tensor) -> bool:
    """A floating-point parameter (not a buffer): what deltas, masks and projections apply to."""
    return value.is_floating_point() and not is_buffer(reference_key(key))


def delta(sent: Mapping[str, Tensor], reply: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """trained − reference for every parameter of `reply` that was sent (keys as in the reply), computed where the
    reply lies: on the host in numpy (no kernel launch per array), on a device there."""
    return {k: _difference(v, sent[reference_key(k)]) for k, v in reply.items()
            if reference_key(k) in sent and is_parameter(k, v)}


def _difference(value: Tensor, reference: Tensor) -> Tensor:
    if value.is_cpu:
        return torch.from_numpy(_host(value) - _host(reference))
    return value - reference.to(value.device)


def squared_norm(values: Tensor) -> Tensor:
    """‖values‖₂² in float64, as a tensor where `values` lies (read back by the caller, once for many)."""
    wide = values.reshape(-1).double()
    return torch.dot(wide, wide)


def delta_norm(deltas: Mapping[str, Tensor]) -> float:
    """‖Δ‖ = sqrt(Σ_k ‖Δ_k‖²) over all the keys of an update, in float64, the keys' terms added on the host in key
    order (an update on a device is read back once)."""
    squares = [v.double().square().sum() for v in deltas.values()]
    on_device = bool(squares) and not squares[0].is_cpu
    return math.sqrt(sum(torch.stack(squares).tolist() if on_device else map(float, squares)))


def apply(state: Mapping[str, Tensor], deltas: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """reference + delta for every delta (keys as in `deltas`; the reference is found through `reference_key`)."""
    out = {}
    for key, change in deltas.items():
        reference = state[reference_key(key)]
        out[key] = (reference + change).to(reference.dtype)
    return out


@dataclass
class Update:
    """One trained copy of the model that a client uploaded, against what the server sent it. Keys are the
    reference (sent) keys; `weights` are the aggregation weight of every key, a float or a tensor of per-entry
    weights, which plug-ins may change before the host aggregates."""

    client: int
    sizes: dict[str, int]  # task -> |D_n^t| of the tasks this copy trained
    reference: dict[str, Tensor]
    trained: dict[str, Tensor]
    weights: dict[str, float | Tensor]
    scalars: dict[str, object] = field(default_factory=dict)  # the reply's scalars
    copy: str | None = None  # the task of a per-task copy; None for a joint one

    def deltas(self) -> dict[str, Tensor]:
        """trained − reference for every parameter (buffers and integers left out)."""
        return delta(self.reference, self.trained)

    def with_deltas(self, deltas: Mapping[str, Tensor]) -> Update:
        """A copy whose parameters in `deltas` are reference + delta (the others unchanged)."""
        trained = {**self.trained, **apply(self.reference, deltas)}
        return Update(self.client, self.sizes, self.reference, trained, dict(self.weights), self.scalars, self.copy)


def _bitmap_is_cheaper(numel: int, kept: int) -> bool:
    return math.ceil(numel / 8) <= 4 * kept  # packed mask bytes vs int32 index bytes; values cost the same


def encode_sparse(name: str, dense: Tensor | np.ndarray) -> dict[str, Tensor]:
    """The nonzero entries of `dense` as wire arrays under `sparse/<name>/…`, bitmap or indices, whichever is
    smaller. Host arrays (numpy): wire work, no kernel launches."""
    array = _host(dense)
    flat = array.reshape(-1)
    positions = np.flatnonzero(flat)
    prefix = f"{SPARSE_PREFIX}{name}/"
    if _bitmap_is_cheaper(flat.size, positions.size):
        arrays = {prefix + MASK: array != 0, prefix + VALUES: flat[positions]}
    else:
        arrays = {prefix + INDEX: positions.astype(np.int32), prefix + VALUES: flat[positions]}
    return {key: torch.from_numpy(value) for key, value in arrays.items()}


def encode_sparse_on_device(name: str, dense: Tensor, count: int) -> dict[str, Tensor]:
    """`encode_sparse` of a tensor on its device, whose nonzero entries (`count`, read by the caller) are known: the
    same arrays, left on the device, with no read back."""
    flat = dense.reshape(-1)
    positions = torch.nonzero_static(flat, size=count).reshape(-1)
    prefix = f"{SPARSE_PREFIX}{name}/"
    values = flat.index_select(0, positions)
    if _bitmap_is_cheaper(flat.numel(), count):
        return {prefix + MASK: dense != 0, prefix + VALUES: values}
    return {prefix + INDEX: positions.to(torch.int32), prefix + VALUES: values}


def _host(value: Tensor | np.ndarray) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, Tensor) else value


def sparse_names(arrays: Iterable[str]) -> list[str]:
    """The names carried sparsely in a message's arrays, in order."""
    names = [a[len(SPARSE_PREFIX) :].rsplit("/", 1)[0] for a in arrays if a.startswith(SPARSE_PREFIX)]
    return list(dict.fromkeys(names))


def _sparse_parts(arrays: Mapping[str, Tensor], name: str, shape: torch.Size
                  ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(values, mask or None, index or None) of a sparsely sent array, their shapes and dtypes checked (metadata
    only: nothing is read)."""
    prefix = f"{SPARSE_PREFIX}{name}/"
    values = arrays[prefix + VALUES]
    if values.dim() != 1:
        raise ValueError(f"sparse '{name}': values of shape {tuple(values.shape)}, expected one dimension")
    if prefix + MASK in arrays:
        mask = arrays[prefix + MASK]
        if tuple(mask.shape) != tuple(shape) or mask.dtype != torch.bool:
            raise ValueError(f"sparse '{name}': mask of {mask.dtype} {tuple(mask.shape)}, expected bool {tuple(shape)}")
        return values, mask, None
    index = arrays[prefix + INDEX]
    if index.dim() != 1 or index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"sparse '{name}': index of {index.dtype} {tuple(index.shape)}, expected 1-D integers")
    return values, None, index


def decode_sparse(arrays: Mapping[str, Tensor], name: str, shape: torch.Size) -> Tensor:
    """Inverse of `encode_sparse`: the dense tensor of `shape` (zeros where nothing was sent), built on the host."""
    sent_values, mask, index = _sparse_parts(arrays, name, shape)
    values = _host(sent_values)
    dense = np.zeros(math.prod(shape), dtype=values.dtype)
    positions = np.flatnonzero(_host(mask)) if mask is not None else _host(index).astype(np.int64)
    if len(positions) != len(values) or (len(positions) and (positions.min() < 0 or positions.max() >= len(dense))):
        raise ValueError(f"sparse '{name}': {len(values)} values for {len(positions)} positions, or out of range")
    dense[positions] = values
    return torch.from_numpy(dense.reshape(tuple(shape)))


def _decode_sparse_on_device(arrays: Mapping[str, Tensor], name: str, shape: torch.Size) -> tuple[Tensor, Tensor]:
    """`decode_sparse` of arrays on a device, there: (the dense tensor, whether the arrays were consistent), with the
    same checks; those on values (a mask's count, the indices' range) stay a tensor, so nothing is read back."""
    values, mask, index = _sparse_parts(arrays, name, shape)
    size = math.prod(shape)
    if mask is not None:
        positions = torch.nonzero_static(mask.reshape(-1), size=len(values)).reshape(-1)
        consistent = mask.sum() == len(values)
    else:
        assert index is not None
        if len(index) != len(values):
            raise ValueError(f"sparse '{name}': {len(values)} values for {len(index)} positions")
        positions = index.long()
        consistent = ((positions >= 0) & (positions < size)).all()
    positions = positions.clamp(0, max(size - 1, 0))  # an inconsistent reply is refused, never indexed out of range
    dense = torch.zeros(size, dtype=values.dtype, device=values.device).index_put_((positions,), values)
    return dense.reshape(tuple(shape)), consistent


def densify(arrays: Mapping[str, Tensor], sent: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A reply's arrays with every sparsely sent delta replaced by reference + delta (dense arrays unchanged),
    computed on the host, or on the device where the reply lies (its consistency checks then read back once)."""
    names = sparse_names(arrays)
    dense = {k: v for k, v in arrays.items() if not k.startswith(SPARSE_PREFIX)}
    if names and not arrays[f"{SPARSE_PREFIX}{names[0]}/{VALUES}"].is_cpu:
        return {**dense, **_densify_on_device(arrays, sent, names)}
    restored = {}
    for name in names:
        reference = _host(sent[reference_key(name)])
        change = decode_sparse(arrays, name, torch.Size(reference.shape)).numpy()
        restored[name] = torch.from_numpy((reference + change).astype(reference.dtype, copy=False))
    return {**dense, **restored}


def _densify_on_device(arrays: Mapping[str, Tensor], sent: Mapping[str, Tensor], names: list[str]
                       ) -> dict[str, Tensor]:
    restored, checks = {}, []
    for name in names:
        reference = sent[reference_key(name)]
        change, consistent = _decode_sparse_on_device(arrays, name, reference.shape)
        restored[name] = (reference.to(change.device) + change).to(reference.dtype)
        checks.append(consistent)
    if not bool(torch.stack(checks).all()):  # one read per reply
        raise ValueError("sparse arrays inconsistent: a mask's count differs from its values', or an index is out "
                         "of range")
    return restored
