"""FedBN (Li et al., ICLR 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization"):
FedAvg in which the normalization layers stay on the clients.

Client rule: train as FedAvg from the received parameters with the client's own normalization parameters and
statistics loaded over them (initial ones before its first round); keep the trained normalization layers in client
state and upload everything else. Server rule: FedAvg over the uploaded (non-normalization) parameters.
Evaluation is client-side: each holder's model with its own normalization layers (Algorithm 1 of the paper).
Normalization layers are BatchNorm (the paper's), and LayerNorm and GroupNorm, which carry affine parameters just
the same; a model without any is an error (`model.norm: batch` adds BatchNorm to the small backbones).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from torch import nn

from manytask.errors import ManytaskError
from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostModel, HostParams
from manytask.methods.hosts.server import HostServer
from manytask.methods.personalized.fedper import module_of
from manytask.methods.registry import HOST, register_method

NORM_LAYERS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm, nn.GroupNorm)


def norm_modules(model: nn.Module) -> set[str]:
    """Names of the model's normalization layers."""
    return {name for name, module in model.named_modules() if isinstance(module, NORM_LAYERS)}


class FedBnModel(HostModel):
    @cached_property
    def norm_modules(self) -> set[str]:
        names = norm_modules(self.build_model()[0])
        if not names:
            raise ManytaskError("fedbn needs normalization layers; use model.norm: batch.")
        return names

    def local_keys(self, keys: Sequence[str]) -> set[str]:
        """The parameters and buffers (running statistics) of the normalization layers."""
        return {k for k in keys if module_of(k) in self.norm_modules}


class FedBnClient(FedBnModel, HostClient):
    pass


class FedBnServer(FedBnModel, HostServer):
    pass


register_method(
    "fedbn", MethodDef(FedBnClient, FedBnServer, family=HOST), HostParams,
    "FedBN: FedAvg with the normalization layers (parameters and statistics) kept on each client",
)
