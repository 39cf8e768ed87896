"""LoRA adapters on a backbone's linear layers; the pretrained weights stay frozen.

Two implementations behind one call. Backbones built on Hugging Face `transformers` (vit, swin) get peft's LoRA
(`inject_adapter_in_model`), which knows those models. The small offline backbones (mlp, cnn) get `LoRALinear`
below: peft imports transformers, which costs seconds per process, and Flower starts a fresh ClientApp process
for every message. Both name their parameters `...lora_A...` / `...lora_B...`, initialize B to zero (so a fresh
adapter changes nothing) and draw A from a seed, so task vectors are comparable across clients.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor, nn

from manytask.errors import ManytaskError
from manytask.registry import Params
from manytask.seeding import seed_global_rng

ADAPTER_MARK = "lora_"


class LoraParams(Params):
    rank: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    targets: list[str] | None = Field(default=None, description="linear layer names; None: every linear layer")


class LoRALinear(nn.Module):
    """y = W x + b + (alpha / r) · B A x, with W, b frozen and A, B trainable (Hu et al., 2021, eq. 3)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scaling = alpha / rank
        for param in base.parameters():
            param.requires_grad = False

    def forward(self, x: Tensor) -> Tensor:
        return self.base_layer(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scaling


def is_adapter(name: str) -> bool:
    return ADAPTER_MARK in name


def add_lora(backbone: nn.Module, params: LoraParams, seed: int) -> None:
    """Put LoRA on the backbone's linear layers (in place) and freeze all its other parameters."""
    with torch.random.fork_rng(devices=[]):
        seed_global_rng(seed)
        if getattr(backbone, "uses_peft", False):  # peft matches target names as suffixes
            _add_peft_lora(backbone, params, params.targets or backbone.lora_targets)
        else:
            linear = [n for n, m in backbone.named_modules() if isinstance(m, nn.Linear)]
            unknown = [t for t in params.targets or [] if t not in linear]
            if unknown:
                raise ManytaskError(f"LoRA target '{unknown[0]}' is not a linear layer of the backbone; "
                                    f"its linear layers: {', '.join(linear)}.")
            for name in params.targets or linear:
                _replace(backbone, name, LoRALinear(backbone.get_submodule(name), params.rank, params.alpha))
    for name, param in backbone.named_parameters():
        param.requires_grad = is_adapter(name)


def _add_peft_lora(backbone: nn.Module, params: LoraParams, targets: list[str]) -> None:
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=params.rank, lora_alpha=params.alpha, target_modules=targets, bias="none")
    inject_adapter_in_model(config, backbone)


def _replace(root: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, module)
