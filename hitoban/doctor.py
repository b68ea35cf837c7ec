"""`hitoban doctor`: prove the installation end to end in about a minute on a CPU.

Trains a small tokenizer on the built-in Japanese text, builds a tiny HitobanForCausalLM, trains it for a few
steps (loss must fall), generates, saves with `save_pretrained`, reloads with `AutoModelForCausalLM.from_pretrained`
and checks the reloaded model computes the same logits and the same greedy text.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hitoban.errors import CheckFailed
from hitoban.options import checked_against
from hitoban.provenance import write_json
from hitoban.start_options import INSTALL_CHECK_STEPS, DoctorOptions
from hitoban.training.data.corpus import builtin_documents
from hitoban.training.data.tokenizer import train_tokenizer_from_texts
from hitoban.training.tiny import token_stream, train_tiny, windows


@checked_against(DoctorOptions, "steps", "seed")
def run_doctor(out: str | Path, steps: int = INSTALL_CHECK_STEPS, seed: int = 0, vocab_size: int = 1200,
               log=print) -> dict:
    """Run the whole check; returns the report (also written to `out/doctor.json`). Raises if any check fails."""
    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    documents = builtin_documents()

    tok_meta = None
    if not (out / "tokenizer").exists():
        tok_meta = train_tokenizer_from_texts(documents, out / "tokenizer", vocab_size=vocab_size, seed=seed,
                                              model_max_length=128, hard_vocab_limit=False)
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    log(f"tokenizer: {len(tok)} tokens" + (f" trained on {tok_meta['sample']['chars']:,} chars" if tok_meta else ""))

    stream = token_stream(tok, documents)
    model, losses = train_tiny(stream, len(tok), steps, seed, context=64, batch=8, max_positions=128,
                               desc="doctor: training")
    window0 = torch.from_numpy(windows(stream, seed, 0, 8, 64))
    first, last = losses[0], float(np.mean(losses[-5:]))
    log(f"training: loss {first:.3f} -> {last:.3f} in {steps} steps (ln vocab = {math.log(len(tok)):.3f})")

    prompt = tok("夜の研究室は", return_tensors="pt")
    greedy = dict(max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    generated = model.generate(**prompt, **greedy)
    text = tok.decode(generated[0], skip_special_tokens=True)
    log(f"generation: {text}")

    model_dir = out / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        diff = (model(window0).logits - reloaded(window0).logits).abs().max().item()
    same_text = torch.equal(generated, reloaded.generate(**prompt, **greedy))
    log(f"reload: {type(reloaded).__name__} via AutoModelForCausalLM, max |logit diff| {diff:.2e}, "
        f"same greedy text: {same_text}")

    report = {"kind": "doctor", "schema": 1, "loss_first": first, "loss_last": last, "steps": steps,
              "vocab_size": len(tok), "generation": text, "reload_max_abs_diff": diff,
              "reload_same_generation": same_text, "seconds": round(time.time() - started, 1)}
    write_json(out / "doctor.json", report)
    problems = []
    if not last < first - 0.5:
        problems.append(f"loss did not fall ({first:.3f} -> {last:.3f})")
    if diff > 1e-5 or not same_text:
        problems.append("the reloaded model differs from the saved one")
    if problems:
        raise CheckFailed("hitoban doctor failed: " + "; ".join(problems))
    return report
