"""Fine-tuning verbs (chat SFT, character tone, the loss-mask check) and the terminal chat."""

from __future__ import annotations

from hitoban.errors import ExitCode
from hitoban.verbs import verb


def _check_mask_args(p):
    p.add_argument("--tokenizer", required=True, help="a tokenizer (or model) folder with the chat template")
    p.add_argument("--control", choices=["shift", "drop_end"],
                   help="negative control: corrupt the mask on purpose; the check must then FAIL")


@verb("check-mask", "print and verify the assistant-only loss mask on fixed conversations")(_check_mask_args)
def _check_mask(args) -> int:
    from transformers import AutoTokenizer

    from hitoban.modeling.loading import check_tokenizer_folder
    from hitoban.training.finetune.sft import check_mask

    folder = check_tokenizer_folder(args.tokenizer, chat_template=True)
    passed = check_mask(AutoTokenizer.from_pretrained(folder), corruption=args.control)
    return 0 if passed else int(ExitCode.CHECK_FAILED)


def _options(name: str) -> type:
    from hitoban.training.finetune import options  # imported when the verb runs: `hitoban --help` stays fast

    return getattr(options, name)


def _finetune_args(name: str):
    def add(p):
        from hitoban.options import add_options

        add_options(p, _options(name))
    return add


def _run_finetune(args, name: str) -> int:
    from hitoban.options import from_args
    from hitoban.training.finetune.sft import finetune

    finetune(from_args(_options(name), args))
    return 0


@verb("sft", "chat fine-tune with the HF Trainer, loss on assistant turns only (3LM: lr 1.5e-4, 8 epochs)")(
    _finetune_args("FinetuneOptions"))
def _sft(args) -> int:
    return _run_finetune(args, "FinetuneOptions")


@verb("tone", "character-tone fine-tune of a chat model (3LM: lr 1e-4, ~30 steps)")(_finetune_args("ToneOptions"))
def _tone(args) -> int:
    return _run_finetune(args, "ToneOptions")


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
