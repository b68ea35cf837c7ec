"""Loading paths a user relies on: Auto classes, remote code without hitoban, pipeline, Trainer (docs/design.md §2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments, pipeline

import hitoban
from hitoban import HitobanConfig, HitobanForCausalLM


def test_auto_classes_are_registered_on_import(tiny_model_dir):
    assert isinstance(AutoConfig.for_model("hitoban"), HitobanConfig)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model) is HitobanForCausalLM


def test_save_pretrained_writes_auto_map_and_self_contained_code(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_hitoban.HitobanConfig",
                                  "AutoModelForCausalLM": "modeling_hitoban.HitobanForCausalLM"}
    for name in ("configuration_hitoban.py", "modeling_hitoban.py"):
        imports = re.findall(r"^\s*(?:from|import)\s+(\S+)", (tiny_model_dir / name).read_text(), re.MULTILINE)
        assert imports and all(not m.startswith("hitoban") for m in imports), imports


BLOCKED_LOAD = textwrap.dedent("""
    import importlib.abc, json, sys
    class BlockHitoban(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "hitoban" or name.startswith("hitoban."):
                raise ImportError("hitoban is blocked in this process")
    sys.meta_path.insert(0, BlockHitoban())
    try:
        import hitoban
        raise SystemExit("import hitoban should have failed")
    except ImportError:
        pass
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder = sys.argv[1]
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)  # it reads config.json (auto_map) too
    ids = torch.arange(4, 36)[None]
    out = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=3, eos_token_id=None)
    print(json.dumps({"class": type(model).__module__ + "." + type(model).__name__,
                      "logits": model(ids).logits[0, -1, :8].tolist(), "generated": out[0].tolist(),
                      "hitoban_loaded": any(m == "hitoban" or m.startswith("hitoban.") for m in sys.modules)}))
""")


@pytest.mark.slow
def test_remote_code_loads_where_import_hitoban_fails(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", BLOCKED_LOAD, str(tiny_model_dir)], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["class"].startswith("transformers_modules.") and not result["hitoban_loaded"]
    ours = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.arange(4, 36)[None]
    with torch.no_grad():
        expected = ours(ids).logits[0, -1, :8]
    assert torch.allclose(torch.tensor(result["logits"]), expected, atol=1e-5)
    greedy = ours.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=3, eos_token_id=None)
    assert result["generated"] == greedy[0].tolist()


def test_text_generation_pipeline_runs_on_a_saved_folder(tiny_model_dir):
    generator = pipeline("text-generation", model=str(tiny_model_dir))
    out = generator("吾輩は猫である。", max_new_tokens=8, do_sample=False)
    assert out[0]["generated_text"].startswith("吾輩は猫である。")
    assert len(out[0]["generated_text"]) > len("吾輩は猫である。")


def test_trainer_gradient_accumulation_matches_the_large_batch(tmp_path):
    """num_items_in_batch must reach the loss: GA=2 x 2 rows == 1 x 4 rows even with uneven -100 counts."""
    from datasets import Dataset

    torch.manual_seed(0)
    rows = []
    for i in range(4):
        ids = torch.randint(4, 300, (24,)).tolist()
        labels = [-100] * (4 + 5 * i) + ids[4 + 5 * i:]  # rows have 20, 15, 10, 5 counted tokens
        rows.append({"input_ids": ids, "attention_mask": [1] * 24, "labels": labels})
    data = Dataset.from_list(rows)
    config = HitobanConfig.from_preset("tiny", vocab_size=300)
    start = HitobanForCausalLM(config).state_dict()

    def train(batch, accumulation):
        model = HitobanForCausalLM(config)
        model.load_state_dict(start)
        args = TrainingArguments(output_dir=str(tmp_path / f"ga{accumulation}"), per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1e-2,
                                 use_cpu=True, report_to="none", save_strategy="no", seed=0, data_seed=0,
                                 dataloader_drop_last=False, logging_steps=1, lr_scheduler_type="constant",
                                 optim="sgd")  # SGD: the update is proportional to the gradient itself
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        return model.model.embed_tokens.weight.detach().clone(), trainer.state.log_history[0]["loss"]

    big, big_loss = train(4, 1)
    accumulated, accumulated_loss = train(2, 2)
    assert abs(big_loss - accumulated_loss) < 1e-4
    assert torch.allclose(big, accumulated, atol=1e-6)


def test_public_api():
    assert hitoban.HitobanConfig is HitobanConfig and hitoban.__version__
    assert set(hitoban.PRESETS) >= {"tiny", "3lm", "zxell-s"}


PLAIN_TOKENIZER = BLOCKED_LOAD.split("import torch\n")[0] + textwrap.dedent("""
    import json
    from transformers import AutoTokenizer
    texts = json.loads(sys.argv[1])
    out = {}
    for spec in sys.argv[2:]:
        folder, remote = spec.rsplit("=", 1)
        tok = AutoTokenizer.from_pretrained(folder, **({"trust_remote_code": True} if remote == "remote" else {}))
        out[folder] = [type(tok).__name__, [tok(t)["input_ids"] for t in texts]]
    print("\\nRESULT " + json.dumps(out))
""")


@pytest.mark.slow  # trains the shared 60-step model and starts two interpreters (~11 s)
def test_plain_autotokenizer_loads_hitoban_folders_without_hitoban(tiny_shards, pretrained, tmp_path):
    """Tokenizer, shard and Llama-export folders load with plain AutoTokenizer in a process that cannot import
    hitoban, with no remote-code prompt, and tokenize as hitoban's own loader. Model folders (config.json with
    model_type "hitoban", docs/design.md §2) need trust_remote_code=True even for the tokenizer: transformers 5.24's
    AutoTokenizer reads the model config first, and an unknown model_type with auto_map prompts."""
    from hitoban.modeling.export_llama import export_llama
    from hitoban.training.data.tokenizer import load_tokenizer

    export_llama(pretrained, tmp_path / "llama")
    folders = {str(tiny_shards / "tokenizer"): "plain", str(tmp_path / "llama"): "plain", str(pretrained): "remote"}
    texts = ["吾輩は猫である。  Hello\n", "<|user|>こんにちは<|assistant|>はい<|end|>", "🍣𠮷"]
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", PLAIN_TOKENIZER, json.dumps(texts),
                          *(f"{folder}={how}" for folder, how in folders.items())],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "custom code" not in run.stdout + run.stderr and "Do you wish" not in run.stdout + run.stderr
    result = json.loads(run.stdout.split("RESULT ")[-1])
    ours = load_tokenizer(pretrained)
    for folder in folders:
        assert result[folder][0] == "TokenizersBackend"  # transformers' own class, no tokenizer code shipped
        assert result[folder][1] == [ours(t)["input_ids"] for t in texts], folder
    # negative control (and the documented deviation): a model folder without trust_remote_code does prompt; with
    # stdin closed transformers then falls back to a plain config and still loads the same tokenizer
    run = subprocess.run([sys.executable, "-c", PLAIN_TOKENIZER, json.dumps(texts), f"{pretrained}=plain"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    assert run.returncode == 0 and "Do you wish to run the custom code?" in run.stdout + run.stderr
    assert json.loads(run.stdout.split("RESULT ")[-1])[str(pretrained)][1] == [ours(t)["input_ids"] for t in texts]
