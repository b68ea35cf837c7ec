"""The Gradio Space in spaces/: launched on 127.0.0.1 with a tiny local model, driven by gradio_client and by a
real headless Chromium (Debian `chromium` + `chromium-driver`, installed by .ci/run)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys

import pytest
from conftest import REPO


def load_app():
    spec = importlib.util.spec_from_file_location("hitoban_space_app", REPO / "spaces" / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def space(tiny_model_dir, monkeypatch_module):
    monkeypatch_module.setenv("HITOBAN_MODEL", str(tiny_model_dir))
    app = load_app()
    demo = app.build_demo()
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    yield app, demo
    demo.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_model_id_comes_from_the_space_card(tmp_path):
    app = load_app()
    readme = tmp_path / "README.md"
    readme.write_text("---\ntitle: x\nsdk: gradio\nmodels:\n- someone/hitoban-tiny\n---\n# body\n")
    assert app.model_id_from_config(readme) == "someone/hitoban-tiny"
    readme.write_text("# no header\n")
    assert app.model_id_from_config(readme) is None


def test_client_chat_predict_and_streamed_submit(space):
    from gradio_client import Client

    app, demo = space
    client = Client(demo.local_url, verbose=False)
    endpoints = client.view_api(return_format="dict")["named_endpoints"]
    assert {"/chat", "/continue"} <= set(endpoints)
    # greedy, so the same first message from two fresh sessions (the chat history is per session) must give the
    # same reply, and it must equal what the model itself generates for that prompt
    first = client.predict("こんにちは", 0.0, 40, 1.0, 16, api_name="/chat")
    again = Client(demo.local_url, verbose=False).predict("こんにちは", 0.0, 40, 1.0, 16, api_name="/chat")
    assert isinstance(first, str) and first and first == again
    model, tok = app.load(os.environ["HITOBAN_MODEL"])
    ids = tok.apply_chat_template([{"role": "user", "content": "こんにちは"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    stops = [tok.convert_tokens_to_ids(t) for t in app.STOP_TOKENS]
    direct = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=stops, pad_token_id=stops[0])
    assert first == tok.decode(direct[0, ids.shape[1]:], skip_special_tokens=True)
    job = client.submit("夜の話をして", 0.8, 40, 1.15, 24, api_name="/chat")
    partials = list(job)
    assert job.result() == partials[-1]
    assert len(partials) >= 2, "the reply should arrive streamed, in several pieces"
    assert all(b.startswith(a) for a, b in zip(partials, partials[1:])), "each partial extends the previous one"


def test_client_raw_continuation_is_bounded(space):
    from gradio_client import Client

    app, demo = space
    client = Client(demo.local_url, verbose=False)
    long_prompt = "あ" * (app.MAX_INPUT_CHARS * 3)
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="greater than maximum"):
        client.predict("あ", 0.0, 0, 1.0, 10_000, api_name="/continue")
    text = client.predict(long_prompt, 0.0, 0, 1.0, app.MAX_NEW_TOKENS, api_name="/continue")
    assert text.startswith("あ" * app.MAX_INPUT_CHARS) and not text.startswith("あ" * (app.MAX_INPUT_CHARS + 1))
    model, tok = app.load(os.environ["HITOBAN_MODEL"])
    assert len(tok(text[app.MAX_INPUT_CHARS:])["input_ids"]) <= app.MAX_NEW_TOKENS + 2  # output capped too


@pytest.mark.slow
def test_headless_chromium_types_a_message_and_sees_the_streamed_reply(space, tmp_path):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("the browser test needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        browser.get(space[1].local_url)
        wait = WebDriverWait(browser, 60)
        box = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "textarea[data-testid='textbox']"))
        box.send_keys("こんにちは、調子はどう？")
        box.send_keys(Keys.ENTER)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "[data-testid='bot']")) >= 1)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "[data-testid='bot']")[-1].text.strip())
        wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, ".generating, .pending"))
        user = browser.find_elements(By.CSS_SELECTOR, "[data-testid='user']")[-1].text
        assert "調子はどう" in user
        shot = tmp_path / "space-chat.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        print(f"screenshot: {shot}")
    finally:
        browser.quit()


def test_space_weights_dtype_follows_the_hardware_as_hitoban_does(monkeypatch):
    """The Space's copy of the native-bf16 test (it cannot import hitoban) answers as hitoban's own."""
    from hitoban.training import hardware

    app = load_app()
    samples = ["flags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n", "flags\t: fpu sse2 avx2 amx_bf16 amx_tile\n",
               "flags\t: fpu sse2 avx2 avx512f\n", "Features\t: fp asimd bf16 i8mm\n", "Features\t: fp asimd\n", ""]
    assert [app.cpu_has_native_bf16(s) for s in samples] == [hardware.cpu_has_native_bf16(s) for s in samples]
    assert [app.cpu_has_native_bf16(s) for s in samples] == [True, True, False, True, False, False]
    monkeypatch.setattr(app, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    assert app.weights_dtype("cpu") == app.torch.bfloat16 and app.weights_dtype("mps") == app.torch.float32
    monkeypatch.setattr(app, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    assert app.weights_dtype("cpu") == app.torch.float32
    monkeypatch.setenv("HITOBAN_DTYPE", "bfloat16")
    assert app.weights_dtype("cpu") == app.torch.bfloat16


@pytest.mark.parametrize("temperature,top_k,penalty", [(0.0, 40, 1.15), (0.8, 40, 1.15), (1.0, 0, 1.0)])
def test_space_decode_gives_generates_tokens(pretrained, temperature, top_k, penalty):
    """The Space's lean loop against plain `generate` with the same settings: identical greedy tokens and identical
    seeded samples, fp32 and bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    app = load_app()
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    stops = [tokenizer.convert_tokens_to_ids(t) for t in app.STOP_TOKENS]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "猫について教えて"}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=dtype).eval()
        outputs = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            flags = dict(do_sample=True, temperature=temperature, top_k=top_k or None) if temperature else {}
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                      repetition_penalty=penalty, pad_token_id=tokenizer.pad_token_id,
                                      eos_token_id=stops, **({"do_sample": False} | flags))
            torch.manual_seed(seed)
            got = app.decode(model, ids, temperature, top_k, penalty, 24, stops)
            assert got.tolist() == expected.tolist(), (dtype, seed)
            outputs.append(got[0, ids.shape[1]:].tolist())
        assert len(outputs[0]) > 5  # something was generated before any stop token
        assert (outputs[0] != outputs[1]) == (temperature > 0)  # seeds matter exactly when sampling
