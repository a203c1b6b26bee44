"""A `tokenizers` tokenizer (what tokenizer.json holds) rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, the merges, each token's type and the
special token ids under `tokenizer.ggml.*`, and names the pre-tokenizer (the regex that splits text
before the merges) by a key such as "llama-bpe" or "qwen2". The rebuilt tokenizer follows what
transformers builds from the same keys (its GGUF loading is the reference the tests compare with).
Only byte-level BPE vocabularies ("gpt2": Llama 3, Qwen2/3, SmolLM) are rebuilt; anything else is refused
by name, since a guessed tokenizer would silently feed the model the wrong tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors


class GGUFTokenizerError(ValueError):
    """The file's tokenizer metadata is missing or describes a tokenizer this module cannot rebuild."""


# llama.cpp's token types (tokenizer.ggml.token_type).
CONTROL, USER_DEFINED = 3, 4

# The pre-tokenizer regex of each `tokenizer.ggml.pre` value, as llama.cpp's llama-vocab.cpp splits text.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx", "falcon3", "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# Pre-tokenizers whose split is GPT-2's own (ByteLevel's built-in regex): llama.cpp's "smollm" splits digits
# one by one, which GPT-2's regex does too for a vocabulary with no multi-digit tokens, as SmolLM's has none.
_GPT2_REGEX = ("default", "gpt2", "smollm", "starcoder", "refact", "codeshell")


@dataclass(frozen=True)
class GGUFTokenizer:
    tokenizer: Tokenizer
    tokenizer_config: dict[str, Any]  # what tokenizer_config.json holds: special tokens, add_bos_token
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # every token that ends a turn: eos, and eot / eom where the file names them


@cache
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (what byte-level BPE vocabularies are written in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return spelling


def _respell(token: str, alphabet: set[str]) -> str:
    # A few files store a token as its plain text ("\n\n" rather than "ĊĊ"); spell it the way the merges do.
    if set(token) <= alphabet:
        return token
    spelling = _byte_alphabet()
    return "".join(spelling[byte] for byte in token.encode("utf-8"))


def build_tokenizer(metadata: dict[str, Any]) -> GGUFTokenizer:
    """`metadata`: the file's key-value pairs as Python values (lists for arrays)."""
    kind = metadata.get("tokenizer.ggml.model")
    tokens: list[str] | None = metadata.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise GGUFTokenizerError("the GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    if kind != "gpt2":
        raise GGUFTokenizerError(f"GGUF tokenizer model {kind!r} is not supported; supported: 'gpt2' (byte-level BPE)")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in _SPLITS and pre not in _GPT2_REGEX:
        raise GGUFTokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted([*_SPLITS, *_GPT2_REGEX]))}"
        )
    merges = metadata.get("tokenizer.ggml.merges")
    if not merges:
        raise GGUFTokenizerError("the GGUF file's byte-level tokenizer has no merges (tokenizer.ggml.merges)")

    alphabet = set(_byte_alphabet().values())
    vocab = {_respell(token, alphabet): index for index, token in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(merge.split(" ", 1)) for merge in merges], fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    if pre in _SPLITS:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()

    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; transformers skips it too.
    tokenizer.add_special_tokens([
        AddedToken(token, normalized=False, special=True)
        for token, kind_ in zip(tokens, types, strict=True)
        if kind_ == CONTROL and set(token) <= alphabet
    ])
    tokenizer.add_tokens([
        AddedToken(token, normalized=False, special=False)
        for token, kind_ in zip(tokens, types, strict=True)
        if kind_ == USER_DEFINED and token in vocab
    ])

    def token_at(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and token_at("eos_token_id") is not None
    tokenizer.post_processor = _post_processor(tokenizer, token_at("bos_token_id") if add_bos else None,
                                               token_at("eos_token_id") if add_eos else None)
    eos_ids = [metadata.get(f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token_at("bos_token_id"),
        "eos_token": token_at("eos_token_id"),
        "unk_token": token_at("unknown_token_id"),
        "pad_token": token_at("padding_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
    }
    return GGUFTokenizer(tokenizer, config, bos_id, tuple(dict.fromkeys(i for i in eos_ids if i is not None)))


def _post_processor(tokenizer: Tokenizer, bos: str | None, eos: str | None) -> processors.TemplateProcessing:
    """The special tokens encode() adds around a text: BOS and/or EOS where the file asks for them."""
    head, tail = ([f"{bos}:0"] if bos else []), ([f"{eos}:0"] if eos else [])
    specials = [(token, tokenizer.token_to_id(token)) for token in dict.fromkeys(filter(None, (bos, eos)))]
    return processors.TemplateProcessing(
        single=[*head, "$A:0", *tail], pair=[*head, "$A:0", *tail, *head, "$B:1", *tail], special_tokens=specials
    )
