"""Client-level differential privacy over any host (the `dp` plug-in): DP-FedAvg's clipping and Gaussian noise
(McMahan, Ramage, Talwar and Zhang, ICLR 2018, "Learning Differentially Private Recurrent Language Models",
Algorithm 1), optional adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, NeurIPS 2021, "Differentially
Private Learning with Adaptive Clipping", Algorithm 1), and the (ε, δ) spent from Opacus's RDP accountant (Mironov,
2017; sampled Gaussian mechanism, Mironov, Talwar and Zhang, 2019).

- `where: server` (central DP): each client's update Δ_n is clipped to norm C, Δ̂_n = Δ_n · min(1, C / ‖Δ_n‖); per
  parameter k the server adds Gaussian noise with σ = z·C to the sum over the m_k updates holding k and divides by
  m_k: Δ̄_k = (Σ_n Δ̂_n,k + N(0, σ² I)) / m_k. Every holder's delta becomes Δ̄_k, so the host's rule (its weights,
  FedAvg's average, FedAdam's moments, FedACG's momentum) moves the model by functions of the noised aggregate only.
  Each round is a sampled Gaussian mechanism with noise multiplier z and sampling rate q = m / N.
- `where: client` (local DP): each client clips its own update to C and adds N(0, (z·C)² I) before it uploads; the
  server aggregates as the host does. Nothing is amplified by sampling (a client knows it takes part): a client's ε
  composes the Gaussian mechanism over the rounds it took part in, and the worst client's is reported.
- `adaptive: true` (server only): C follows the γ-quantile of the update norms, C ← C · exp(−η_C (b̃ − γ)), with
  b̃ = (Σ_n 1[‖Δ_n‖ ≤ C] + N(0, σ_b²)) / m the noised fraction unclipped; the updates' noise multiplier becomes
  z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), so that both releases together cost what z alone does (Andrew et al., Theorem 1).

Choices. The weights are uniform: a client's sample count would otherwise scale its influence past C. Models with
BatchNorm running statistics and `per_task` hosts are refused: the host averages buffers outside the deltas (no
noise), and one client's several copies would multiply its sensitivity. m_k counts the updates received, so a
dropped client only lowers m_k (its sensitivity stays C per round). Noise is drawn from a generator seeded by
(run seed, round), so a resumed run draws what the uninterrupted one drew.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import ModuleType
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from manytask.errors import ManytaskError
from manytask.extras import require
from manytask.messages import Message
from manytask.methods.base import ClientContext, ServerProgram, Setup
from manytask.methods.common.updates import Update, apply, copy_groups, delta
from manytask.methods.common.updates import delta_norm as norm
from manytask.methods.plugins.base import PluginClient, PluginServer
from manytask.methods.plugins.robust import replaced
from manytask.methods.registry import PluginDef, register_plugin
from manytask.models.multitask import is_buffer
from manytask.registry import Params
from manytask.seeding import torch_generator

Deltas = dict[str, Tensor]
# Rényi orders the accountant tries: Opacus's RDPAccountant.DEFAULT_ALPHAS and larger ones, which a small ε over
# few rounds without sampling (the noise multipliers of local DP, or of 10 clients all taking part) needs
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + [float(x) for x in range(12, 64)] + [
    80.0, 100.0, 128.0, 160.0, 256.0, 512.0, 1024.0]


class DPParams(Params):
    clip: float = Field(default=1.0, gt=0, description="C: each client's update clipped to this L2 norm (the first "
                        "round's C when adaptive)")
    noise_multiplier: float = Field(default=1.0, gt=0, description="z: Gaussian noise of std z·C on the sum of the "
                                    "clipped updates (server) or on each clipped update (client)")
    where: Literal["server", "client"] = Field(default="server", description="server: central DP; client: local DP")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="δ of the (ε, δ) reported")
    adaptive: bool = Field(default=False, description="C follows a quantile of the update norms (server only)")
    target_quantile: float = Field(default=0.5, gt=0, lt=1, description="γ: the quantile of the norms C tracks")
    clip_lr: float = Field(default=0.2, gt=0, description="η_C: the geometric step of C each round")
    count_noise: float | None = Field(default=None, gt=0, description="σ_b: the std of the noise on the unclipped "
                                      "count; default m/20 (m the clients a round)")

    @model_validator(mode="after")
    def _adaptive_on_server(self) -> DPParams:
        if self.adaptive and self.where == "client":
            raise ValueError("adaptive clipping needs the server to see the clipped count: use where: server")
        return self


# --- the math ------------------------------------------------------------------------------------------------


def client_scales(updates: list[Update], bound: float) -> dict[int, float]:
    """Per client, min(1, C / ‖Δ_n‖) over all its parameters (DP-FedAvg's per-client clipping)."""
    return {u.client: min(1.0, bound / size) if (size := norm(u.deltas())) > 0 else 1.0 for u in updates}


def noised_mean(deltas: list[Deltas], std: float, generator: torch.Generator) -> Deltas:
    """Per key k, (Σ_n Δ_n,k + N(0, std² I)) / m_k over the m_k deltas holding k, in float64; keys in sorted order
    (the noise a key draws does not depend on who sent what)."""
    keys = sorted({k for d in deltas for k in d})
    out = {}
    for k in keys:
        held = [d[k].double() for d in deltas if k in d]
        total = torch.stack(held).sum(dim=0)
        # drawn on the host (the generator is a CPU one: the same noise on any device), moved once per key
        noise = (torch.normal(0.0, std, total.shape, generator=generator, dtype=torch.float64).to(total.device)
                 if std > 0 else 0.0)
        out[k] = (total + noise) / len(held)
    return out


def updates_noise_multiplier(z: float, count_std: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the updates' share of the noise when the clipped count is released with std σ_b
    (Andrew et al., 2021, Theorem 1)."""
    if 2 * count_std <= z:
        raise ManytaskError(f"dp: adaptive clipping needs count_noise > noise_multiplier / 2 ({count_std:g} ≤ "
                            f"{z / 2:g}): raise count_noise or lower noise_multiplier.")
    return (z ** -2 - (2 * count_std) ** -2) ** -0.5


def next_bound(bound: float, unclipped: int, count: int, quantile: float, lr: float, count_std: float,
               generator: torch.Generator) -> float:
    """C ← C · exp(−η_C (b̃ − γ)), b̃ = (unclipped + N(0, σ_b²)) / m (Andrew et al., 2021, Algorithm 1)."""
    noisy = (unclipped + float(torch.normal(0.0, count_std, (), generator=generator, dtype=torch.float64))) / count
    return bound * math.exp(-lr * (noisy - quantile))


def _analysis() -> ModuleType:
    """Opacus's RDP analysis (the `dp` extra)."""
    return require("opacus.accountants.analysis.rdp", "the dp plug-in's accountant")


def epsilon(rdp: Tensor, delta: float) -> float:
    """The ε of (ε, δ)-DP from the accumulated Rényi DP at `ORDERS` (Opacus's conversion)."""
    eps, _ = _analysis().get_privacy_spent(orders=ORDERS, rdp=rdp.tolist(), delta=delta)
    return float(eps)


def round_rdp(q: float, z: float, rounds: int = 1) -> Tensor:
    """The Rényi DP at `ORDERS` of `rounds` sampled Gaussian mechanisms at sampling rate q, noise multiplier z."""
    analysis = _analysis()
    return torch.tensor(analysis.compute_rdp(q=q, noise_multiplier=z, steps=rounds, orders=ORDERS),
                        dtype=torch.float64)


# --- the programs --------------------------------------------------------------------------------------------


def _refuse_what_dp_cannot_bound(host: ServerProgram) -> None:
    if getattr(host.params, "per_task", False):
        raise ManytaskError("dp: a per_task host uploads one copy per task, which multiplies a client's sensitivity; "
                            "use per_task: false.")
    buffers = [k for k, v in host.state_dict().items() if is_buffer(k) and v.is_floating_point()]
    if buffers:
        raise ManytaskError(f"dp: the model keeps running statistics ({buffers[0]}), which the host averages without "
                            f"noise; use a model without BatchNorm (norm: none).")


class DPClient(PluginClient[DPParams]):
    """Local DP: the reply's update clipped to C and noised with std z·C before it leaves the client, on the host
    (the noise comes from a CPU generator, so the numbers do not depend on the device)."""

    def transform_reply(self, ctx: ClientContext, payload: Message, reply: Message) -> Message:
        if self.params.where == "server":
            return reply
        sent, arrays = payload.on_host().tensors(), reply.on_host().tensors()
        changed: dict[str, Tensor] = {}
        generator = torch_generator(ctx.seed, "dp")
        for keys in copy_groups(arrays).values():
            deltas = delta(sent, {k: arrays[k] for k in keys})
            size = norm(deltas)
            scale = min(1.0, self.params.clip / size) if size > 0 else 1.0
            std = self.params.noise_multiplier * self.params.clip
            noisy = {k: d.double() * scale + torch.normal(0.0, std, d.shape, generator=generator,
                                                          dtype=torch.float64) for k, d in sorted(deltas.items())}
            changed.update(apply(sent, noisy))
        return Message.from_tensors({**arrays, **changed}, scalars=reply.scalars)


class DPServer(PluginServer[DPParams]):
    """Central DP (clipping and noise on the server) or the accounting of local DP; logs ε every round. It clips and
    noises where the replies lie; its accountant's state (RDP, bound, participations) stays on the host."""

    device_ready = True

    def __init__(self, host: ServerProgram, setup: Setup, params: DPParams) -> None:
        super().__init__(host, setup, params)
        _refuse_what_dp_cannot_bound(host)
        self.clients = len(setup.holdings)
        self.per_round = setup.clients_per_round or self.clients
        self.count_std = params.count_noise if params.count_noise is not None else self.per_round / 20
        self.z_updates = (updates_noise_multiplier(params.noise_multiplier, self.count_std) if params.adaptive
                          else params.noise_multiplier)
        _analysis()  # a missing accountant is said before the first round
        self.state = {"rdp": torch.zeros(len(ORDERS), dtype=torch.float64),
                      "bound": torch.tensor(params.clip, dtype=torch.float64),
                      "participations": torch.zeros(self.clients, dtype=torch.int64)}

    def adjust(self, round_index: int, updates: list[Update]) -> list[Update]:
        if not updates:
            return updates
        if self.params.where == "client":
            return self._account_local(updates)
        bound = float(self.state["bound"])
        scales = client_scales(updates, bound)
        deltas = [{k: v.double() * scales[u.client] for k, v in u.deltas().items()} for u in updates]
        generator = torch_generator(self.setup.seed, "dp", round_index)
        mean = noised_mean(deltas, self.z_updates * bound, generator)
        unclipped = sum(scale == 1.0 for scale in scales.values())
        if self.params.adaptive:
            self.state["bound"] = torch.tensor(next_bound(
                bound, unclipped, len(updates), self.params.target_quantile, self.params.clip_lr, self.count_std,
                generator), dtype=torch.float64)
        self.state["rdp"] = self.state["rdp"] + round_rdp(self.per_round / self.clients, self.params.noise_multiplier)
        self.log.update({"dp/clip": bound, "dp/unclipped": unclipped / len(updates),
                         "dp/epsilon": epsilon(self.state["rdp"], self.params.delta)})
        # every holder of a key gets the same Δ̄_k, so any weighting of the host's gives Δ̄_k
        return [u.with_deltas(d) for u, d in zip(updates, replaced(deltas, mean), strict=True)]

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        super().load_state_dict(state)
        self.state = {k: v.cpu() for k, v in self.state.items()}  # bookkeeping: read and written on the host

    def _account_local(self, updates: list[Update]) -> list[Update]:
        """Local DP: the clients noised their own updates; ε of the client that took part most often."""
        counts = self.state["participations"].clone()
        for client in {u.client for u in updates}:
            counts[client] += 1
        self.state["participations"] = counts
        worst = int(counts.max())
        self.log["dp/epsilon"] = epsilon(round_rdp(1.0, self.params.noise_multiplier, worst), self.params.delta)
        return updates


register_plugin("dp", PluginDef(DPClient, DPServer), DPParams,
                "Client-level differential privacy: updates clipped to C, Gaussian noise z·C on their sum (server) "
                "or on each (client), optional adaptive clipping; ε from Opacus's RDP accountant")
