"""Fine-tuning verbs (chat SFT, character tone, the loss-mask check) and the terminal chat."""

from __future__ import annotations

from hitoban.errors import ExitCode
from hitoban.training.finetune.options import ChatOptions, CheckMaskOptions
from hitoban.verbs import verb, verb_of


@verb_of("check-mask", "print and verify the assistant-only loss mask on fixed conversations", CheckMaskOptions)
def _check_mask(options: CheckMaskOptions) -> int:
    from transformers import AutoTokenizer

    from hitoban.modeling.loading import check_tokenizer_folder
    from hitoban.training.finetune.sft import check_mask

    folder = check_tokenizer_folder(options.tokenizer, chat_template=True)
    passed = check_mask(AutoTokenizer.from_pretrained(folder), corruption=options.control)
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


@verb_of("chat", "chat in the terminal: streaming, history, /reset /temp /topk /penalty /tokens /exit", ChatOptions)
def _chat(options: ChatOptions) -> int:
    from hitoban.chat import run_chat

    run_chat(options.model, options.precision)
    return 0
