"""Where client training runs (`device: auto | cpu | cuda | cuda:N`).

`auto` is the first GPU when torch sees one, else the CPU; `cuda:N` is GPU N. Client programs that support a device
(the host methods, the plug-ins over them, SFMTL-Graph, FedU, pFedMe and the private-model references) build their
models there, receive their data, payloads and state there, and train there. The clients' data, the test sets and
the client states stay there between calls while they fit (`engine/resident.py`); what crosses the wire and what a
checkpoint stores is copied to host memory as it is written, so messages, byte counts and checkpoints do not depend
on the device. Servers aggregate on the CPU."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from manytask.errors import ManytaskError

DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"  # what a config's `device` may say
CPU = torch.device("cpu")


def resolve_device(name: str) -> torch.device:
    """The torch device a config's `device` names; `cuda` without a usable GPU, or `cuda:N` past the GPUs torch
    sees, is an error, not a silent run elsewhere."""
    if name == "cpu":
        return CPU
    if torch.cuda.is_available():
        if name == "auto":
            return torch.device("cuda")
        device = torch.device(name)
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ManytaskError(f"device: {name}, but torch sees {count} GPU{'s' if count != 1 else ''} "
                                f"(cuda:0 to cuda:{count - 1}); name one of them, or use device: cuda.")
        return device
    if name == "auto":
        return CPU
    built = "built without CUDA" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    raise ManytaskError(f"device: {name}, but torch ({torch.__version__}, {built}) sees no CUDA GPU; use device: "
                        "auto or cpu, or install a CUDA build of torch on a machine with a GPU.")


def on_device(tensors: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    """The same named tensors on `device` (the very tensors where they are there already)."""
    return {k: v.to(device) for k, v in tensors.items()}
