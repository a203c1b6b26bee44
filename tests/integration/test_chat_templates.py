"""Chat templates from every place transformers reads them, rendered as transformers renders them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError, TemplateError

from kvferry.engine.make_model import BOS, IM_END, train_tokenizer
from kvferry.engine.tokenizer import ModelTokenizer, NoChatTemplateError
from kvferry.router.api.errors import APIError
from kvferry.router.api.prompts import ModelLimits, PromptEncoder

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo, 世界 👋"},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "What is 2+2?"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a <b> & c", "parameters": {"type": "object"}}}]
# Uses what transformers hands a template: special tokens, tools (through its own tojson, which escapes no
# HTML), loop controls, raise_exception, strftime_now, and the {% generation %} tag.
RICH_TEMPLATE = (
    "{{ bos_token }}{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
    "Year {{ strftime_now('%Y') }}\n"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}"
    "<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _folder(root: Path, config_template: object = None) -> Path:
    root.mkdir()
    train_tokenizer("llama").save(str(root / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": IM_END}
    if config_template is not None:
        config["chat_template"] = config_template
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def test_each_place_is_read_and_the_first_found_wins(tmp_path):
    folder = _folder(tmp_path / "m", config_template="config {{ messages[0].content }}")
    assert ModelTokenizer(folder).apply_chat_template(MESSAGES[:1]) == "config Be brief."
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "json {{ messages[0].content }}"}))
    assert ModelTokenizer(folder).apply_chat_template(MESSAGES[:1]) == "json Be brief."
    (folder / "chat_template.jinja").write_text("jinja {{ messages[0].content }}")
    assert ModelTokenizer(folder).apply_chat_template(MESSAGES[:1]) == "jinja Be brief."


def test_a_list_of_named_templates_uses_the_default_one(tmp_path):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "default {{ eos_token }}"}]
    assert ModelTokenizer(_folder(tmp_path / "m", config_template=named)).apply_chat_template(MESSAGES) == f"default {IM_END}"


@pytest.mark.parametrize("place", ["chat_template.jinja", "tokenizer_config.json"])
def test_rendering_equals_transformers(tmp_path, place):
    from transformers import AutoTokenizer

    folder = _folder(tmp_path / "m", config_template=RICH_TEMPLATE if place == "tokenizer_config.json" else None)
    if place == "chat_template.jinja":
        (folder / place).write_text(RICH_TEMPLATE)
    ours, theirs = ModelTokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for tools in (None, TOOLS):
        for add_generation_prompt in (True, False):
            expected = theirs.apply_chat_template(
                MESSAGES, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
            )
            assert ours.apply_chat_template(MESSAGES, add_generation_prompt, tools=tools) == expected
    assert "a <b> & c" in ours.apply_chat_template(MESSAGES, tools=TOOLS)


def test_chat_template_json_renders_as_the_same_template_in_a_jinja_file(tmp_path):
    # transformers 5 reads chat_template.json for processors only; older savers wrote it for tokenizers too.
    from_json, from_jinja = _folder(tmp_path / "json"), _folder(tmp_path / "jinja")
    (from_json / "chat_template.json").write_text(json.dumps({"chat_template": RICH_TEMPLATE}))
    (from_jinja / "chat_template.jinja").write_text(RICH_TEMPLATE)
    ours = ModelTokenizer(from_json).apply_chat_template(MESSAGES, tools=TOOLS)
    assert ours == ModelTokenizer(from_jinja).apply_chat_template(MESSAGES, tools=TOOLS)


def test_tools_pick_the_tool_use_template_as_transformers_does(tmp_path):
    from transformers import AutoTokenizer

    named = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools: {{ tools | tojson }}"}]
    folder = _folder(tmp_path / "m", config_template=named)
    theirs = AutoTokenizer.from_pretrained(folder)
    for tools in (None, TOOLS):
        expected = theirs.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True, tokenize=False)
        assert ModelTokenizer(folder).apply_chat_template(MESSAGES, tools=tools) == expected


def test_a_template_raises_and_is_sandboxed(tmp_path):
    folder = _folder(tmp_path / "m", config_template=RICH_TEMPLATE)
    with pytest.raises(TemplateError, match="bad role tool"):
        ModelTokenizer(folder).apply_chat_template([{"role": "tool", "content": "x"}])
    (folder / "chat_template.jinja").write_text("{{ messages.append({'role': 'user'}) }}")
    with pytest.raises(SecurityError):
        ModelTokenizer(folder).apply_chat_template(MESSAGES)


def test_a_model_without_a_template_is_a_clear_400(tmp_path):
    folder = _folder(tmp_path / "m")
    with pytest.raises(NoChatTemplateError, match="has no chat template"):
        ModelTokenizer(folder).apply_chat_template(MESSAGES)
    encoder = PromptEncoder(folder, ModelLimits(max_model_len=128, vocab_size=2048))
    with pytest.raises(APIError) as refused:
        encoder.chat(MESSAGES)
    assert refused.value.status == 400 and "has no chat template" in str(refused.value)
