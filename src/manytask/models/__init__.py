"""Models: backbones, the multi-task model (shared backbone + per-task heads) and ParamSpace."""

from manytask.models import resnet, transformers_backbones  # noqa: F401  (imported to register resnet18, vit, swin)
from manytask.models.backbones import BACKBONES
from manytask.models.multitask import MultiTaskModel, build_model, task_of_key, trainable_state
from manytask.models.paramspace import ParamSpace

__all__ = ["BACKBONES", "MultiTaskModel", "ParamSpace", "build_model", "task_of_key", "trainable_state"]
