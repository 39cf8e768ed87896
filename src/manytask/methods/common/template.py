"""A client program's built model, never trained: it gives an executor's batched training its structure
(`ClientPlan.template`) and every client its initial values, so a plan-making program builds one model per run
instead of one per client call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cached_property

from torch import Tensor, nn

from manytask.models.multitask import BUFFER_PREFIX, MultiTaskModel, merged_state, state_keys, task_of_key


class ModelTemplate:
    def __init__(self, model: MultiTaskModel, module: nn.Module | None = None) -> None:
        self.model = model
        self.module = model if module is None else module  # what is trained: the model, or a wrapper of it
        self._keys: dict[tuple[str, ...], list[str]] = {}

    @property
    def built(self) -> tuple[MultiTaskModel, nn.Module]:
        return self.model, self.module

    @cached_property
    def initial_values(self) -> dict[str, Tensor]:
        """Every trainable parameter, head parameter (a phase may train the backbone under frozen heads that still
        come from the server) and buffer of the model before anything is loaded, by module name."""
        params = {n: p.detach() for n, p in self.model.named_parameters()
                  if p.requires_grad or task_of_key(n) is not None}
        return {**params, **{n: b.detach() for n, b in self.model.named_buffers()}}

    def keys(self, tasks: Iterable[str]) -> list[str]:
        """`state_keys` of the model for `tasks`; the model never changes, so computed once per task set."""
        wanted = tuple(tasks)
        keys = self._keys.get(wanted)
        if keys is None:
            keys = self._keys[wanted] = state_keys(self.model, wanted)
        return keys

    def start(self, *layers: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """The initial values with `layers` loaded over them in order, later ones winning, as `load_state` would
        load them into a fresh model (`merged_state`); a key the model does not have is an error, not dropped."""
        unknown = [k for layer in layers for k in layer if k.removeprefix(BUFFER_PREFIX) not in self.initial_values]
        if unknown:
            raise KeyError(f"not parameters of the model: {sorted(unknown)}")
        return merged_state(self.initial_values, *layers)

    def trained(self, params: Mapping[str, Tensor], tasks: Iterable[str]) -> dict[str, Tensor]:
        """Of an executor's trained parameters (`PlanResult.params`), what `trainable_state(model, tasks)` would
        give after training: the shared part and the heads of `tasks`, buffers as `buffer/<name>`."""
        return {k: params[k] for k in self.keys(tasks)}


def program_template() -> cached_property:
    """A client program's `template`: its setup's model, built once on the first use, on the program's device (a
    class attribute: `template = program_template()`)."""
    return cached_property(lambda program: ModelTemplate(program.setup.build_model().to(program.device)))
