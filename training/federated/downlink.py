"""The global weights on their way down to a machine: in full (fp32) once, then as the fp16 outer update.

A machine that trained in the last round holds the global weights it was sent then. The server's new weights differ
from those by one outer step, so it sends that step in 16 bits instead of the weights in 32: half the bytes down,
which with the fp16 deltas up makes a machine's traffic 4 bytes per parameter per round instead of 6. Both sides
must then hold the *same* weights, bit for bit, or the next delta is taken against other weights. So the server
rounds its own step the way it sends it: the global model is `old + decode(encode(new - old))`, computed in fp32 by
`apply_update` on both sides, and every message names the sha256 of the weights the machine must end up with.

Each tensor's step is scaled by a power of two before the cast, so its largest value sits just under fp16's top
(2^15) whatever its size: every value keeps fp16's 11 significant bits down to 2^-29 of the largest one, where a
plain cast would lose the small steps of the norms and late-schedule weights to fp16's subnormals. A power of two
makes the scaling exact both ways.
"""

from __future__ import annotations

import hashlib
import json
import math

import torch

WEIGHTS, UPDATE = "weights", "update"  # the record names of the two kinds of downlink
FP16_TOP = 2.0**15  # the largest power of two below fp16's maximum (65504): a scaled step never overflows


def scale_exponent(step: torch.Tensor) -> int:
    """k such that max|step| * 2^k lies in [2^14, 2^15]: the step's fp16 cast then uses all of fp16's range."""
    largest = float(step.abs().max()) if step.numel() else 0.0
    if largest == 0.0 or not math.isfinite(largest):
        return 0
    return max(-100, min(100, math.floor(math.log2(FP16_TOP / largest))))


def encode_update(new: dict[str, torch.Tensor], old: dict[str, torch.Tensor]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """(fp16 (new - old) * 2^k per tensor, {name: k}): what a machine holding `old` needs to reach the new weights."""
    update, scales = {}, {}
    for name, weight in new.items():
        step = weight.detach().float().cpu() - old[name]
        scales[name] = scale_exponent(step)
        update[name] = (step * 2.0 ** scales[name]).to(torch.float16)
    return update, scales


def apply_update(old: dict[str, torch.Tensor], update: dict[str, torch.Tensor], scales: dict[str, int]
                 ) -> dict[str, torch.Tensor]:
    """old + update * 2^-k in fp32: the same arithmetic on the server and on every machine, so the same weights."""
    return {name: old[name] + update[name].float() * 2.0 ** -int(scales[name]) for name in old}


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the fp32 weights by name: what a machine checks after applying an update (or receiving weights)."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode() + b"\0")
        digest.update(weights[name].detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def encode_scales(scales: dict[str, int]) -> str:
    return json.dumps(scales, sort_keys=True)


def decode_scales(text: str) -> dict[str, int]:
    return {name: int(k) for name, k in json.loads(text).items()}
