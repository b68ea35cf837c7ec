"""Gradio Space for a hitoban model: streaming chat, sampling controls, raw continuation, model info.

Self-contained (the Space does not install hitoban): the model loads with `trust_remote_code=True` from the
`modeling_hitoban.py` saved beside its weights. The model id comes from the `HITOBAN_MODEL` environment variable
(a Hub id or a local folder), else from `models:` in this Space's README.md.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import gradio as gr
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

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


def load(model_id: str):
    device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForCausalLM.from_pretrained(model_id, trust_remote_code=True).to(device).eval()
    return model, tokenizer


def model_info(model, model_id: str) -> str:
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return (f"**{model_id}** · {params / 1e6:.1f}M parameters · {c.num_hidden_layers} layers · "
            f"d_model {c.hidden_size} · {c.num_attention_heads} heads · context {c.max_position_embeddings} · "
            f"vocab {c.vocab_size} · running on {model.device.type}")


def stream_generate(model, tokenizer, input_ids: torch.Tensor, temperature: float, top_k: int,
                    repetition_penalty: float, max_new_tokens: int, stop_ids: list[int] | None = None):
    """Yield the cumulative decoded text while `generate` runs in a thread (TextIteratorStreamer)."""
    max_new_tokens = max(1, min(int(max_new_tokens), MAX_NEW_TOKENS))
    room = model.config.max_position_embeddings - max_new_tokens
    input_ids = input_ids[:, -max(room, 16):].to(model.device)  # keep the latest turns when the history is long
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=120)
    sample = temperature > 0
    kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), streamer=streamer,
                  max_new_tokens=max_new_tokens, repetition_penalty=float(repetition_penalty),
                  pad_token_id=tokenizer.pad_token_id, eos_token_id=stop_ids or tokenizer.eos_token_id,
                  do_sample=sample, **(dict(temperature=float(temperature), top_k=int(top_k) or None) if sample
                                       else {}))
    thread = threading.Thread(target=model.generate, kwargs=kwargs, daemon=True)
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
