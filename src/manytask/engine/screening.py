"""Screening replies before aggregation: a reply that does not decode, or that breaks what every method's reply
must satisfy or what its server declares (`ServerProgram.reply_problem`), or that the server finds implausible next
to the round's other replies (`ServerProgram.round_problems`: the hosts' divergence guard), is a failed client with
its reason, never a crash. The server then aggregates exactly as if that client had dropped out.

What every reply must satisfy (`common_problem`): each sample count `n/<task>` is for a task the client holds and is
a whole number from 1 to the client's registered holding of that task; each training loss `loss/<task>` comes with
its task's count; scalars are numbers (never text), finite, and so are arrays."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

from manytask.errors import clipped
from manytask.federation.federation import Federation
from manytask.messages import Message, MessageError, Sent, as_message
from manytask.methods.base import ServerProgram
from manytask.methods.common.wire import LOSS_PREFIX, SIZE_PREFIX

DIVERGED = "reply has non-finite values (diverged training)"


def screen(
    received: Mapping[int, Sent | None], server: ServerProgram, federation: Federation
) -> tuple[dict[int, Message | None], dict[int, str]]:
    """(the decoded replies that pass, the reasons of those that do not), by client."""
    accepted: dict[int, Message | None] = {}
    rejected: dict[int, str] = {}
    with np.errstate(over="ignore"):  # `_all_finite`'s sums of squares may overflow; it then checks entry by entry
        for client, data in received.items():
            if data is None:
                accepted[client] = None
                continue
            try:
                reply = as_message(data)
            except MessageError as err:
                rejected[client] = f"reply does not decode: {err}"
                continue
            problem = common_problem(client, reply, federation) or server.reply_problem(client, reply)
            if problem is None:
                accepted[client] = reply
            else:
                rejected[client] = problem
    rejected.update(dict.fromkeys(_diverged_on_device(accepted), DIVERGED))
    rejected.update(server.round_problems({c: r for c, r in accepted.items() if r is not None and c not in rejected}))
    return {c: r for c, r in accepted.items() if c not in rejected}, rejected


def common_problem(client: int, reply: Message, federation: Federation) -> str | None:
    """Why `reply` breaks the rules every method's reply follows (see the module), or None."""
    for key, value in reply.scalars.items():
        if isinstance(value, str):  # no client program uploads text; servers read every scalar as a number
            return f"reply's scalar '{clipped(key)}' is text, not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return DIVERGED
        if key.startswith(SIZE_PREFIX) and (problem := _size_problem(client, key[len(SIZE_PREFIX):], value,
                                                                      federation)):
            return problem
        if key.startswith(LOSS_PREFIX) and SIZE_PREFIX + key[len(LOSS_PREFIX):] not in reply.scalars:
            return f"reply reports a loss for task '{clipped(key[len(LOSS_PREFIX):])}' without its sample count"
    if not all(_all_finite(a) for a in reply.arrays.values() if isinstance(a, np.ndarray) and a.dtype.kind == "f"):
        return DIVERGED
    return None


def _diverged_on_device(replies: Mapping[int, Message | None]) -> list[int]:
    """The clients whose replies hold a non-finite entry in an array kept on the device (`common_problem` checks
    the host's): one reduction per array, and one read for the whole round, so the reads do not grow with the
    clients."""
    floats = {c: [a for a in r.arrays.values() if isinstance(a, torch.Tensor) and a.is_floating_point()]
              for c, r in replies.items() if r is not None}
    floats = {c: arrays for c, arrays in floats.items() if arrays}
    if not floats:
        return []
    finite = torch.stack([torch.stack([torch.isfinite(a).all() for a in arrays]).all() for arrays in floats.values()])
    return [c for c, ok in zip(floats, finite.tolist(), strict=True) if not ok]


_DOTTED = (np.dtype(np.float32), np.dtype(np.float64))  # dtypes whose dot product is BLAS's


def _all_finite(array: np.ndarray) -> bool:
    """`np.isfinite(array).all()`, usually from one dot product: Σ a² is finite only when every entry is (an
    infinity or a NaN makes it infinite or NaN); where it is not, the entry-wise check decides (finite values can
    overflow the sum, with a numpy warning where the caller does not silence it, as `screen` does). Every reply's
    every array passes here: the dot product is a third of the entry-wise check's time. `vdot`, not `dot`: a decoded
    array views the message's bytes wherever they lie, and `dot` of an array that is not aligned to its item size
    takes a loop of its own, 7× slower; `vdot` is as fast either way. (Numpy, not torch: a server's checks on the
    host are no kernel launches, and are not counted as such.)"""
    if array.dtype in _DOTTED:
        flat = array.reshape(-1)
        if math.isfinite(np.vdot(flat, flat)):
            return True
    return bool(np.logical_and.reduce(np.isfinite(array), axis=None))


def _size_problem(client: int, task: str, value: object, federation: Federation) -> str | None:
    held = federation.size(client, task) if task in federation.clients[client] else None
    if held is None:
        return f"reply reports samples of task '{clipped(task)}', which client {client} does not hold"
    whole = isinstance(value, int | float) and not isinstance(value, bool) and float(value).is_integer()
    if not whole or not 1 <= value <= held:
        return f"reply claims {clipped(value)} samples of task '{task}', where client {client} holds {held}"
    return None
