"""FL + TaLoS (the FL + TaLoS paper's Algorithm 1, shared/specs/talos_fl.md): head-only rounds, one calibration
round in which every client computes its own mask, then sparse fine-tuning with SparseSGDM under each client's
mask and FedAvg of the full scored vector. `centralized-talos` is the same program on the pooled federation."""

from __future__ import annotations

from manytask.methods.base import MethodDef
from manytask.methods.registry import REFERENCE, SPARSE, register_method
from manytask.methods.talos.program import TalosClient, TalosParams, TalosServer

register_method(
    "talos", MethodDef(TalosClient, TalosServer, family=SPARSE), TalosParams,
    "FL + TaLoS: head-only, per-client Fisher masks, then SparseSGDM fine-tuning averaged with FedAvg",
)
register_method(
    "centralized-talos", MethodDef(TalosClient, TalosServer, pooled=True, family=REFERENCE), TalosParams,
    "Centralized TaLoS: head-only then sparse fine-tuning on all of each task's data",
)
