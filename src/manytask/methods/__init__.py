"""Methods by family, each registering a ClientProgram/ServerProgram pair (plug-ins: a pair of wrappers):
hosts (one global model), plug-ins over any host, personalized methods, many-task methods, and references."""

from manytask.methods import reference  # noqa: F401  (registration)
from manytask.methods.base import ClientContext, ClientProgram, MethodDef, ServerProgram, Setup
from manytask.methods.hosts import (  # noqa: F401
    adaptive,
    fedacg,
    fedavg,
    fedbn,
    feddyn,
    fedga,
    fednova,
    fedprox,
    gradnorm,
    moon,
)
from manytask.methods.manytask import matfl, matu, sfmtl  # noqa: F401  (registration)
from manytask.methods.mas import fixed_split, hoa, one_by_one, tag  # noqa: F401  (registration)
from manytask.methods.mas import mas as _mas  # noqa: F401  (as _mas: manytask.methods.mas stays the package)
from manytask.methods.personalized import fedper, fedu, pfedme  # noqa: F401  (registration)
from manytask.methods.plugins import dea, dp, fedheal, pcgrad, robust  # noqa: F401  (registration)
from manytask.methods.registry import METHODS, PLUGINS, register_method, register_plugin
from manytask.methods.talos import fl_talos, head_only, oneshot, partitioned  # noqa: F401  (registration)

__all__ = [
    "METHODS", "PLUGINS", "ClientContext", "ClientProgram", "MethodDef", "ServerProgram", "Setup",
    "register_method", "register_plugin",
]
