"""What a resume must match and where its restored state must sit (docs/design.md §7).

A resumed run continues the same trajectory only if everything that shapes it is unchanged: the fingerprint below
is recorded once in every checkpoint (`TrainState.fingerprint`) and compared at every resume
(`checkpoint.check_resumable`), with deliberate changes allowed by name.
"""

from __future__ import annotations

import torch

from hitoban.errors import UsageError
from hitoban.modeling import HitobanConfig
from hitoban.training.optim import state_device
from hitoban.training.pretrain.checkpoint import CheckpointError
from hitoban.training.pretrain.options import TrainingOptions, trajectory_fields

# Options that change the training trajectory (declared on the option fields, `trajectory=True`), and the budget the
# schedule was built for: a resume with any of them changed is refused unless allowed. (--compile is not one:
# compiled and eager runs resume each other's checkpoints.)
TRAJECTORY_OPTIONS = (*trajectory_fields(), "total_steps")


def trajectory_fingerprint(options: TrainingOptions, config: HitobanConfig, index: dict, data_index_sha256: str,
                           context: int, total_steps: int, precision: str) -> dict:
    """Everything a resumed run must share with its checkpoint to continue the same trajectory."""
    model_config = config.to_diff_dict()
    for key in ("transformers_version", "dropout"):  # dropout is named on its own, so a refusal can say so
        model_config.pop(key, None)
    values = {**{k: getattr(options, k) for k in TRAJECTORY_OPTIONS if hasattr(options, k)}, "context": context,
              "total_steps": total_steps, "precision": precision}
    return {"model_config": model_config, "tokenizer_sha256": index["tokenizer"]["sha256"],
            "data_index_sha256": data_index_sha256, **{k: values[k] for k in TRAJECTORY_OPTIONS}}


def allowed_changes(option: str | None) -> set[str]:
    names = {name.strip().replace("-", "_") for name in (option or "").split(",") if name.strip()}
    unknown = sorted(names - set(TRAJECTORY_OPTIONS))
    if unknown:
        raise UsageError(f"--allow-change: unknown option(s) {unknown}; choose from {', '.join(TRAJECTORY_OPTIONS)}")
    return names


def check_state_placement(optimizer: torch.optim.Optimizer) -> None:
    """Every state tensor where its optimizer reads it (`state_device`), or a CheckpointError naming the first that
    is not (the check `hitoban doctor` runs after a resume)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in (optimizer.state.get(param) or {}).items():
                want = state_device(group, param, key)
                if torch.is_tensor(value) and value.device != want:
                    raise CheckpointError(f"optimizer state {key!r} of a {tuple(param.shape)} parameter is on "
                                          f"{value.device}, its optimizer reads it on {want}")
