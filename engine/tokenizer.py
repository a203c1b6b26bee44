"""Tokenizer and chat template from a Hugging Face folder.

The tokenizer is `tokenizer.json`; its special tokens are named in `tokenizer_config.json`. The chat
template is looked for where transformers reads it, first found wins: `chat_template.jinja` (where
transformers 5 saves it), `chat_template.json`, then `tokenizer_config.json`'s `chat_template` (a string,
or a list of named templates of which "default" is used). It is rendered as transformers renders it: a
sandboxed jinja2 environment (templates come with downloaded models: they are untrusted code) with the
same variables and helpers, so a template gives the same prompt here as in transformers.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")
# tokenizer_config.json keys transformers hands a template as variables (its special_tokens_map).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class NoChatTemplateError(ValueError):
    """The model folder has no chat template in any of the places transformers reads one from."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters, which would change the prompt; transformers overrides it so.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for transformers' training masks; a
    template that uses it must still parse, and renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _templates_in(value: Any) -> dict[str, str]:
    """A chat_template value by name: a string is the "default" one; a list is [{"name", "template"}, ...]."""
    if isinstance(value, list):
        return {entry["name"]: entry["template"] for entry in value if isinstance(entry, dict) and entry.get("template")}
    return {"default": value} if value else {}


def find_chat_templates(model_dir: Path, tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """The templates of the first place that holds any, by name ("default", and "tool_use" in some models)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return {"default": jinja.read_text()}
    for source in (_read_json(model_dir / "chat_template.json"), tokenizer_config):
        if templates := _templates_in(source.get("chat_template")):
            return templates
    return {}


def tokenizer_fingerprint(model_dir: str | Path) -> str:
    """What token ids mean, as a short hash of tokenizer.json: a router sends ids only to nodes whose
    fingerprint is its own (while a model change rolls, an old router and a new node may read them apart)."""
    return hashlib.sha256((Path(model_dir) / "tokenizer.json").read_bytes()).hexdigest()[:16]


class ModelTokenizer:
    def __init__(self, model_dir: str | Path, chat_template: str | None = None) -> None:
        """`chat_template`: a template's source to use instead of the model's own (vLLM's --chat-template)."""
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir} has no tokenizer.json")
        self.model_dir = model_dir
        self.tokenizer = Tokenizer.from_file(str(path))
        config = _read_json(model_dir / "tokenizer_config.json")
        self.special_tokens = {key: text for key in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key)))}
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        if isinstance(extra, list) and extra:
            self.special_tokens["additional_special_tokens"] = [_token_text(token) for token in extra]
        self.bos_token = self.special_tokens.get("bos_token")
        self.eos_token = self.special_tokens.get("eos_token")
        self.chat_templates = {"default": chat_template} if chat_template else find_chat_templates(model_dir, config)
        self.eos_token_id = self.tokenizer.token_to_id(self.eos_token) if self.eos_token else None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def _environment(self) -> ImmutableSandboxedEnvironment:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        return env

    def chat_template(self, with_tools: bool = False) -> str | None:
        """The template's source (None without one): with tools, the "tool_use" one where the model has one."""
        name = "tool_use" if with_tools and "tool_use" in self.chat_templates else "default"
        return self.chat_templates.get(name)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text; raises NoChatTemplateError without a template, TemplateError when it refuses.
        With tools, a model's "tool_use" template is used where it has one, as transformers does."""
        template = self.chat_template(with_tools=tools is not None)
        if template is None:
            raise NoChatTemplateError(
                f"the model {self.model_dir.name} has no chat template (none of {', '.join(TEMPLATE_FILES)} holds "
                "one): send a prompt to /v1/completions instead"
            )
        variables = {**self.special_tokens, "documents": None, **template_kwargs}
        return self._environment.from_string(template).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **variables
        )
