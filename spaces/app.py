"""Gradio Space for a hitoban model: streaming chat, sampling controls, raw continuation, model info.

Self-contained (the Space does not install hitoban): the model loads with `trust_remote_code=True` from the
`modeling_hitoban.py` saved beside its weights. The model id comes from the `HITOBAN_MODEL` environment variable
(a Hub id or a local folder), else from `models:` in this Space's README.md.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import gradio as gr
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TextIteratorStreamer,
    TopKLogitsWarper,
)

MAX_INPUT_CHARS = 400  # longer messages are cut: a CPU Space must answer everyone in the queue
MAX_NEW_TOKENS = 256
STOP_TOKENS = ("<|end|>", "<|user|>")


def model_id_from_config(readme: Path = Path(__file__).with_name("README.md")) -> str | None:
    """First entry of `models:` in the Space card's YAML header (no YAML dependency needed for this one list)."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    if not text.startswith("---"):
        return None
    lines = text.split("---", 2)[1].splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("models:"):
            inline = line.split(":", 1)[1].strip().strip("[]")
            if inline:
                return inline.split(",")[0].strip().strip("'\"")
            for item in lines[i + 1:]:
                if item.strip().startswith("- "):
                    return item.strip()[2:].strip().strip("'\"")
    return None


# The same test as hitoban's `training.hardware.cpu_has_native_bf16` (the Space cannot import hitoban; a test keeps
# the two equal): x86 AMX / AVX512-BF16, Arm's `bf16` feature.
NATIVE_BF16_FLAGS = re.compile(r"\b(?:amx_bf16|avx512_bf16|bf16)\b")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = " ".join(line.split(":", 1)[1] for line in cpuinfo.splitlines()
                     if line.lower().startswith(("flags", "features")) and ":" in line)
    return bool(NATIVE_BF16_FLAGS.search(flags))


def weights_dtype(device: str) -> torch.dtype:
    """bf16 weights where the hardware multiplies bf16 natively: decoding one token reads every weight, so half the
    bytes is about twice the tokens per second (hitoban chat: 60 -> 125 tok/s on 2 AVX512-BF16 cores). fp32
    elsewhere (emulated bf16 is ~4x slower). HITOBAN_DTYPE=float32|bfloat16 overrides."""
    if os.environ.get("HITOBAN_DTYPE"):
        return getattr(torch, os.environ["HITOBAN_DTYPE"])
    if device == "cuda":  # native from compute capability 8.0; is_bf16_supported() also counts emulation
        return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float32
    return torch.bfloat16 if device == "cpu" and cpu_has_native_bf16() else torch.float32


def load(model_id: str):
    device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    # the tokenizer is transformers' own class, but AutoTokenizer reads config.json (auto_map) first
    tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(model_id, trust_remote_code=True, dtype=weights_dtype(device))
    return model.to(device).eval(), tokenizer


def model_info(model, model_id: str) -> str:
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return (f"**{model_id}** · {params / 1e6:.1f}M parameters · {c.num_hidden_layers} layers · "
            f"d_model {c.hidden_size} · {c.num_attention_heads} heads · context {c.max_position_embeddings} · "
            f"vocab {c.vocab_size} · running on {model.device.type} in {str(model.dtype).removeprefix('torch.')}")


def sampling_processors(temperature: float, top_k: int, repetition_penalty: float) -> LogitsProcessorList:
    """The processors `generate` builds for these settings, in its order (a test compares the tokens)."""
    processors = LogitsProcessorList()
    if repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
    if temperature > 0:
        if temperature != 1.0:
            processors.append(TemperatureLogitsWarper(temperature))
        if top_k:
            processors.append(TopKLogitsWarper(top_k))
    return processors


@torch.no_grad()
def decode(model, input_ids: torch.Tensor, temperature: float, top_k: int, repetition_penalty: float,
           max_new_tokens: int, stop_ids: list[int], streamer=None) -> torch.Tensor:
    """`generate`'s sampling loop for one sequence without its per-step machinery: the same float32 scores, the
    same processors, the same `multinomial` draws, so greedy tokens and seeded samples equal `generate`'s (tested),
    about 1.2x faster on a CPU. hitoban's `evaluation.generation.decode` is the same loop (the Space cannot import
    hitoban)."""
    cache = DynamicCache(config=model.config)
    processors = sampling_processors(temperature, top_k, repetition_penalty)
    sequence = input_ids
    if streamer is not None:
        streamer.put(sequence.cpu())  # the prompt (skip_prompt drops it)
    logits = model(sequence, cache=cache, use_cache=True, logits_to_keep=1).logits
    for _ in range(max_new_tokens):
        scores = processors(sequence, logits[:, -1, :].to(dtype=torch.float32, copy=True))
        if temperature > 0:
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)
        else:
            token = scores.argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, token], dim=-1)
        if streamer is not None:
            streamer.put(token.cpu())
        if int(token) in stop_ids:
            break
        logits = model(token, cache=cache, use_cache=True).logits
    if streamer is not None:
        streamer.end()
    return sequence


def stream_generate(model, tokenizer, input_ids: torch.Tensor, temperature: float, top_k: int,
                    repetition_penalty: float, max_new_tokens: int, stop_ids: list[int] | None = None):
    """Yield the cumulative decoded text while `decode` runs in a thread (TextIteratorStreamer)."""
    max_new_tokens = max(1, min(int(max_new_tokens), MAX_NEW_TOKENS))
    room = model.config.max_position_embeddings - max_new_tokens
    input_ids = input_ids[:, -max(room, 16):].to(model.device)  # keep the latest turns when the history is long
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=120)
    thread = threading.Thread(target=decode, daemon=True,
                              args=(model, input_ids, float(temperature), int(top_k), float(repetition_penalty),
                                    max_new_tokens, stop_ids or [tokenizer.eos_token_id], streamer))
    thread.start()
    text = ""
    for piece in streamer:
        text += piece
        yield text
    thread.join()


def build_demo(model_id: str | None = None) -> gr.Blocks:
    model_id = model_id or os.environ.get("HITOBAN_MODEL") or model_id_from_config()
    if not model_id:
        raise RuntimeError("no model: set HITOBAN_MODEL or list it under `models:` in the Space README.md")
    model, tokenizer = load(model_id)
    stop_ids = [tokenizer.convert_tokens_to_ids(t) for t in STOP_TOKENS if t in tokenizer.get_vocab()]

    def sliders():
        return [gr.Slider(0.0, 1.5, value=0.8, step=0.05, label="temperature (0 = greedy)"),
                gr.Slider(0, 100, value=40, step=1, label="top-k (0 = off)"),
                gr.Slider(1.0, 2.0, value=1.15, step=0.05, label="repetition penalty"),
                gr.Slider(8, MAX_NEW_TOKENS, value=128, step=8, label="max new tokens")]

    def chat(message, history, temperature, top_k, repetition_penalty, max_new_tokens):
        turns = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else str(m["content"])}
                 for m in history] + [{"role": "user", "content": str(message)[:MAX_INPUT_CHARS]}]
        ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        yield from stream_generate(model, tokenizer, ids, temperature, top_k, repetition_penalty, max_new_tokens,
                                   stop_ids)

    def continue_text(text, temperature, top_k, repetition_penalty, max_new_tokens):
        text = str(text)[:MAX_INPUT_CHARS]
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        for partial in stream_generate(model, tokenizer, ids, temperature, top_k, repetition_penalty,
                                       max_new_tokens):
            yield text + partial

    with gr.Blocks(title=f"hitoban · {model_id}") as demo:
        gr.Markdown(f"# 一晩 hitoban\n{model_info(model, model_id)}")
        with gr.Tab("Chat"):
            gr.ChatInterface(chat, additional_inputs=sliders(), api_name="chat", concurrency_limit=2,
                             additional_inputs_accordion=gr.Accordion("sampling", open=False),
                             textbox=gr.Textbox(placeholder="メッセージを入力…", max_length=MAX_INPUT_CHARS,
                                                submit_btn=True))
        with gr.Tab("Raw continuation"):
            prompt = gr.Textbox(label="text to continue", value="吾輩は", max_length=MAX_INPUT_CHARS, lines=3)
            output = gr.Textbox(label="continuation", lines=8)
            raw_sliders = sliders()
            gr.Button("Continue").click(continue_text, [prompt, *raw_sliders], output, api_name="continue",
                                        concurrency_limit=2)
    demo.queue(max_size=16, default_concurrency_limit=1)
    return demo


if __name__ == "__main__":
    build_demo().launch()
