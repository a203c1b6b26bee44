"""The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF) imported by kvferry against transformers' own
loading of the same file: every tensor, the tokenizer, the chat template and greedy output token for token."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from support.real_model import MAX_NEW_TOKENS, engine_prompt

from kvferry.engine import LLM, SamplingParams
from kvferry.engine.model_config import ModelConfig
from kvferry.engine.tokenizer import ModelTokenizer

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, Ångström, São Paulo, Zürich",
    "日本語のテキストと中文文本, 한국어",
    "Emoji: 🚢🦀👍🏽 and a family 👨‍👩‍👧",
    "def add(a, b):\n    return a + b  # sum\n\tindented with a tab",
    "spaces:    four, and\n\n\nthree newlines,   trailing   ",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "numbers 1234567890 and 3.14159, year 2024",
    "",
    " leading space",
    "Mixed <|endoftext|> special in the middle",
]


@pytest.fixture(scope="module")
def llm(smollm2):
    return LLM(smollm2.folder, dtype="float32")


def test_every_tensor_equals_transformers_gguf_loading(smollm2, smollm2_reference):
    ours = load_file(str(smollm2.folder / "model.safetensors"))
    theirs = smollm2_reference.model.state_dict()
    config = ModelConfig.from_dir(smollm2.folder)
    assert config.tie_word_embeddings and set(theirs) == {*ours, "lm_head.weight"}
    for name, tensor in ours.items():
        assert tensor.dtype == theirs[name].dtype == torch.float32, name
        assert torch.equal(tensor, theirs[name]), name
    assert torch.equal(theirs["lm_head.weight"], ours["model.embed_tokens.weight"])


def test_config_matches_the_model(smollm2, smollm2_reference):
    ours, theirs = ModelConfig.from_dir(smollm2.folder), smollm2_reference.model.config
    assert (ours.vocab_size, ours.num_layers, ours.num_heads, ours.num_kv_heads, ours.head_dim) == (49152, 30, 9, 3, 64)
    assert (ours.hidden_size, ours.intermediate_size) == (theirs.hidden_size, theirs.intermediate_size)
    assert ours.rope.theta == 100000.0 and ours.rms_norm_eps == theirs.rms_norm_eps


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_encodes_and_decodes_as_transformers(smollm2, smollm2_reference, text):
    ours, theirs = ModelTokenizer(smollm2.folder), smollm2_reference.tokenizer
    for special in (True, False):
        ids = ours.encode(text, add_special_tokens=special)
        assert ids == theirs(text, add_special_tokens=special).input_ids
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_chat_prompts_render_and_tokenize_as_transformers(smollm2, smollm2_greedy):
    tokenizer = ModelTokenizer(smollm2.folder)
    for case in (c for c in smollm2_greedy if c.chat):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": case.text}])
        assert rendered == case.rendered
        assert tokenizer.encode(rendered, add_special_tokens=False) == case.prompt_ids


@pytest.mark.slow
def test_greedy_output_equals_transformers_one_at_a_time_and_batched(llm, smollm2_greedy):
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0)
    expected = [case.output_ids for case in smollm2_greedy]
    alone = [llm.generate(engine_prompt(case), params)[0].outputs[0].token_ids for case in smollm2_greedy]
    assert alone == expected
    batched = llm.generate([engine_prompt(case) for case in smollm2_greedy], params)
    assert [output.outputs[0].token_ids for output in batched] == expected
    paris = next(output for case, output in zip(smollm2_greedy, batched, strict=True) if "France" in case.text and case.chat)
    assert paris.outputs[0].text == "The capital of France is Paris."


def test_make_model_writes_the_default_model_by_name(smollm2, tmp_path):
    """`kvferry make-model --from-gguf smollm2-135m-instruct` writes the
    same folder as the model cache's import of the pinned GGUF, byte for byte."""
    out = tmp_path / "smollm2"
    done = subprocess.run([sys.executable, "-m", "kvferry", "make-model", "--from-gguf", "smollm2-135m-instruct",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    written = sorted(path.name for path in out.iterdir())
    assert written == sorted(path.name for path in smollm2.folder.iterdir())
    for name in written:
        assert (out / name).read_bytes() == (smollm2.folder / name).read_bytes(), name
