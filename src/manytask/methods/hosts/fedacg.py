"""FedACG (Kim, Kim & Han, CVPR 2024, "Communication-Efficient Federated Learning with Accelerated Client
Gradient"): the server broadcasts a lookahead model along its momentum, and clients stay near it.

Server state: θ (the global model, which is what is evaluated) and momentum m (`parts["momentum"]`, zeros at
first). Payload: the lookahead θ̃ = θ + λ m for parameters, buffers as they are. Client: FedAvg's, plus the
regularizer (β/2)‖θ − θ̃‖² (FedProx's `ProximalHook`). Server, per parameter key over the updates that hold it,
with p_n = w_n / Σ_m w_m (per entry for tensor weights):
    Δ = Σ_n p_n (θ_n − θ̃);   m ← λ m + Δ;   θ ← θ + m  (= θ̃ + Δ)   (`rules.Momentum`).
Keys no update holds keep θ and m. Buffers are averaged with FedAvg's weights.
Defaults follow the paper and the authors' code (geehokim/FedACG): λ = 0.85 and β = 0.001. The authors' code
weights Σ‖θ − θ̃‖² by 1e-3 without the ½, which is β = 0.002 here; we keep the paper's β/2 form and its 0.001.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field
from torch import Tensor

from manytask.client.trainer import TrainHook
from manytask.messages import Message
from manytask.methods.base import ClientContext, MethodDef
from manytask.methods.hosts.base import HostClient, HostParams, TrainedCopy
from manytask.methods.hosts.fedprox import ProximalHook
from manytask.methods.hosts.rules import Momentum, RuleServer
from manytask.methods.registry import HOST, register_method
from manytask.search_space import Space, log_range, uniform


class FedAcgParams(HostParams):
    # ranges for manytask tune: around the paper's λ 0.85, β 0.001
    SEARCH_SPACE: ClassVar[Space] = {"lam": uniform(0.5, 0.95), "beta": log_range(1e-4, 1e-1)}
    lam: float = Field(default=0.85, ge=0, lt=1, description="server momentum λ; clients start from θ + λ·m")
    beta: float = Field(default=0.001, ge=0, description="client regularizer strength β in (β/2)‖θ − θ̃‖²")


def lookahead(state: Mapping[str, Tensor], momentum: Mapping[str, Tensor], lam: float) -> dict[str, Tensor]:
    """θ̃ = θ + λ m for every entry that has a momentum; the others (buffers) as they are."""
    return {k: v + lam * momentum[k] if k in momentum else v for k, v in state.items()}


class FedAcgClient(HostClient):
    params: FedAcgParams

    def hooks(self, ctx: ClientContext, copy: TrainedCopy) -> list[TrainHook]:
        # received: the lookahead θ̃
        return [ProximalHook(dict(copy.model.named_parameters()), copy.received, self.params.beta)]


class FedAcgServer(RuleServer):
    params: FedAcgParams

    def build_rule(self) -> Momentum:
        return Momentum(self.params.lam)

    def payload_for(self, client: int) -> Message:
        return Message.from_tensors(lookahead(super().payload_for(client).tensors(), self.parts["momentum"],
                                              self.params.lam))


register_method(
    "fedacg", MethodDef(FedAcgClient, FedAcgServer, family=HOST), FedAcgParams,
    "FedACG: server momentum sent as a lookahead model, clients regularized towards it",
)
