"""HitobanForCausalLM: a small Llama-style decoder for one-night training.

Design choices (docs/design.md §2):
- pre-norm blocks  x + Attn(RMSNorm(x)),  x + SwiGLU(RMSNorm(x));  final RMSNorm
- RoPE, non-interleaved ("rotate half", as HF Llama) over the full head dim; the position offset is the cache length
- one fused bias-free qkv projection (rows q, k, v) and one fused gate/up projection: fewer, larger matmuls
- no biases anywhere; logits through the tied token embedding (no lm_head parameter is saved)
- causal attention through transformers' attention interface (SDPA by default), KV cache via `transformers.Cache`
- dropout (default 0) only on the embedding and on residual-branch outputs, never on attention probabilities
- the loss computes its logits gradient in the forward pass (`causal_lm_loss`): same numbers, less time

The math equals `LlamaForCausalLM` with num_key_value_heads == num_attention_heads and tied embeddings, which is
what `hitoban export-llama` relies on. Self-contained (relative imports only) so it runs as Hub remote code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from .configuration_hitoban import HitobanConfig

# transformers 5.24 renamed the cache kwarg/output field `past_key_values` -> `cache`. We accept both names on input
# and fill whichever field this transformers' output class has, so remote code works on 5.23 and 5.24+.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

try:  # transformers' model contract (5.24): hidden states / attentions captured by hooks, tuple returns on request
    from transformers.utils import can_return_tuple
    from transformers.utils.output_capturing import capture_outputs
except ImportError:  # older transformers: the model still runs, without these two conveniences
    def can_return_tuple(func):
        return func

    capture_outputs = can_return_tuple
if _CACHE_FIELD == "cache":  # 5.24's deprecation path for the old name: it still works, with a warning
    from transformers.utils.deprecation import deprecate_kwarg

    _renamed_cache = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
else:
    def _renamed_cache(func):
        return func
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")


class _CrossEntropySum(torch.autograd.Function):
    """Summed token cross-entropy whose logits gradient is computed during the forward pass.

    The gradient of CE w.r.t. logits is softmax - onehot; it falls out of the log-softmax already computed for the
    loss, so we turn that buffer into the gradient in place (exp_, then -1 at the targets) instead of running
    log_softmax backward and a zero-filled NLL backward later. Same values as `F.cross_entropy(reduction="sum")`,
    same memory (one fp32 N x V buffer), ~30% less time for the loss on CPU. No double backward.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        logp = torch.log_softmax(logits.float(), dim=-1)
        counted = targets != ignore_index
        safe_targets = torch.where(counted, targets, 0)[:, None]
        loss = -(logp.gather(1, safe_targets).squeeze(1) * counted).sum()
        if ctx.needs_input_grad[0]:
            grad = logp.exp_()
            grad.scatter_add_(1, safe_targets, torch.full_like(grad[:, :1], -1.0))
            grad.mul_(counted[:, None])
            ctx.save_for_backward(grad)
            ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return (grad * grad_loss).to(ctx.logits_dtype), None, None


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = -100,
    shift_labels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean next-token cross-entropy over counted positions (labels are unshifted; `ignore_index` is skipped).

    With `num_items_in_batch` (Trainer under gradient accumulation) the sum is divided by that count instead, so
    accumulated micro-batches give exactly the large-batch loss. No counted token gives 0, not NaN.
    """
    if shift_labels is None:  # shift by padding the labels, not by slicing (and copying) the logits
        shift_labels = F.pad(labels[..., 1:], (0, 1), value=ignore_index)
    targets = shift_labels.reshape(-1).to(logits.device)
    total = _CrossEntropySum.apply(logits.reshape(-1, logits.shape[-1]), targets, ignore_index)
    if num_items_in_batch is None:
        num_items_in_batch = (targets != ignore_index).sum().clamp_min(1)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class HitobanRMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight, computed in float32 (bf16 mean-of-squares loses too much).

    Written out rather than `F.rms_norm`: measured faster forward+backward on CPU, and the same arithmetic as
    Llama's, so the Llama export matches bit for bit."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        hidden_states = hidden_states.float()
        hidden_states = hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden_states.to(dtype)


class HitobanRotaryEmbedding(nn.Module):
    """cos/sin tables for the given absolute positions (base `rope_theta`, full head dim, rotate-half layout)."""

    def __init__(self, config: HitobanConfig):
        super().__init__()
        self.config = config
        self.inv_freq = nn.Buffer(self.compute_inv_freq(config), persistent=False)

    @staticmethod
    def compute_inv_freq(config: HitobanConfig) -> torch.Tensor:
        dim = config.hidden_size // config.num_attention_heads
        return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (..., batch, heads, seq, head_dim) by cos/sin of shape (batch, seq, head_dim)."""
    cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    return x * cos + rotate_half(x) * sin


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Plain softmax attention; used when `attn_implementation="eager"` and as the reference for SDPA."""
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class HitobanAttention(nn.Module):
    def __init__(self, config: HitobanConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = 1  # read by transformers' attention functions (no GQA here)
        self.scaling = self.head_dim**-0.5
        self.is_causal = True
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache: Cache | None = None, **kwargs):
        batch, seq, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states).view(batch, seq, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = apply_rotary(qkv[:2], *position_embeddings).unbind(0)  # q and k rotated in one pass
        # A view of v would keep the whole fused qkv output alive until backward (SDPA saves v): copy it out, so only
        # v is kept, as with separate projections (-8 MiB per step at the benchmark shape).
        v = qkv[2].contiguous()  # each (batch, heads, seq, head_dim)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        out, weights = attention(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(batch, seq, -1)), weights  # weights: for output_attentions (eager only)


class HitobanMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up share one matmul (rows: gate, then up)."""

    def __init__(self, config: HitobanConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def _residual_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout only when it does something: at p = 0 (pretraining, inference) not even a call per layer."""
    return F.dropout(x, p, training) if p > 0 and training else x


class HitobanDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: HitobanConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = HitobanRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = HitobanAttention(config, layer_idx)
        self.post_attention_layernorm = HitobanRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = HitobanMLP(config)
        self.dropout = config.dropout

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, cache=None, **kwargs):
        attn, _ = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, cache,
                                 **kwargs)
        hidden_states = hidden_states + _residual_dropout(attn, self.dropout, self.training)
        mlp = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + _residual_dropout(mlp, self.dropout, self.training)


class HitobanPreTrainedModel(PreTrainedModel):
    config_class = HitobanConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HitobanDecoderLayer"]
    _supports_sdpa = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    # output_hidden_states / output_attentions: transformers records these modules' outputs (capture_outputs)
    _can_record_outputs = {"hidden_states": HitobanDecoderLayer, "attentions": HitobanAttention}

    def _init_weights(self, module: nn.Module) -> None:
        """3LM's scheme (MLX defaults): Linear U(+-1/sqrt(fan_in)); embedding N(0, initializer_range); norms 1."""
        if isinstance(module, nn.Linear):
            bound = module.in_features**-0.5
            init.uniform_(module.weight, -bound, bound)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, HitobanRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, HitobanRotaryEmbedding):
            init.copy_(module.inv_freq, module.compute_inv_freq(module.config))


class HitobanModel(HitobanPreTrainedModel):
    def __init__(self, config: HitobanConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HitobanDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = HitobanRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = HitobanRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    @_renamed_cache
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)  # transformers < 5.24
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training:
            use_cache = False  # recomputed layers must not append to a cache twice
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(start, start + inputs_embeds.shape[1], device=inputs_embeds.device)[None]
        # The 4th argument was renamed between transformers versions: pass it positionally.
        mask = create_causal_mask(self.config, inputs_embeds, attention_mask, cache, position_ids)
        position_embeddings = self.rotary_emb(inputs_embeds, position_ids)
        hidden_states = _residual_dropout(inputs_embeds, self.config.dropout, self.training)
        for layer in self.layers:
            hidden_states = layer(hidden_states, mask, position_embeddings, cache if use_cache else None, **kwargs)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states), **{_CACHE_FIELD: cache if use_cache else None}
        )


class HitobanForCausalLM(HitobanPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # applied when config.tie_word_embeddings

    def __init__(self, config: HitobanConfig):
        super().__init__(config)
        self.model = HitobanModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # A tied output is never saved; naming it makes the Trainer re-tie it when it reloads the best checkpoint,
        # instead of warning that `lm_head.weight` is missing. An untied one is a weight of its own and is saved.
        self._keys_to_ignore_on_save = ["lm_head.weight"] if config.tie_word_embeddings else None
        self.post_init()

    @_renamed_cache
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """`labels` are unshifted token ids (-100 = ignored); `num_items_in_batch` (from Trainer) normalises the
        summed loss over the whole accumulated batch instead of this micro-batch."""
        loss_kwargs = {key: kwargs.pop(key) for key in _LOSS_KWARGS if key in kwargs}
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache if cache is not None else kwargs.pop("past_key_values", None),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden_states = hidden_states[:, logits_to_keep]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels, **loss_kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                      attentions=outputs.attentions, **{_CACHE_FIELD: getattr(outputs, _CACHE_FIELD)})


__all__ = ["HitobanForCausalLM", "HitobanModel", "HitobanPreTrainedModel", "causal_lm_loss"]
