"""FL head-only (the FL + TaLoS paper's federated baseline, shared/specs/talos_fl.md): FedAvg of the task heads
over a frozen pretrained backbone; `centralized-head-only` is the same program on the pooled federation (one client
per task holding all of its data), the paper's centralized baseline."""

from __future__ import annotations

from torch import nn

from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostModel, HostParams
from manytask.methods.hosts.server import HostServer
from manytask.methods.registry import HOST, register_with_centralized
from manytask.models.multitask import MultiTaskModel


class HeadOnlyModel(HostModel):
    """The task model with its backbone frozen: only the heads train and travel."""

    def build_model(self) -> tuple[MultiTaskModel, nn.Module]:
        model = self.setup.build_model()
        model.backbone.requires_grad_(False)
        return model, model


class HeadOnlyClient(HeadOnlyModel, HostClient):
    pass


class HeadOnlyServer(HeadOnlyModel, HostServer):
    pass


register_with_centralized(
    "head-only", MethodDef(HeadOnlyClient, HeadOnlyServer, family=HOST), HostParams,
    "FL head-only: FedAvg of the heads over a frozen (pretrained) backbone",
    "Centralized head-only: the heads trained on all of each task's data over a frozen backbone",
)
