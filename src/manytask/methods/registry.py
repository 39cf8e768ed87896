"""The method and plug-in registries: name -> definition (+ its Params model and a one-line description).

Methods come in families (`FAMILIES`); a plug-in declares the families it wraps (DEA, PCGrad and FedHEAL wrap
hosts: methods with one global model whose clients train what they were sent)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from manytask.errors import ManytaskError
from manytask.methods.base import MethodDef
from manytask.registry import Params, Registry

HOST, PERSONALIZED, MANY_TASK, SPARSE, REFERENCE = "host", "personalized", "many-task", "sparse", "reference"
FAMILIES = (HOST, PERSONALIZED, MANY_TASK, SPARSE, REFERENCE)  # sparse: sparse fine-tuning of a pretrained model

METHODS: Registry[MethodDef] = Registry("method", entry_points="manytask.methods")


@dataclass(frozen=True)
class PluginDef:
    """A registered plug-in: the classes that wrap a host's client and server programs
    (`methods.plugins.base`), and the method families it accepts."""

    client: type
    server: type
    accepts: tuple[str, ...] = (HOST,)

    def hosts(self) -> list[str]:
        """The registered methods this plug-in wraps."""
        return [e.name for e in METHODS.entries() if e.target.family in self.accepts]

    def check_host(self, plugin: str, method: str) -> None:
        if METHODS.get(method).target.family not in self.accepts:
            raise ManytaskError(
                f"plug-in '{plugin}' cannot wrap '{method}'; it wraps: {', '.join(self.hosts())}."
            )


PLUGINS: Registry[PluginDef] = Registry("plug-in", entry_points="manytask.plugins")


def register_method(name: str, method: MethodDef, params: type[Params] = Params, description: str = "") -> None:
    if method.family not in FAMILIES:
        raise ValueError(f"method '{name}': unknown family '{method.family}'")
    METHODS.register(name, params, description)(method)


def register_with_centralized(
    name: str, method: MethodDef, params: type[Params], description: str, centralized: str
) -> None:
    """Register a method and `centralized-<name>`, its reference: the same programs on the pooled federation (one
    client per task holding all of its data)."""
    register_method(name, method, params, description)
    register_method(f"centralized-{name}", replace(method, pooled=True, family=REFERENCE), params, centralized)


def register_plugin(name: str, plugin: PluginDef, params: type[Params] = Params, description: str = "") -> None:
    PLUGINS.register(name, params, description)(plugin)
