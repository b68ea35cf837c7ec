"""HitobanForCausalLM: shapes, init, loss semantics, generation paths, checkpointing (docs/design.md §2)."""

from __future__ import annotations

import math
import threading

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import AutoModelForCausalLM, DynamicCache, TextIteratorStreamer

from hitoban import HitobanConfig, HitobanForCausalLM


def param_counts(model):
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.model.embed_tokens.weight.numel()


def test_3lm_preset_has_exactly_the_reference_parameter_count():
    model = HitobanForCausalLM(HitobanConfig.from_preset("3lm"))
    assert param_counts(model) == (35_658_240, 19_274_240)
    assert model.config.intermediate_size == 1408


def test_zxell_preset_is_29_1m():
    total, _ = param_counts(HitobanForCausalLM(HitobanConfig.from_preset("zxell-s")))
    assert round(total / 1e6, 1) == 29.1


def test_presets_accept_overrides_and_reject_unknown_names():
    assert HitobanConfig.from_preset("tiny", vocab_size=777).vocab_size == 777
    with pytest.raises(ValueError, match="unknown preset"):
        HitobanConfig.from_preset("huge")


@pytest.mark.parametrize("bad", [dict(hidden_size=100, num_attention_heads=8),
                                 dict(hidden_size=12, num_attention_heads=4)])
def test_config_rejects_impossible_shapes(bad):
    with pytest.raises(Exception, match="multiple|even"):
        HitobanConfig(**bad)


@pytest.mark.parametrize("preset", ["small", "3lm"])
def test_initial_loss_on_random_tokens_is_ln_vocab(preset):
    torch.manual_seed(0)
    config = HitobanConfig.from_preset(preset)
    model = HitobanForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (4, 128))
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert abs(loss - math.log(config.vocab_size)) < 0.1


def test_3lm_mlx_init_is_available_and_documented_as_higher_initial_loss():
    """3LM's own init (embedding std 1/sqrt(d)) gives unit-variance logits: ln V + ~0.5, as the config says."""
    torch.manual_seed(0)
    config = HitobanConfig.from_preset("small", initializer_range=256**-0.5)
    model = HitobanForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (4, 128))
    with torch.no_grad():
        excess = model(ids, labels=ids).loss.item() - math.log(config.vocab_size)
    assert 0.3 < excess < 0.7
    std = model.model.embed_tokens.weight.std().item()
    assert abs(std - 256**-0.5) < 0.002
    bound = model.model.layers[0].mlp.down_proj.weight.abs().max().item()
    assert bound <= config.intermediate_size**-0.5 and bound > 0.95 * config.intermediate_size**-0.5


def test_embeddings_are_tied_and_saved_once(tmp_path, tiny_model):
    assert tiny_model.lm_head.weight is tiny_model.model.embed_tokens.weight
    tiny_model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    reloaded = HitobanForCausalLM.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert torch.equal(reloaded.lm_head.weight, tiny_model.lm_head.weight)


def test_loss_ignores_minus_100_and_shifts_labels(tiny_model):
    ids = torch.randint(4, 2000, (2, 16))
    labels = ids.clone()
    labels[:, :5] = -100
    out = tiny_model(ids, labels=labels)
    manual = F.cross_entropy(out.logits[:, :-1].reshape(-1, 2000).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert torch.allclose(out.loss, manual, atol=1e-6)


def test_num_items_in_batch_turns_the_mean_into_sum_over_given_count(tiny_model):
    ids = torch.randint(4, 2000, (2, 16))
    summed = F.cross_entropy(tiny_model(ids).logits[:, :-1].reshape(-1, 2000), ids[:, 1:].reshape(-1), reduction="sum")
    loss = tiny_model(ids, labels=ids, num_items_in_batch=torch.tensor(100)).loss
    assert torch.allclose(loss, summed / 100, atol=1e-5)


def test_eager_and_sdpa_agree(tiny_model):
    ids = torch.randint(0, 2000, (2, 32))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    assert tiny_model.config._attn_implementation == "sdpa"
    sdpa = tiny_model(ids, attention_mask=mask).logits
    tiny_model.set_attn_implementation("eager")
    eager = tiny_model(ids, attention_mask=mask).logits
    assert (sdpa - eager)[1].abs().max() < 1e-5 and (sdpa - eager)[0, 7:].abs().max() < 1e-5


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model):
    ids = torch.randint(0, 2000, (2, 32))
    tiny_model.train()
    tiny_model(ids, labels=ids).loss.backward()
    plain = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    tiny_model.activation_checkpointing_enable()
    tiny_model(ids, labels=ids).loss.backward()
    for a, p in zip(plain, tiny_model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


def test_incremental_forward_with_cache_equals_full_forward(tiny_model):
    ids = torch.randint(0, 2000, (1, 20))
    full = tiny_model(ids, use_cache=False).logits
    cache = DynamicCache(config=tiny_model.config)
    first = tiny_model(ids[:, :12], cache=cache, use_cache=True).logits
    rest = [tiny_model(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(12, 20)]
    assert (torch.cat([first, *rest], dim=1) - full).abs().max() < 1e-5


def test_old_past_key_values_name_is_accepted(tiny_model):
    """transformers 5.23 passes `past_key_values=`; ignoring it would silently decode without context."""
    ids = torch.randint(0, 2000, (1, 10))
    cache = DynamicCache(config=tiny_model.config)
    tiny_model(ids[:, :9], past_key_values=cache, use_cache=True)
    step = tiny_model(ids[:, 9:], past_key_values=cache, use_cache=True).logits[:, -1]
    assert (step - tiny_model(ids).logits[:, -1]).abs().max() < 1e-5


def test_generate_with_and_without_cache_gives_the_same_logits(tiny_model):
    prompt = torch.randint(4, 2000, (1, 6))
    kwargs = dict(max_new_tokens=12, do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=3, eos_token_id=None)
    cached = tiny_model.generate(prompt, use_cache=True, **kwargs)
    uncached = tiny_model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(cached.logits, uncached.logits))
    assert diff < 1e-5


def test_left_padded_batch_generates_what_each_prompt_generates_alone(tiny_model):
    prompts = [torch.randint(4, 2000, (n,)) for n in (3, 9, 6)]
    width = max(len(p) for p in prompts)
    ids = torch.full((3, width), 3)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = p
        mask[row, width - len(p):] = 1
    greedy = dict(max_new_tokens=10, do_sample=False, pad_token_id=3, eos_token_id=None)
    batched = tiny_model.generate(ids, attention_mask=mask, **greedy)[:, width:]
    for row, p in enumerate(prompts):
        alone = tiny_model.generate(p[None], **greedy)[0, len(p):]
        assert torch.equal(batched[row], alone)


def test_sampling_options_are_honoured(tiny_model):
    prompt = torch.randint(4, 2000, (1, 5))
    base = dict(max_new_tokens=10, pad_token_id=3, eos_token_id=None)
    greedy = tiny_model.generate(prompt, do_sample=False, **base)
    assert torch.equal(tiny_model.generate(prompt, do_sample=True, top_k=1, **base), greedy)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(tiny_model.generate(prompt, do_sample=True, temperature=0.8, top_k=40, top_p=0.9, **base))
    assert torch.equal(*runs)
    penalised = tiny_model.generate(prompt, do_sample=False, repetition_penalty=100.0, **base)[0, 5:]
    assert len(set(penalised.tolist())) == len(penalised)  # a huge penalty forbids any repeat


def test_text_iterator_streamer_streams_the_generated_text(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    enc = tok("昔々あるところに", return_tensors="pt")
    greedy = dict(max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id)
    expected = tok.decode(model.generate(**enc, **greedy)[0, enc.input_ids.shape[1]:], skip_special_tokens=True)
    streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=30)
    thread = threading.Thread(target=model.generate, kwargs=dict(**enc, streamer=streamer, **greedy))
    thread.start()
    pieces = list(streamer)
    thread.join()
    assert len(pieces) >= 1 and "".join(pieces) == expected


def test_loss_gradient_equals_pytorch_cross_entropy(tiny_model):
    ids = torch.randint(4, 2000, (3, 20))
    labels = ids.clone()
    labels[0, :9] = -100
    tiny_model.train()
    tiny_model(ids, labels=labels).loss.backward()
    ours = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    logits = tiny_model(ids).logits
    F.cross_entropy(logits[:, :-1].reshape(-1, 2000), labels[:, 1:].reshape(-1), ignore_index=-100).backward()
    for a, p in zip(ours, tiny_model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-7)


def test_loss_with_no_counted_token_is_zero_not_nan(tiny_model):
    ids = torch.randint(4, 2000, (1, 8))
    assert tiny_model(ids, labels=torch.full_like(ids, -100)).loss.item() == 0.0


def test_loss_under_bf16_autocast_is_close_to_fp32(tiny_model):
    ids = torch.randint(4, 2000, (2, 16))
    fp32 = tiny_model(ids, labels=ids).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = tiny_model(ids, labels=ids)
    assert bf16.logits.dtype == torch.bfloat16 and abs(bf16.loss.item() - fp32.item()) < 0.05


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=300, dropout=0.3))
    ids = torch.randint(0, 300, (2, 16))
    model.train()
    assert not torch.equal(model(ids).logits, model(ids).logits)
    model.eval()
    assert torch.equal(model(ids).logits, model(ids).logits)


def test_untied_embeddings_when_asked_save_and_load_their_own_output(tmp_path):
    config = HitobanConfig.from_preset("tiny", vocab_size=256, tie_word_embeddings=False)
    model = HitobanForCausalLM(config)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)  # the output differs from the embedding for real
    model.save_pretrained(tmp_path)
    again = HitobanForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(again.lm_head.weight, again.model.embed_tokens.weight)
    tied = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=256))  # the default stays tied
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in tied.parameters()) == 256 * 64


def test_tuple_returns_hidden_states_attentions_and_the_old_cache_name():
    model = HitobanForCausalLM(HitobanConfig.from_preset("tiny", vocab_size=256)).eval()
    model.set_attn_implementation("eager")  # SDPA computes no attention weights
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True)
        assert len(out.hidden_states) == model.config.num_hidden_layers + 1
        assert out.attentions[0].shape == (2, model.config.num_attention_heads, 9, 9)
        as_tuple = model(ids, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], out.logits)
        cache = model(ids[:, :5], use_cache=True).cache
        with pytest.warns(FutureWarning, match="past_key_values"):
            step = model(ids[:, 5:6], past_key_values=cache)
        full = model(ids[:, :6]).logits[:, -1]
    assert torch.allclose(step.logits[:, -1], full, atol=1e-5)  # the old name still feeds the cache
