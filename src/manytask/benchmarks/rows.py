"""Dataset rows into tensors: what `Benchmark.from_datasets` accepts, and one sentence for what it does not.

A row is an `(input, label)` pair or a mapping with named fields (the rows of a Hugging Face `datasets.Dataset`).
An input is a tensor, a numpy array, a nested list of numbers, or a PIL image. PIL images become channels-first
floats in [0, 1], as torchvision's `ToTensor` makes them (a grey image gets one channel); uint8 arrays and tensors
are scaled to [0, 1] in their own layout; other numbers are kept as they are. A label is an integer."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from manytask.errors import ManytaskError, clipped

INPUT_KEYS = ("image", "img", "pixel_values", "input", "inputs", "x", "features")
LABEL_KEYS = ("label", "labels", "y", "target")


def materialize(rows: Any, where: str, input_key: str | None = None, label_key: str | None = None
                ) -> tuple[Tensor, Tensor]:
    """(inputs, labels) of every row of `rows` (anything with `len` and integer indexing), stacked; `where` names
    the dataset in errors (`task 'digit', train split`)."""
    try:
        count = len(rows)
    except TypeError:
        raise ManytaskError(f"{where}: a dataset must have a length and rows by index (a torch Dataset, a list, a "
                            f"Hugging Face Dataset), not {type(rows).__name__}.") from None
    if count == 0:
        raise ManytaskError(f"{where} has no rows.")
    inputs, labels = [], []
    for i in range(count):
        x, y = split_row(rows[i], f"{where}, row {i}", input_key, label_key)
        inputs.append(as_input(x, f"{where}, row {i}"))
        labels.append(as_label(y, f"{where}, row {i}"))
    shapes = {tuple(x.shape) for x in inputs}
    if len(shapes) != 1:
        first = tuple(inputs[0].shape)
        odd = next(i for i, x in enumerate(inputs) if tuple(x.shape) != first)
        raise ManytaskError(f"{where}: every input must have one shape, but row 0 has {first} and row {odd} "
                            f"{tuple(inputs[odd].shape)}; resize them first.")
    return torch.stack(inputs), torch.tensor(labels, dtype=torch.long)


def split_row(row: Any, where: str, input_key: str | None, label_key: str | None) -> tuple[Any, Any]:
    """A row's (input, label): the pair itself, or the named fields of a mapping."""
    if isinstance(row, Mapping):
        return row[_field(row, input_key, INPUT_KEYS, "input", where)], row[_field(row, label_key, LABEL_KEYS,
                                                                                  "label", where)]
    if isinstance(row, Sequence) and not isinstance(row, (str, bytes)) and len(row) == 2:
        return row[0], row[1]
    raise ManytaskError(f"{where} is a {type(row).__name__}; a row is an (input, label) pair or a mapping with an "
                        "input and a label field.")


def _field(row: Mapping, given: str | None, known: tuple[str, ...], role: str, where: str) -> str:
    if given is not None:
        if given not in row:
            raise ManytaskError(f"{where} has no field '{clipped(given)}' (its fields: {', '.join(map(str, row))}).")
        return given
    found = [k for k in known if k in row]
    if len(found) != 1:
        what = "several" if found else "no"
        raise ManytaskError(f"{where} has {what} {role} field{'s' if found else ''} among "
                            f"{', '.join(map(str, row))}; name it with {role}_key=.")
    return found[0]


def as_input(x: Any, where: str) -> Tensor:
    """One input as a float32 tensor (see the module's docstring for the conversions)."""
    if _is_pil(x):
        array = np.asarray(x)
        image = torch.from_numpy(array.copy()).float() / (255.0 if array.dtype == np.uint8 else 1.0)
        return image.unsqueeze(0) if image.ndim == 2 else image.permute(2, 0, 1).contiguous()
    if isinstance(x, Tensor):
        tensor = x.detach().cpu()
    elif isinstance(x, np.ndarray) or (isinstance(x, list) and x):
        try:
            tensor = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError, RuntimeError):
            tensor = None
        if tensor is None or not (tensor.dtype.is_floating_point or _is_integer(tensor) or tensor.dtype == torch.bool):
            raise ManytaskError(f"{where}: its input is not an array of numbers (got {clipped(repr(x))}).")
    else:
        raise ManytaskError(f"{where}: its input is a {type(x).__name__}; give a tensor, a numpy array, a list of "
                            "numbers or a PIL image.")
    if tensor.dtype == torch.uint8:
        return tensor.float() / 255.0
    if tensor.is_complex():
        raise ManytaskError(f"{where}: its input is complex; give real numbers.")
    return tensor.float()


def as_label(y: Any, where: str) -> int:
    """One class label as an int: an integer, a numpy integer, or a one-element integer tensor or array."""
    if (isinstance(y, Tensor) and y.numel() == 1) or (isinstance(y, np.ndarray) and y.size == 1):
        y = y.item()
    if isinstance(y, bool) or not isinstance(y, numbers.Integral):
        raise ManytaskError(f"{where}: its label must be a class index, an integer (got {clipped(repr(y))}).")
    if y < 0:
        raise ManytaskError(f"{where}: its label {y} is negative; class indices start at 0.")
    return int(y)


def _is_pil(x: Any) -> bool:
    return type(x).__module__.startswith("PIL.") and hasattr(x, "mode") and hasattr(x, "size")


def _is_integer(tensor: Tensor) -> bool:
    return not tensor.dtype.is_floating_point and not tensor.is_complex() and tensor.dtype != torch.bool
