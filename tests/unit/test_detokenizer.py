from tokenizers import Tokenizer

from kvferry.engine.detokenizer import IncrementalDetokenizer
from kvferry.engine.make_model import train_tokenizer


def _gpt2_byte_alphabet() -> dict[int, str]:
    """The byte -> printable character map of byte-level BPE (GPT-2's bytes_to_unicode)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_BYTE_TO_CHAR = _gpt2_byte_alphabet()


def _tokenizer() -> Tokenizer:
    return train_tokenizer("qwen2")


def _stream(tokenizer: Tokenizer, token_ids: list[int], stop: list[str] | None = None) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tokenizer, stop or [])
    visible = []
    for token in token_ids:
        if detok.append(token) is not None:
            break
        visible.append(detok.visible_text(finished=False))
    return visible, detok


def test_multibyte_characters_are_never_emitted_half_done():
    tokenizer = _tokenizer()
    text = "Zürich 🚢 こんにちは, café"
    # One token per byte, so every multi-byte character spans several tokens.
    byte_tokens = [tokenizer.token_to_id(_BYTE_TO_CHAR[b]) for b in text.encode()]
    visible, detok = _stream(tokenizer, byte_tokens)
    assert all("\ufffd" not in piece for piece in visible)
    assert all(b.startswith(a) for a, b in zip(visible, visible[1:], strict=False))
    detok.flush()
    assert detok.text == text


def test_stop_string_spanning_tokens_is_cut():
    tokenizer = _tokenizer()
    ids = tokenizer.encode("The river was wide and slow in the evening", add_special_tokens=False).ids
    _, detok = _stream(tokenizer, ids, stop=["de and sl"])
    assert detok.text == "The river was wi"


def test_earliest_stop_wins_and_holdback_hides_partial_stops():
    tokenizer = _tokenizer()
    ids = tokenizer.encode("abc STOP def END", add_special_tokens=False).ids
    visible, detok = _stream(tokenizer, ids, stop=["END", "STOP"])
    assert detok.text == "abc "
    assert all("ST" not in piece for piece in visible)


def test_tokens_without_text_do_not_widen_the_decode_window():
    # Ids past the tokenizer's vocabulary (an 8b-shape checkpoint's random output) decode to nothing; the
    # window must move past them, or every later step decodes all of them again.
    tokenizer = _tokenizer()
    beyond = tokenizer.get_vocab_size()
    hello = tokenizer.encode("hello world").ids
    detok = IncrementalDetokenizer(tokenizer, [])
    for token in range(beyond, beyond + 50):
        assert detok.append(token) is None
        assert len(detok.token_ids) - detok.prefix_offset <= 2
    for token in hello:
        detok.append(token)
    assert detok.visible_text(finished=True) == "hello world"
