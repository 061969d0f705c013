"""SGD and Adam, step for step as ``torch.optim`` computes them on CPU.

``torch.optim``'s optimizers import torch's compiler stack (``torch._dynamo``, sympy,
inductor) on their first ``add_param_group``, ``zero_grad`` or ``step``, whatever the model:
about 2 s of CPU and 63-71 MB of memory in every client process, which a 512 MB board
pays for a compiler it never runs. These two hold the same state under the same names and
apply the same tensor operations in the same order as torch's single-tensor path (the one
it takes for CPU tensors), so a run's numbers are the same to the bit
(``tests/test_optimizers.py`` steps both side by side). Their ``state_dict`` has
torch's layout, so a client's state file loads into either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

from mqttfl.training.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["SGD", "Adam", "Hyperparameters", "Optimizer", "OptimizerState", "ParamGroup", "Stepper"]


class Hyperparameters(TypedDict, total=False):
    """SGD's or Adam's, under torch's names."""

    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool
    betas: tuple[float, float]
    eps: float


class ParamGroup(Hyperparameters, total=False):
    """One group of parameters and the hyper-parameters that apply to it."""

    params: list[Tensor]


class SavedGroup(Hyperparameters, total=False):
    """A group in a ``state_dict``: its parameters by number."""

    params: list[int]


class OptimizerState(TypedDict):
    """torch's ``state_dict`` layout: parameters numbered across groups, in order."""

    state: dict[int, dict[str, Tensor]]
    param_groups: list[SavedGroup]


class Stepper(Protocol):
    """What a training loop needs of an optimizer (ours or ``torch.optim``'s)."""

    @property
    def param_groups(self) -> Sequence[Mapping[str, Any]]: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> Any: ...


class Optimizer:
    """Parameter groups, per-parameter state and torch's ``state_dict`` layout."""

    def __init__(self, params: Iterable[Tensor], defaults: Hyperparameters) -> None:
        self.defaults = defaults
        self.param_groups: list[ParamGroup] = []
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self.add_param_group({"params": list(params)})

    def add_param_group(self, group: ParamGroup) -> None:
        given: Tensor | Iterable[Tensor] = group["params"]
        params = [given] if isinstance(given, torch.Tensor) else list(given)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("a parameter appears in more than one group")
        self.param_groups.append({**self.defaults, **group, "params": params})

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().requires_grad_(False)
                    p.grad.zero_()

    def step(self) -> None:
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(p, p.grad, group, self.state.setdefault(p, {}))

    def _update(self, p: Tensor, grad: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> None:
        raise NotImplementedError

    def state_dict(self) -> OptimizerState:
        """``{"state": {index: {...}}, "param_groups": [{..., "params": [index, ...]}]}``,
        parameters numbered across groups in order, as torch numbers them."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed = cast("SavedGroup", {k: v for k, v in group.items() if k != "params"})
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if s}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: OptimizerState) -> None:
        """Put back a :meth:`state_dict` (ours or a ``torch.optim`` one of the same kind):
        the saved hyper-parameters and state, onto this optimizer's parameters. The state's
        tensors are copied, so the dict can be loaded again."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
            len(s["params"]) != len(g["params"])
            for s, g in zip(saved, self.param_groups, strict=True)
        ):
            raise ValueError("the saved optimizer state has other parameter groups than this one")
        params: dict[int, Tensor] = {}
        for s, g in zip(saved, self.param_groups, strict=True):
            params.update(zip(s["params"], g["params"], strict=True))
        self.state = {}
        for key, values in state_dict["state"].items():
            p = params[int(key)]
            self.state[p] = {
                name: v.detach().clone() if name == "step" else v.detach().to(p.dtype).clone()
                for name, v in values.items()
            }
        keep = set(self.defaults)
        self.param_groups = [
            cast("ParamGroup", {**g, **{k: v for k, v in s.items() if k in keep}})
            for s, g in zip(saved, self.param_groups, strict=True)
        ]


class SGD(Optimizer):
    """``torch.optim.SGD``: weight decay into the gradient, then the momentum buffer
    ``b ← μ·b + (1-τ)·g`` (``b = g`` at the first step), then ``θ ← θ - lr·b``."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs a momentum and zero dampening")
        defaults = Hyperparameters(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
        super().__init__(params, defaults)

    def _update(self, p: Tensor, grad: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> None:
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = grad.detach().clone()
                state["momentum_buffer"] = buf
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.add_(grad, alpha=-group["lr"])


class Adam(Optimizer):
    """``torch.optim.Adam`` (L2 weight decay into the gradient, no AMSGrad): the moments
    ``m ← lerp(m, g, 1-β1)``, ``v ← β2·v + (1-β2)·g²``, then
    ``θ ← θ - lr/(1-β1^t) · m / (√v/√(1-β2^t) + ε)``."""

    def __init__(
        self,
        params: Iterable[Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = Hyperparameters(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _update(self, p: Tensor, grad: Tensor, group: ParamGroup, state: dict[str, Tensor]) -> None:
        if not state:
            dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = torch.tensor(0.0, dtype=dtype)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        step_t += 1
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = step_t.item()
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = lr / bias_correction1
        denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(group["eps"])
        p.addcdiv_(exp_avg, denom, value=-step_size)
