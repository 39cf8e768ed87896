"""`vit` and `swin`: Vision Transformer and Swin Transformer backbones built with Hugging Face `transformers`.

The model is built from a config whose fields are the backbone's params (defaults: ViT-B/32 and Swin-T), with
random weights unless `weights` names a LOCAL checkpoint (nothing is ever downloaded):

- a directory written by `save_pretrained` (`config.json` + `model.safetensors`). When the directory has its own
  `config.json`, that config wins over the architecture params (image_size, hidden_size, dropout, ...); only
  the preprocessing params (mean, std) are kept from the params.
- a `.safetensors` or `.bin` file holding a state dict for the architecture the params describe. Keys may carry
  the task-model prefix (`vit.`, `swin.`) and may use the names of transformers 4 (`encoder.layer.N.attention.
  attention.query`); transformers renames them on load.

The feature is the pooled output: ViT's [CLS] token after the final layer norm, Swin's average-pooled last stage.
Swin also gives dense tasks `pyramid(x)`: every stage's feature map, finest first (`pyramid_channels`).
Inputs are float images `[B, C, H, W]` in [0, 1] with 1 or 3 channels; `prepare_images` repeats gray images to
3 channels, resizes to the model's `image_size` and normalizes (CLIP statistics for vit, ImageNet for swin).

`transformers` is optional: it is imported only when a backbone is built, so `manytask list` shows both
backbones without it. `LORA_TARGETS` names the `nn.Linear` modules LoRA adapters should wrap (transformers 5
names: attention `q_proj`/`k_proj`/`v_proj`/`o_proj`, MLP `fc1`/`fc2`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator, model_validator
from torch import Tensor, nn

from manytask.errors import ManytaskError
from manytask.extras import require
from manytask.models.backbones import BACKBONES
from manytask.models.keyed_dropout import KEYED_ATTENTION
from manytask.registry import Params

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Suffixes of the nn.Linear modules in every transformer block (transformers 5 names), for LoRA's target_modules.
LORA_TARGETS: dict[str, list[str]] = {
    "vit": ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"],
    "swin": ["q_proj", "k_proj", "v_proj", "o_proj", "fc1", "fc2"],
}

Triple = tuple[float, float, float]


def prepare_images(x: Tensor, size: int, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """`[B, C, H, W]` floats → `[B, 3, size, size]`: gray repeated to RGB, bilinear resize if needed, normalized."""
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"expected images of shape [B, 1 or 3, H, W], got {tuple(x.shape)}")
    x = x.float()
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if tuple(x.shape[-2:]) != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    mean_t = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std_t = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean_t) / std_t


class TransformersParams(Params):
    """A backbone built with Hugging Face transformers: its params refuse to validate without it, so a config naming
    it stops before anything is written."""

    @model_validator(mode="after")
    def _installed(self) -> TransformersParams:
        _import_transformers()
        return self


class ViTParams(TransformersParams):
    image_size: int = Field(224, ge=1)
    patch_size: int = Field(32, ge=1)
    hidden_size: int = Field(768, ge=1)
    num_hidden_layers: int = Field(12, ge=1)
    num_attention_heads: int = Field(12, ge=1)
    intermediate_size: int = Field(3072, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    mean: Triple = CLIP_MEAN
    std: Triple = CLIP_STD
    weights: str | None = None

    @field_validator("num_attention_heads")
    @classmethod
    def _heads_divide_width(cls, heads: int, info: ValidationInfo) -> int:
        width = info.data.get("hidden_size")
        if width is not None and width % heads:
            raise ValueError(f"hidden_size {width} must be divisible by num_attention_heads")
        return heads


class SwinParams(TransformersParams):
    image_size: int = Field(224, ge=1)
    patch_size: int = Field(4, ge=1)
    embed_dim: int = Field(96, ge=1)
    depths: list[int] = Field(default=[2, 2, 6, 2], min_length=1)
    num_heads: list[int] = Field(default=[3, 6, 12, 24], min_length=1)
    window_size: int = Field(7, ge=1)
    drop_path_rate: float = Field(0.0, ge=0, lt=1)
    mean: Triple = IMAGENET_MEAN
    std: Triple = IMAGENET_STD
    weights: str | None = None

    @field_validator("depths")
    @classmethod
    def _positive_depths(cls, depths: list[int]) -> list[int]:
        if any(d < 1 for d in depths):
            raise ValueError("every stage needs at least one block")
        return depths

    @field_validator("num_heads")
    @classmethod
    def _heads_per_stage(cls, heads: list[int], info: ValidationInfo) -> list[int]:
        depths, dim = info.data.get("depths"), info.data.get("embed_dim")
        if depths is not None and len(heads) != len(depths):
            raise ValueError(f"num_heads needs one entry per stage of depths ({len(depths)} stages)")
        if dim is not None:
            for stage, h in enumerate(heads):
                if h < 1 or (dim * 2**stage) % h:
                    raise ValueError(f"stage {stage} has width {dim * 2**stage}, which {h} heads do not divide")
        return heads


def _image_channels(input_shape: tuple[int, ...], name: str) -> None:
    shape = tuple(input_shape)
    if len(shape) == 2 or (len(shape) == 3 and shape[0] in (1, 3)):
        return
    raise ManytaskError(
        f"the {name} backbone needs image inputs of shape (1 or 3, H, W) or (H, W), but the benchmark gives {shape}."
    )


def _import_transformers() -> Any:
    return require("transformers", "the vit and swin backbones")


def load_pretrained(model_class: Any, config: Any, weights: str, **kwargs: Any) -> Any:
    """`model_class` with weights from a local `save_pretrained` directory or a `.safetensors`/`.bin` state dict.

    A directory's own config.json wins over `config`. Parameters the checkpoint lacks are an error (they would
    otherwise stay random without notice); extra ones (a classifier head, a pooler) are ignored."""
    path = Path(weights).expanduser()
    if not path.exists():
        raise ManytaskError(f"backbone weights not found: {path} does not exist.")
    expected = config.model_type
    load: dict[str, Any] = {
        "local_files_only": True, "dtype": torch.float32, "output_loading_info": True, "ignore_mismatched_sizes": True,
        **kwargs,
    }
    if path.is_dir():
        config_file = path / "config.json"
        if config_file.is_file():
            found = json.loads(config_file.read_text()).get("model_type")
            if found != expected:
                raise ManytaskError(f"{config_file} describes a '{found}' model, not '{expected}'.")
        else:
            load["config"] = config
        source: Any = str(path)
    elif path.suffix in (".safetensors", ".bin", ".pt", ".pth"):
        load.update(config=config, state_dict=read_state_dict(path))
        source = None
    else:
        raise ManytaskError(
            f"backbone weights {path} must be a save_pretrained directory or a .safetensors/.bin state dict file."
        )
    try:
        model, info = model_class.from_pretrained(source, **load)
    except (OSError, RuntimeError, ValueError) as err:
        raise ManytaskError(f"could not load backbone weights from {path}: {_first_line(err)}") from None
    missing = sorted(info.get("missing_keys", []))
    mismatched = info.get("mismatched_keys", [])
    if missing or mismatched:
        bad = [*missing, *(m[0] if isinstance(m, tuple) else m for m in mismatched)]
        raise ManytaskError(
            f"backbone weights {path} do not fit the {expected} architecture: {len(bad)} parameters missing or of "
            f"another shape (first: {bad[0]}); check the backbone params or the checkpoint."
        )
    return model


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_state_dict(path: Path) -> dict[str, Tensor]:
    """A state dict from a .safetensors file, or a .bin/.pt/.pth file read with `weights_only=True`."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # corrupt file, or a pickle that is more than tensors
        raise ManytaskError(f"could not read backbone weights {path}: {_first_line(err)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ManytaskError(f"backbone weights {path} must hold a flat state dict (parameter name -> tensor).")
    return state


class _HFImageBackbone(nn.Module):
    """Preprocessing + a transformers vision model; subclasses pick the model and the pooled feature."""

    model: nn.Module
    uses_peft = True  # LoRA through peft (see models/adapters.py)
    name = ""

    @property
    def lora_targets(self) -> list[str]:
        return LORA_TARGETS[self.name]

    def __init__(self, mean: Triple, std: Triple) -> None:
        super().__init__()
        self.mean = tuple(mean)
        self.std = tuple(std)

    @property
    def image_size(self) -> int:
        size = self.model.config.image_size
        return int(size[0] if isinstance(size, (list, tuple)) else size)

    @staticmethod
    def _build(model_class: type, config: Any, weights: str | None, **kwargs: Any) -> nn.Module:
        """A fresh model from `config`, or one loaded from local `weights` (put back in training mode)."""
        if weights is None:
            return model_class(config, **kwargs)
        model = load_pretrained(model_class, config, weights, **kwargs)
        model.train()
        return model

    def prepare(self, x: Tensor) -> Tensor:
        if x.dim() == 3:  # (B, H, W): one gray channel
            x = x.unsqueeze(1)
        return prepare_images(x, self.image_size, self.mean, self.std)


@BACKBONES.register("vit", ViTParams, "Vision Transformer (transformers ViTModel, default ViT-B/32), [CLS] feature")
class ViTBackbone(_HFImageBackbone):
    name = "vit"

    def __init__(self, input_shape: tuple[int, ...], params: ViTParams) -> None:
        super().__init__(params.mean, params.std)
        _image_channels(input_shape, "vit")
        transformers = _import_transformers()
        config = transformers.ViTConfig(
            image_size=params.image_size,
            patch_size=params.patch_size,
            hidden_size=params.hidden_size,
            num_hidden_layers=params.num_hidden_layers,
            num_attention_heads=params.num_attention_heads,
            intermediate_size=params.intermediate_size,
            hidden_dropout_prob=params.dropout,
            attention_probs_dropout_prob=params.dropout,
            num_channels=3,
        )
        self.model = self._build(transformers.ViTModel, config, params.weights, add_pooling_layer=False)
        self.out_features = int(self.model.config.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=self.prepare(x)).last_hidden_state[:, 0]


@BACKBONES.register("swin", SwinParams, "Swin Transformer (transformers SwinModel, default Swin-T), pooled feature")
class SwinBackbone(_HFImageBackbone):
    name = "swin"

    def __init__(self, input_shape: tuple[int, ...], params: SwinParams) -> None:
        super().__init__(params.mean, params.std)
        _image_channels(input_shape, "swin")
        transformers = _import_transformers()
        config = transformers.SwinConfig(
            image_size=params.image_size,
            patch_size=params.patch_size,
            embed_dim=params.embed_dim,
            depths=list(params.depths),
            num_heads=list(params.num_heads),
            window_size=params.window_size,
            drop_path_rate=params.drop_path_rate,
            num_channels=3,
        )
        self.model = self._build(transformers.SwinModel, config, params.weights)
        self.out_features = int(self.model.num_features)
        model_config = self.model.config  # a checkpoint directory's config may differ from the params
        self.pyramid_channels = [int(model_config.embed_dim * 2**i) for i in range(len(model_config.depths))]

    def forward(self, x: Tensor) -> Tensor:
        return self.model(pixel_values=self.prepare(x)).pooler_output

    def pyramid(self, x: Tensor) -> list[Tensor]:
        """Each stage's output before its patch merging, `[B, embed_dim·2^i, grid/2^i, grid/2^i]` with grid =
        image_size / patch_size, finest first (the maps Swin's dense-prediction heads use). They are not layer-
        normalized: the final layer norm belongs to the pooled feature, and a dense decoder normalizes itself."""
        out = self.model(
            pixel_values=self.prepare(x), output_hidden_states=True, output_hidden_states_before_downsampling=True
        )
        return list(out.reshaped_hidden_states[1:])  # [0] is the patch embedding, before any stage


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Hugging Face models inside `model` switched to their plain (eager) attention, then back: the fused SDPA
    kernels have no vmap batching rule, and vmap would fall back to a Python loop over the batch (TaLoS's
    per-example gradients, the batched executor's clients)."""
    switched = [(m, m.config._attn_implementation) for m in model.modules() if hasattr(m, "set_attn_implementation")
                and m.config._attn_implementation not in ("eager", KEYED_ATTENTION)]  # the keyed one is eager too
    for module, _ in switched:
        module.set_attn_implementation("eager")
    try:
        yield
    finally:
        for module, previous in switched:
            module.set_attn_implementation(previous)
