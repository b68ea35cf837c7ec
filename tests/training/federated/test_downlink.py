"""The downlink: the fp16 outer update against a hand computation, and on the in-process grid the bytes it saves,
the sha256 every machine checks, and what happens when a machine does not hold the weights an update is for."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the federated extra: pip install 'hitoban[federated]'")

from test_server import BATCH, CTX, STEPS, LocalGrid, machines, records, start  # noqa: E402

from hitoban.training.federated.downlink import (  # noqa: E402
    apply_update,
    encode_update,
    scale_exponent,
    weights_digest,
)


def test_the_update_keeps_fp16s_precision_at_every_scale_and_both_sides_rebuild_the_same_bits():
    torch.manual_seed(0)
    old = {"big": torch.randn(64) * 3, "tiny": torch.randn(64) * 1e-3}
    new = {"big": old["big"] + torch.randn(64) * 0.1, "tiny": old["tiny"] + torch.randn(64) * 1e-9}
    update, scales = encode_update(new, old)
    for name in old:  # by hand: the largest scaled step lies in [2^14, 2^15], the scale is a power of two
        step = (new[name] - old[name]).double()
        largest = float(step.abs().max()) * 2.0 ** scales[name]
        assert 2**14 <= largest <= 2**15 and update[name].dtype == torch.float16
        rebuilt = apply_update(old, update, scales)[name].double()
        # fp16 keeps 11 significant bits of each step (relative error <= 2^-11), then one fp32 rounding of the sum
        bound = step.abs() * 2.0**-11 + old[name].double().abs() * 2.0**-23 + 1e-30
        assert ((rebuilt - new[name].double()).abs() <= bound).all(), name
    # the control: a plain fp16 cast loses the 1e-9 steps entirely (below fp16's smallest subnormal, 6e-8)
    assert (((new["tiny"] - old["tiny"]).half().float()) == 0).all()
    assert scale_exponent(torch.zeros(3)) == 0
    # the server and a machine rebuild from the same old weights and the same update: the same bits
    again = apply_update({k: v.clone() for k, v in old.items()}, {k: v.clone() for k, v in update.items()}, scales)
    assert weights_digest(again) == weights_digest(apply_update(old, update, scales))


@pytest.mark.slow
def test_after_the_first_round_machines_get_the_fp16_update_and_check_its_sha256(tiny_shards, tmp_path):
    run = tmp_path / "run"
    server = start(tiny_shards, run, inner_steps=1, probe_steps=1)  # 6 rounds of one step per machine
    summary = server.serve(LocalGrid(machines(tiny_shards, tmp_path)))
    assert summary["reissued"] == [] and summary["tokens_seen"] == CTX * BATCH * STEPS
    params = sum(int(np.prod(shape)) for shape in server.expected.values())
    rounds = records(run, "round")
    assert len(rounds) == 6
    # fp32 weights in full the first time, then 16 bits a parameter (an ArrayRecord adds ~2 kB of names and shapes)
    assert rounds[0]["bytes_down"] == pytest.approx(rounds[0]["machines"] * 4 * params, rel=0.01)
    for r in rounds[1:]:
        assert r["bytes_down"] == pytest.approx(r["machines"] * 2 * params, rel=0.01)
    # a machine of the last round holds the weights it trained from (it checked their sha256); the final model is
    # the server's rounded weights: its last update applied to those, bit for bit
    from safetensors import safe_open
    from safetensors.torch import load_file

    from hitoban.modeling import HitobanForCausalLM
    from hitoban.training.federated.outer import shared_tensors

    holders = []
    for name in ("a", "b"):
        with safe_open(str(tmp_path / name / "global-weights.safetensors"), "pt") as f:
            holders.append((int(f.metadata()["version"]), name))
    version, name = max(holders)
    assert version == len(rounds) - 1
    final = HitobanForCausalLM.from_pretrained(run / "final")
    round_, update, scales = server.last_update
    assert round_ == len(rounds)
    rebuilt = apply_update(load_file(str(tmp_path / name / "global-weights.safetensors")), update, scales)
    assert weights_digest(rebuilt) == weights_digest(dict(shared_tensors(final)))


class Tampered(LocalGrid):
    """One fp16 update altered on its way to node 11 in round `at` (a corrupted or stale copy)."""

    def __init__(self, *args, at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.at = at

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        if self.round + 1 == self.at:
            for message in messages:
                if message.metadata.dst_node_id == 11 and "update" in message.content.array_records:
                    from flwr.app import Array, ArrayRecord

                    # a copy for node 11 alone: the server sends one record to every node that gets the update
                    record = ArrayRecord({k: Array(v.numpy().copy()) for k, v in
                                          message.content.array_records["update"].items()})
                    name = next(iter(record))
                    array = record[name].numpy().copy()
                    array.flat[0] = np.float16(-1000.0) if array.flat[0] > 0 else np.float16(1000.0)
                    record[name] = Array(array)
                    message.content["update"] = record
        return super().send_and_receive(messages, timeout)


@pytest.mark.slow
def test_a_machine_whose_weights_do_not_match_is_refused_and_gets_them_in_full(tiny_shards, tmp_path):
    run = tmp_path / "run"
    summary = start(tiny_shards, run, inner_steps=1, probe_steps=1).serve(
        Tampered(machines(tiny_shards, tmp_path), at=2))
    refused = records(run, "refused")
    assert len(refused) == 1 and "do not match the server's sha256" in refused[0]["why"]
    assert summary["tokens_seen"] == CTX * BATCH * STEPS  # its task went back to the queue and was trained once
    assert [r["lost_by"] for r in summary["reissued"]] == ["b"]
    rounds = records(run, "round")
    params = sum(int(np.prod(s)) for s in start(tiny_shards, tmp_path / "other").expected.values())
    # round 3: b gets the weights in full again, a the update
    assert rounds[2]["bytes_down"] == pytest.approx((4 + 2) * params, rel=0.01)
    # a machine that lost its weights (its state folder wiped) is refused the update, not trained on other weights
    from hitoban.training.federated.inner import Machine

    machine = Machine(tiny_shards, tmp_path / "empty", "c", cpu=True)
    assert machine.held_weights(json.loads((run / "config.json").read_text())["run_id"], 1) is None
