"""Attack simulation (`adversaries:`): chosen clients train honestly, then corrupt what they upload.

The corruption happens in the client runner, after the method's client program has replied and before the reply
leaves the client, so it works the same on every engine (in-process, Flower's simulation, a deployment) and the
server sees nothing but the bytes. Attacks, each seeded by (run seed, round, client):

- `garbage`: random bytes of the reply's length; `truncate`: the reply's first half;
- `wrong-shape`: the first floating-point array cut to its first row (a broadcastable wrong shape, the kind a
  careless server would accept);
- `missing-count`: the sample counts `n/<task>` removed; `extra-array`: a 1000×1000 float32 array added;
- `scale`: every trained array moved to reference + factor·(trained − reference), where the reference is the array
  the client was sent under that name (arrays with no reference, e.g. sparse deltas or task vectors, are
  multiplied by the factor); `sign-flip`: the same with factor −1;
- `noise`: Gaussian noise of standard deviation `std` added to every floating-point array;
- `inflate-count`: every sample count multiplied by the factor.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from manytask.errors import ManytaskError
from manytask.messages import Message, Sent, encode
from manytask.methods.common.updates import reference_key
from manytask.methods.common.wire import SIZE_PREFIX
from manytask.registry import Params
from manytask.seeding import numpy_rng

Attack = Literal[
    "garbage", "truncate", "wrong-shape", "missing-count", "extra-array", "scale", "sign-flip", "noise",
    "inflate-count",
]
EXTRA_ARRAY = "extra"


class AdversaryConfig(Params):
    """`adversaries:` which clients attack (a list of ids, or a fraction drawn from the run seed) and how."""

    clients: list[int] | None = Field(default=None, description="ids of the attacking clients")
    fraction: float | None = Field(default=None, gt=0, le=1, description="share of clients that attack")
    attack: Attack
    factor: float = Field(default=1000.0, allow_inf_nan=False, description="scale: update multiplier; "
                          "inflate-count: sample-count multiplier")
    std: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="noise: standard deviation per entry")

    @model_validator(mode="after")
    def _one_choice(self) -> AdversaryConfig:
        if (self.clients is None) == (self.fraction is None):
            raise ValueError("give either 'clients' (a list of ids) or 'fraction', not both")
        if self.clients is not None and (not self.clients or min(self.clients) < 0):
            raise ValueError("'clients' must be a non-empty list of client ids (0 and up)")
        return self


def attacking_clients(config: AdversaryConfig, num_clients: int, seed: int) -> frozenset[int]:
    """The attackers: the listed ids, or round(fraction · clients) (at least one) drawn with the run seed."""
    if config.clients is not None:
        unknown = sorted(c for c in config.clients if c >= num_clients)
        if unknown:
            raise ManytaskError(f"adversaries.clients names {unknown[:5]}, but the federation has clients 0 to "
                                f"{num_clients - 1}.")
        return frozenset(config.clients)
    count = max(1, round(config.fraction * num_clients))
    return frozenset(int(c) for c in numpy_rng(seed, "adversaries").choice(num_clients, count, replace=False))


class Adversary:
    """Corrupts the replies of the attacking clients (see the module)."""

    def __init__(self, config: AdversaryConfig, clients: frozenset[int], seed: int) -> None:
        self.config, self.clients, self.seed = config, clients, seed

    def upload(self, client: int, round_index: int, payload: Message | None, reply: Message) -> Sent:
        """What `client` uploads for `reply`: the reply itself from an honest client, else the attack's bytes."""
        if client not in self.clients:
            return reply
        rng = numpy_rng(self.seed, "attack", round_index, client)
        attack = self.config.attack
        if attack in ("garbage", "truncate"):
            data = encode(reply)
            return rng.bytes(len(data)) if attack == "garbage" else data[: len(data) // 2]
        return encode(self._corrupted(reply, payload, rng))

    def _corrupted(self, reply: Message, payload: Message | None, rng: np.random.Generator) -> Message:
        arrays, scalars = reply.host_arrays(), dict(reply.scalars)  # an attack is drawn on the host, in numpy
        counts = [k for k in scalars if k.startswith(SIZE_PREFIX)]
        floats = [k for k, a in arrays.items() if a.dtype.kind == "f"]
        attack, factor = self.config.attack, self.config.factor
        if attack == "wrong-shape" and floats:
            first = arrays[floats[0]]
            arrays[floats[0]] = first[:1].copy() if first.ndim else first.reshape(1).repeat(2)
        elif attack == "missing-count":
            scalars = {k: v for k, v in scalars.items() if k not in counts}
        elif attack == "extra-array":
            arrays[EXTRA_ARRAY] = np.zeros((1000, 1000), np.float32)
        elif attack in ("scale", "sign-flip"):
            reference = {} if payload is None else payload.host_arrays()
            multiplier = -1.0 if attack == "sign-flip" else factor
            arrays.update({k: _scaled(arrays[k], reference.get(reference_key(k)), multiplier) for k in floats})
        elif attack == "noise":
            arrays.update({k: arrays[k] + rng.normal(0, self.config.std, arrays[k].shape).astype(arrays[k].dtype)
                           for k in floats})
        elif attack == "inflate-count":
            scalars.update({k: int(scalars[k] * factor) for k in counts})
        return Message(arrays, scalars)


def _scaled(trained: np.ndarray, reference: np.ndarray | None, factor: float) -> np.ndarray:
    """reference + factor · (trained − reference), or factor · trained without a reference of the same shape."""
    if reference is None or reference.shape != trained.shape:
        return (trained * factor).astype(trained.dtype)
    return (reference + factor * (trained - reference)).astype(trained.dtype)
