"""FL + TaLoS (the FL + TaLoS paper's Algorithm 1, shared/specs/talos_fl.md): head-only rounds, one calibration
round in which every client computes its own mask, then sparse fine-tuning with SparseSGDM under each client's
mask and FedAvg of the full scored vector. `centralized-talos` is the same program on the pooled federation."""

from __future__ import annotations

from manytask.methods.base import MethodDef
from manytask.methods.registry import SPARSE, register_with_centralized
from manytask.methods.talos.program import TalosClient, TalosParams, TalosServer

register_with_centralized(
    "talos", MethodDef(TalosClient, TalosServer, family=SPARSE), TalosParams,
    "FL + TaLoS: head-only, per-client Fisher masks, then SparseSGDM fine-tuning averaged with FedAvg",
    "Centralized TaLoS: head-only then sparse fine-tuning on all of each task's data",
)
