"""FedPer (Arivazhagan et al., 2019, "Federated Learning with Personalization Layers"): the last backbone block
and the heads stay on the client (personal); the rest of the trainable parameters are averaged as in FedAvg.
Evaluation is client-side: each holder's own model (global shared part + its personal part) on the task's test
set. It is FedAvg's host with personal keys (`local_keys`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from manytask.methods.base import MethodDef
from manytask.methods.hosts.base import HostClient, HostModel, HostParams
from manytask.methods.hosts.server import HostServer
from manytask.methods.registry import PERSONALIZED, register_method
from manytask.models.adapters import ADAPTER_MARK
from manytask.models.multitask import BUFFER_PREFIX, is_buffer, task_of_key


def module_of(key: str) -> str:
    """The module a parameter or buffer belongs to (`layers.3.lora_A`, `layers.3.weight` and
    `buffer/layers.3.running_mean` all -> `layers.3`)."""
    key = key.removeprefix(BUFFER_PREFIX)
    return key.split("." + ADAPTER_MARK, 1)[0] if ADAPTER_MARK in key else key.rsplit(".", 1)[0]


def personal_keys(keys: Iterable[str]) -> set[str]:
    """The heads and the last trainable backbone module's parameters and buffers (FedPer's personalization
    layers)."""
    keys = list(keys)
    shared = [k for k in keys if task_of_key(k) is None and not is_buffer(k)]
    last = module_of(shared[-1]) if shared else None
    return {k for k in keys if task_of_key(k) is not None or module_of(k) == last}


class FedPerModel(HostModel):
    def local_keys(self, keys: Sequence[str]) -> set[str]:
        return personal_keys(keys)


class FedPerClient(FedPerModel, HostClient):
    pass


class FedPerServer(FedPerModel, HostServer):
    pass


register_method(
    "fedper", MethodDef(FedPerClient, FedPerServer, family=PERSONALIZED), HostParams,
    "FedPer: last backbone block + heads stay local, the rest is averaged",
)
