"""The night's optimizers (docs/design.md §6): Muon on the hidden matrices with AdamW on the rest (the default),
or AdamW on everything (3LM). The schedule is training/schedule.py's.

AdamW: torch's `AdamW` with bias correction by default. 3LM's MLX AdamW had no bias correction, which torch cannot
switch off, so `AdamW(bias_correction=False)` is a small subclass doing exactly that update; both keep torch's state
layout (`step`, `exp_avg`, `exp_avg_sq`), so checkpoints and resume treat them alike. Without bias correction the
first updates are ~10x smaller (m starts at 0.1·g), which acts as an extra implicit warmup.
"""

from __future__ import annotations

import torch
from torch.optim._muon import _adjust_lr

from hitoban.errors import CheckpointError


class AdamW(torch.optim.AdamW):
    """torch AdamW, plus `bias_correction=False` for 3LM's MLX semantics (decay on every parameter)."""

    def __init__(self, params, lr: float = 6e-4, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.1,
                 bias_correction: bool = True):
        # fused: one kernel for all parameters on CPU, CUDA and MPS (small b16 on 2 CPU cores: 19 ms per update
        # against 41 ms for the per-parameter loop); deterministic, so CPU runs and resumes stay bit-identical
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
        self.bias_correction = bias_correction
        # The fused kernel skips an fp16 overflow step itself (the GradScaler hands it `found_inf`); the update below
        # does not read `found_inf`, so the scaler must unscale, check and skip for it, as for any plain optimizer.
        self._step_supports_amp_scaling = bias_correction

    @torch.no_grad()
    def step(self, closure=None):
        if self.bias_correction:
            return super().step(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0, device=p.device)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-group["lr"])
        return None


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """Muon's parameters: the 2-D weights inside the decoder layers. Embeddings (and the tied output) and norms
    stay with AdamW, as in modded-nanogpt and nanochat."""
    return param.ndim == 2 and ".layers." in f".{name}"


class _RoutedState(dict):
    """`optimizer.state` of a Hybrid: reads see every optimizer's state; a write goes to the parameter's owner."""

    def __init__(self, hybrid: Hybrid):
        super().__init__()
        self.hybrid = hybrid

    def _owner(self, param):
        return next(o for o in self.hybrid.optimizers if any(param is p for g in o.param_groups for p in g["params"]))

    def __getitem__(self, param):
        return self._owner(param).state[param]

    def __setitem__(self, param, value):
        self._owner(param).state[param] = value

    def get(self, param, default=None):
        owner = self._owner(param)
        return owner.state[param] if param in owner.state else default

    def __contains__(self, param):
        return any(param in o.state for o in self.hybrid.optimizers)

    def values(self):
        return [v for o in self.hybrid.optimizers for v in o.state.values()]

    def items(self):
        return [kv for o in self.hybrid.optimizers for kv in o.state.items()]

    def keys(self):
        return [k for o in self.hybrid.optimizers for k in o.state.keys()]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return sum(len(o.state) for o in self.hybrid.optimizers)


class Hybrid(torch.optim.Optimizer):
    """Several optimizers stepped as one (Muon for hidden matrices, AdamW for the rest): one object for the
    training loop, Accelerate and the checkpoint, with every parameter's state where its own optimizer keeps it."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self.defaults = {}
        self._state = _RoutedState(self)
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self._optimizer_state_dict_pre_hooks, self._optimizer_state_dict_post_hooks = {}, {}
        self._optimizer_load_state_dict_pre_hooks, self._optimizer_load_state_dict_post_hooks = {}, {}

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self):
        return self._state

    @torch.no_grad()
    def step(self, closure=None):
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        for optimizer, sd in zip(self.optimizers, state_dict["optimizers"]):
            optimizer.load_state_dict(sd)


def orthogonalize(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """torch's quintic Newton-Schulz iteration (`torch.optim._muon._zeropower_via_newtonschulz`, the same operations
    in the same order) in `dtype`: torch fixes bf16, which a CPU without AVX512-BF16/AMX or a GPU before Ampere
    only emulates (4x slower per step on an AVX2 CPU) and MPS before macOS 14 refuses."""
    a, b, c = coefficients
    x = update.to(dtype, copy=True)
    if update.size(0) > update.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if update.size(0) > update.size(1) else x


class Muon(torch.optim.Muon):
    """torch's Muon with its Newton-Schulz iteration in a chosen dtype (`hardware.plan_device` decides: bf16 where
    the device multiplies it natively, fp32 elsewhere). State, groups and checkpoints are torch's own."""

    def __init__(self, params, lr: float, weight_decay: float, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, lr=lr, weight_decay=weight_decay, **kwargs)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            for param, grad, buf in zip(params, grads, buffers):
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                       self.ns_dtype)
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(update, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], param.shape))
        return None


def build_optimizer(model: torch.nn.Module, name: str = "adamw", lr: float = 6e-4, weight_decay: float = 0.1,
                    bias_correction: bool = True, muon_dtype: str = "bfloat16", adamw_ratio: float = 1.0
                    ) -> torch.optim.Optimizer:
    """AdamW on everything, or Muon on the hidden matrices (its update scaled to AdamW's RMS, so one schedule serves
    both; Newton-Schulz in `muon_dtype`) with AdamW on embeddings and norms at `adamw_ratio` of Muon's lr: the
    group's `lr_scale`, which every setter of the schedule's lr applies (`set_lr`)."""
    if name == "adamw":
        return AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, bias_correction=bias_correction)
    hidden = [p for n, p in model.named_parameters() if is_hidden_matrix(n, p)]
    rest = [p for n, p in model.named_parameters() if not is_hidden_matrix(n, p)]
    muon = Muon(hidden, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw",
                ns_dtype=getattr(torch, muon_dtype))
    adamw = AdamW(rest, lr=lr * adamw_ratio, weight_decay=weight_decay, bias_correction=bias_correction)
    adamw.param_groups[0]["lr_scale"] = adamw_ratio
    return Hybrid([muon, adamw])


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group at the schedule's `lr`, times its own `lr_scale` where it has one (AdamW's beside Muon)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr


def schedule_lr(optimizer: torch.optim.Optimizer) -> float:
    """The schedule's lr the optimizer was last set to: its first group's, which has no scale of its own."""
    group = optimizer.param_groups[0]
    return float(group["lr"]) / group.get("lr_scale", 1.0)


# ------------------------------------------------ where a restored optimizer state must sit (resume, a machine's)
def state_device(group: dict, param: torch.Tensor, key: str) -> torch.device:
    """Where an optimizer reads one state tensor: a fused or capturable AdamW reads everything, `step` included, on
    the parameter's device (torch's own load_state_dict keeps it there for them); a plain (for-each) one reads `step`
    on the CPU (on the device it costs a host sync per parameter per step) and the rest on the parameter's device."""
    on_device = group.get("fused") or group.get("capturable") or key != "step"
    return param.device if on_device else torch.device("cpu")


def place_step_counters(optimizer: torch.optim.Optimizer) -> None:
    """Put each restored `step` counter where its optimizer reads it (`state_device`): Accelerate's prepare() moves
    the whole restored state to the device, and a fused AdamW fails at its first step with `step` anywhere else."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].to(state_device(group, param, "step"))


# ---------------------------------------- optimizer state as named tensors (a checkpoint's, a federated machine's)
STATE_NAMES = {"exp_avg": "m", "exp_avg_sq": "v", "momentum_buffer": "momentum"}  # AdamW's m, v; Muon's momentum


SCALER_PREFIX = "scaler."  # fp16's GradScaler: scale, growth tracker and its settings (GradScaler.state_dict)


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler=None
                      ) -> dict[str, torch.Tensor]:
    """Flatten optimizer state into `<param name>.m` / `.v` (AdamW) or `.momentum` (Muon) plus `step` and `lr`
    (3LM's optimizer.safetensors, extended); `stateful`, how many parameters had state (0 for an optimizer that
    keeps none, such as SGD without momentum); and under fp16 the gradient scaler's state (`scaler.*`), without
    which a resumed run would start again at a scale of 65,536 and skip the overflow steps the uninterrupted run
    had already left behind."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors: dict[str, torch.Tensor] = {}
    step = stateful = 0
    tensors["lr"] = torch.tensor(schedule_lr(optimizer), dtype=torch.float64)
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            stateful += 1
            for key, short in STATE_NAMES.items():
                if key in state:
                    tensors[f"{names[id(p)]}.{short}"] = state[key].detach().contiguous()
            if "step" in state:
                step = int(state["step"])
    tensors["step"] = torch.tensor(step, dtype=torch.int64)
    tensors["stateful"] = torch.tensor(stateful, dtype=torch.int64)
    if scaler is not None and scaler.is_enabled():
        for key, value in scaler.state_dict().items():
            tensors[SCALER_PREFIX + key] = torch.tensor(value, dtype=torch.float64)  # exact for these ints and floats
    return tensors


def load_optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tensors: dict,
                           scaler=None) -> int:
    """Restore every moment, the step and (fp16) the gradient scaler bit for bit; returns the step. Missing entries
    are an error, not a silent reset: only an optimizer that kept no state at all (`stateful` 0) has none."""
    step = int(tensors["step"])
    stateless = "stateful" in tensors and int(tensors["stateful"]) == 0
    for name, p in model.named_parameters():
        saved = {key: tensors[f"{name}.{short}"] for key, short in STATE_NAMES.items() if f"{name}.{short}" in tensors}
        if not saved:
            if stateless:
                optimizer.state.pop(p, None)
                continue
            raise CheckpointError(f"optimizer state has no moments for {name}")
        state = {key: value.clone() for key, value in saved.items()}
        if "exp_avg" in state:
            state["step"] = torch.tensor(float(step))
        optimizer.state[p] = state
    set_lr(optimizer, float(tensors["lr"]))
    if scaler is not None and scaler.is_enabled():
        saved = {k[len(SCALER_PREFIX):]: v for k, v in tensors.items() if k.startswith(SCALER_PREFIX)}
        if not saved:
            raise CheckpointError("this fp16 run's checkpoint has no gradient scaler state (written by an older "
                                  "hitoban): resuming would restart the scale; start over with --resume never")
        scaler.load_state_dict({k: int(v) if k in ("growth_interval", "_growth_tracker") else float(v)
                                for k, v in saved.items()})
    return step
