"""Fine-tuning verbs (chat SFT, character tone, the loss-mask check) and the terminal chat."""

from __future__ import annotations

from hitoban.errors import UsageError
from hitoban.verbs import verb


def _check_mask_args(p):
    p.add_argument("--tokenizer", required=True, help="a tokenizer (or model) folder with the chat template")
    p.add_argument("--control", choices=["shift", "drop_end"],
                   help="negative control: corrupt the mask on purpose; the check must then FAIL")


@verb("check-mask", "print and verify the assistant-only loss mask on fixed conversations")(_check_mask_args)
def _check_mask(args) -> int:
    from transformers import AutoTokenizer

    from hitoban.training.sft import check_mask

    return 0 if check_mask(AutoTokenizer.from_pretrained(args.tokenizer), corruption=args.control) else 1


def _finetune_args(defaults: dict):
    def add(p):
        from hitoban.training.lora import LoraSettings

        p.add_argument("base", help="a from_pretrained hitoban folder (its tokenizer is reused)")
        p.add_argument("--data", nargs="+", required=True, help="chat files: .jsonl (messages or user/assistant), "
                                                                 ".tsv (user<TAB>assistant), .txt (3LM line format)")
        p.add_argument("--out", required=True, help="new from_pretrained folder (+ summary.json, trainer/)")
        p.add_argument("--lr", type=float, default=defaults["lr"], help="peak learning rate (cosine schedule)")
        p.add_argument("--epochs", type=float, default=defaults["epochs"], help="passes over the training chats")
        p.add_argument("--max-steps", type=int, default=defaults["max_steps"], help="overrides --epochs when > 0")
        p.add_argument("--batch-size", type=int, default=32, help="conversations per device step")
        p.add_argument("--grad-accum", type=int, default=1, help="device steps per optimizer step")
        p.add_argument("--warmup-ratio", type=float, default=0.03, help="share of the steps spent warming up")
        p.add_argument("--val-frac", type=float, default=0.01, help="share of the chats held out for validation")
        p.add_argument("--eval-steps", type=int, default=defaults["eval_steps"],
                       help="validate (and keep the best checkpoint) every N steps")
        p.add_argument("--exclude", nargs="*", default=[], metavar="HOLDOUT",
                       help="drop pairs matching, or sharing a 40-char window with, these held-out chats")
        p.add_argument("--min-char-freq", type=int, default=defaults["min_char_freq"],
                       help="drop chats with a character rarer than this in the data (3LM: broken text)")
        p.add_argument("--max-user-chars", type=int, default=100, help="longer user turns are dropped (3LM)")
        p.add_argument("--max-assistant-chars", type=int, default=300, help="longer replies are dropped (3LM)")
        p.add_argument("--skip-bad", action="store_true", help="skip malformed lines (counted) instead of stopping")
        p.add_argument("--seed", type=int, default=1234, help="split, shuffling and initialisation of new weights")
        p.add_argument("--lora", action="store_true",
                       help="train a PEFT LoRA adapter instead of every weight; --out becomes the adapter folder "
                            "(AutoPeftModelForCausalLM)")
        p.add_argument("--lora-r", type=int, default=LoraSettings.r, help="--lora: adapter rank")
        p.add_argument("--lora-alpha", type=int, default=LoraSettings.alpha,
                       help="--lora: scaling numerator (alpha / r)")
        p.add_argument("--lora-targets", default=",".join(LoraSettings.targets),
                       help="--lora: module names (hitoban fuses q/k/v into qkv_proj, gate/up into gate_up_proj)")
        p.add_argument("--merge", action="store_true",
                       help="--lora: write the merged model to --out and the adapter to --out/adapter")
    return add


def _run_finetune(args, stage: str) -> int:
    from hitoban.training.chat_data import ChatFilterSettings
    from hitoban.training.lora import LoraSettings
    from hitoban.training.sft import finetune

    filters = ChatFilterSettings(max_user_chars=args.max_user_chars, max_assistant_chars=args.max_assistant_chars,
                                 min_char_freq=args.min_char_freq)
    if args.merge and not args.lora:
        raise UsageError("--merge merges a LoRA adapter: add --lora")
    lora = (LoraSettings(r=args.lora_r, alpha=args.lora_alpha,
                         targets=tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()))
            if args.lora else None)
    finetune(args.base, args.data, args.out, lr=args.lr, epochs=args.epochs, max_steps=args.max_steps,
             batch_size=args.batch_size, grad_accum=args.grad_accum, warmup_ratio=args.warmup_ratio,
             val_frac=args.val_frac, exclude=args.exclude, seed=args.seed, filters=filters, skip_bad=args.skip_bad,
             eval_steps=args.eval_steps, stage=stage, lora=lora, merge=args.merge)
    return 0


@verb("sft", "chat fine-tune with the HF Trainer, loss on assistant turns only (3LM: lr 1.5e-4, 8 epochs)")(
    _finetune_args({"lr": 1.5e-4, "epochs": 8.0, "max_steps": -1, "eval_steps": 200, "min_char_freq": 10}))
def _sft(args) -> int:
    return _run_finetune(args, "sft")


@verb("tone", "character-tone fine-tune of a chat model (3LM: lr 1e-4, ~30 steps)")(
    _finetune_args({"lr": 1e-4, "epochs": 8.0, "max_steps": 30, "eval_steps": 10, "min_char_freq": 1}))
def _tone(args) -> int:
    return _run_finetune(args, "tone")


def _chat_args(p):
    p.add_argument("model", help="a from_pretrained folder (e.g. RUN/final or an SFT output)")
    p.add_argument("--precision", choices=["auto", "no", "bf16"], default="auto",
                   help="weights in bf16 where the hardware has it (CUDA, AMX / AVX512-BF16 CPUs): about twice the "
                        "tokens per second on a CPU; no: fp32, as saved")


@verb("chat", "chat in the terminal: streaming, history, /reset /temp /topk /penalty /tokens /exit")(_chat_args)
def _chat(args) -> int:
    from hitoban.chat import run_chat

    run_chat(args.model, args.precision)
    return 0
