"""What the batched-executor tests share."""

import itertools

import torch


def before_norm(model: torch.nn.Module) -> set[str]:
    """Biases of the layers right before a BatchNorm, and that BatchNorm's running mean: the bias's gradient is zero
    up to rounding, which Adam's normalization amplifies into steps of ±lr in either path, so they are not compared
    under AdamW."""
    names = set()
    for prefix, module in model.named_modules():
        children = list(module.named_children())
        for (name, layer), (norm, following) in itertools.pairwise(children):
            if isinstance(following, torch.nn.modules.batchnorm._BatchNorm) and layer.bias is not None:
                names |= {f"{prefix}.{name}.bias", f"buffer/{prefix}.{norm}.running_mean"}
    return names
