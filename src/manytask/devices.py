"""Where client training runs (`device: auto | cpu | cuda`).

`auto` is the GPU when torch sees one, else the CPU. Client programs that support a device (the host methods, the
plug-ins over them, SFMTL-Graph, FedU, pFedMe and the private-model references) build their models there, receive
their data, payloads and state there, and train there; what crosses the wire is still serialized from CPU arrays,
and client state is handed back on the CPU, so messages, byte counts and checkpoints do not depend on the device.
Servers aggregate on the CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor

from manytask.errors import ManytaskError

DeviceName = Literal["auto", "cpu", "cuda"]
CPU = torch.device("cpu")


def resolve_device(name: DeviceName) -> torch.device:
    """The torch device a config's `device` names; `cuda` without a usable GPU is an error, not a silent CPU run."""
    if name == "cpu":
        return CPU
    if torch.cuda.is_available():
        return torch.device("cuda")
    if name == "auto":
        return CPU
    built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    raise ManytaskError(f"device: cuda, but torch ({torch.__version__}, {built}) sees no CUDA GPU; use device: auto "
                        "or cpu, or install a CUDA build of torch on a machine with a GPU.")


def on_device(tensors: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """The same named tensors on `device` (the very tensors where they are there already)."""
    return {k: v.to(device) for k, v in tensors.items()}
