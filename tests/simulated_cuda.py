"""A CUDA device simulated on the CPU, so that tests of device placement run on machines without a GPU.

Inside `simulated_cuda()`, torch reports one GPU; a tensor "moved" to `cuda` stays in CPU memory (its values are the
real ones) but is tagged as on the device, and reports `device == cuda:0`. Every torch function is watched
(`TorchFunctionMode`), and what a real GPU refuses is refused here with the same kind of error:
- an op that mixes a device tensor with a host tensor of one or more dimensions (a 0-d host tensor is allowed, as
  CUDA allows it in elementwise ops, but not in `cat` or `stack`), except the copies between them (`copy_`, `to`,
  item assignment) and indexing a device tensor with host indices (CUDA copies them over: counted as a copy);
- `.numpy()` (and so `numpy.asarray`) of a device tensor.
Host reads of device values (`.item()`, `.tolist()`, `bool()`, `float()`, `int()`) are counted (`host_reads`), and so
are the copies in each direction.

Tags follow the data: a factory's output is on the device it names (the host where it names none), an op's output is
where its inputs are. The wrappers that functorch's `vmap`, `grad` and `jvp` make
inside a transform carry no tag and are never refused; what a transform returns is where its inputs are. So the
simulation finds mixed devices in the code around the transforms, not inside them. It proves placement, not speed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch._functorch import eager_transforms
from torch._functorch import vmap as functorch_vmap
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

CUDA = torch.device("cuda", 0)
ON_DEVICE, ON_HOST = "device", "host"
_BASE = torch._C.TensorBase
_PROPERTIES = {name: getattr(_BASE, name) for name in ("device", "is_cuda", "is_cpu", "grad", "data")}
_READS = {_BASE.item, _BASE.tolist, _BASE.__bool__, _BASE.__float__, _BASE.__int__, _BASE.__index__}
_CROSS = {_BASE.copy_, _BASE.__setitem__, torch._has_compatible_shallow_copy_type}  # cross-device by design
_JOINS = {torch.cat, torch.concat, torch.stack, torch.hstack, torch.vstack}  # no host scalar joins a device op here
_REFUSED_READS = {_BASE.numpy, torch.Tensor.__array__}


class SimulatedCuda(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.where: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> ON_DEVICE | ON_HOST
        self.host_reads = 0
        self.to_host = 0
        self.to_device = 0

    def on_device(self, tensor: torch.Tensor) -> bool:
        return self.where.get(tensor) == ON_DEVICE

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is not None and func.__name__ in ("__get__", "__set__"):
            return self._property(owner, func, args)
        if func in (_BASE.to, _BASE.cuda, _BASE.cpu):
            return self._move(func, args, kwargs)
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if func in _REFUSED_READS and any(map(self.on_device, tensors)):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first. (simulated CUDA)")
        if func in _READS and any(map(self.on_device, tensors)):
            self.host_reads += 1
        if "device" in kwargs:  # a factory (or `new_*`) naming its device
            target = torch.device(kwargs["device"]) if kwargs["device"] is not None else None
            kwargs = {**kwargs, "device": "cpu"}
            return self._tagged(func(*args, **kwargs), ON_DEVICE if target and target.type == "cuda" else ON_HOST)
        if func is _BASE.__getitem__ and self.on_device(args[0]):  # CUDA copies a host index to the device itself
            self.to_device += sum(1 for t in tensors[1:] if self.where.get(t) == ON_HOST and t.dim() > 0)
            return self._tagged(func(*args, **kwargs), ON_DEVICE)
        where = self._inputs_where(func, tensors)
        if func in _CROSS:  # a copy into its first argument, which stays where it is
            return func(*args, **kwargs)
        return self._tagged(func(*args, **kwargs), where)

    def _inputs_where(self, func: Any, tensors: list[torch.Tensor]) -> str | None:
        tags = [self.where.get(t) for t in tensors]
        if not tensors:
            return ON_HOST
        device = ON_DEVICE in tags
        host = any(tag == ON_HOST and (t.dim() > 0 or func in _JOINS) for tag, t in zip(tags, tensors, strict=True))
        if device and host and func not in _CROSS:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"cuda:0 and cpu! ({getattr(func, '__name__', func)}; simulated CUDA)")
        return ON_DEVICE if device else ON_HOST if ON_HOST in tags else None

    def _tagged(self, result: Any, where: str | None) -> Any:
        if where is not None:
            for leaf in pytree.tree_leaves(result):
                if isinstance(leaf, torch.Tensor):
                    self.where[leaf] = where
        return result

    def _property(self, owner: Any, func: Any, args: tuple) -> Any:
        tensor = args[0]
        if func.__name__ == "__set__":  # `param.data = value`: the parameter is now where the value is
            func(*args)
            if owner is _PROPERTIES["data"] and args[1] in self.where:
                self.where[tensor] = self.where[args[1]]
            return None
        here = self.on_device(tensor)
        if owner is _PROPERTIES["device"]:
            return CUDA if here else func(*args)
        if owner is _PROPERTIES["is_cuda"]:
            return here
        if owner is _PROPERTIES["is_cpu"]:
            return not here
        result = func(*args)
        if owner in (_PROPERTIES["grad"], _PROPERTIES["data"]) and isinstance(result, torch.Tensor) and \
                tensor in self.where:
            self.where[result] = self.where[tensor]
        return result

    def _move(self, func: Any, args: tuple, kwargs: dict) -> Any:
        tensor, rest = args[0], list(args[1:])
        target = _target(func, rest, kwargs, self)
        if target is None:  # a dtype change only: it stays where it is
            return self._tagged(func(*args, **kwargs), self.where.get(tensor))
        to_device = target.type == "cuda"
        rest = [_host_alias(a) for a in rest]
        kwargs = {k: _host_alias(v) for k, v in kwargs.items()}
        if func is not _BASE.to:
            func, rest = _BASE.to, ["cpu"]
        if to_device == self.on_device(tensor):
            return self._tagged(func(tensor, *rest, **kwargs), self.where.get(tensor))
        if to_device:
            self.to_device += 1
        else:
            self.to_host += 1
        moved = func(tensor, *rest, **{**kwargs, "copy": True})
        return self._tagged(moved, ON_DEVICE if to_device else ON_HOST)


def _target(func: Any, rest: list, kwargs: dict, sim: SimulatedCuda) -> torch.device | None:
    """The device a `to`, `cuda` or `cpu` call moves to, or None (a dtype change only)."""
    if func is _BASE.cuda:
        return CUDA
    if func is _BASE.cpu:
        return torch.device("cpu")
    for value in [*rest, kwargs.get("device")]:
        if isinstance(value, torch.Tensor):
            return CUDA if sim.on_device(value) else torch.device("cpu")
        if isinstance(value, str | torch.device):
            return torch.device(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return torch.device("cuda", value)
    return None


def _host_alias(value: Any) -> Any:
    """A `to` argument with any device replaced by the CPU, where the values really lie."""
    if isinstance(value, str | torch.device) or (isinstance(value, int) and not isinstance(value, bool)):
        return "cpu"
    return value


# functorch's entry points, looked up at call time by the public transforms: (module, name, its inputs from its args)
_TRANSFORMS = [
    (functorch_vmap, "_flat_vmap", lambda args, kwargs: args[3]),
    (eager_transforms, "grad_and_value_impl", lambda args, kwargs: (args[3], args[4])),
    (eager_transforms, "_jvp_with_argnums", lambda args, kwargs: (args[1], args[2])),
]


def _tagging(sim: SimulatedCuda, transform: Any, inputs_of: Any) -> Any:
    """`transform` with its outputs tagged where its inputs are (functorch unwraps them outside any torch function)."""
    def tagged(*args: Any, **kwargs: Any) -> Any:
        tensors = [t for t in pytree.tree_leaves(inputs_of(args, kwargs)) if isinstance(t, torch.Tensor)]
        tags = {sim.where.get(t) for t in tensors}
        where = ON_DEVICE if ON_DEVICE in tags else ON_HOST if ON_HOST in tags else None
        return sim._tagged(transform(*args, **kwargs), where)
    return tagged


def _on_host(sim: SimulatedCuda, make: Any) -> Any:
    def made_on_host(*args: Any, **kwargs: Any) -> Any:
        return sim._tagged(make(*args, **kwargs), ON_HOST)
    return made_on_host


@contextlib.contextmanager
def simulated_cuda() -> Iterator[SimulatedCuda]:
    """One simulated GPU, with torch's CUDA queries answering for it."""
    answers = {"is_available": lambda: True, "device_count": lambda: 1, "is_initialized": lambda: True,
               "get_device_name": lambda *a: "simulated CUDA (CPU)", "current_device": lambda: 0,
               "mem_get_info": lambda *a: (64 << 30, 80 << 30), "synchronize": lambda *a: None,
               "manual_seed_all": lambda *a: None}
    saved = {name: getattr(torch.cuda, name) for name in answers}
    for name, answer in answers.items():
        setattr(torch.cuda, name, answer)
    sim = SimulatedCuda()
    parameter = nn.Parameter.__dict__["__new__"]

    def new_parameter(cls: type, data: torch.Tensor | None = None, requires_grad: bool = True) -> nn.Parameter:
        made = parameter.__func__(cls, data, requires_grad)  # a new tensor object, made outside any torch function
        return sim._tagged(made, ON_HOST if data is None else sim.where.get(data))

    nn.Parameter.__new__ = new_parameter  # type: ignore[method-assign]
    # tensors over host memory, made outside any torch function
    viewers = {name: getattr(torch, name) for name in ("from_numpy", "frombuffer")}
    for name, viewer in viewers.items():
        setattr(torch, name, _on_host(sim, viewer))
    transforms = [(module, name, getattr(module, name)) for module, name, _ in _TRANSFORMS]
    for module, name, inputs_of in _TRANSFORMS:
        setattr(module, name, _tagging(sim, getattr(module, name), inputs_of))
    try:
        with sim:
            yield sim
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)
        for module, name, original in transforms:
            setattr(module, name, original)
        nn.Parameter.__new__ = parameter  # type: ignore[method-assign]
        for name, viewer in viewers.items():
            setattr(torch, name, viewer)


@contextlib.contextmanager
def a_gpu() -> Iterator[SimulatedCuda | None]:
    """The real GPU where torch sees one (None), else the simulated one."""
    if torch.cuda.is_available():
        yield None
    else:
        with simulated_cuda() as sim:
            yield sim
