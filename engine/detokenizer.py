"""Incremental detokenization and stop strings.

Byte-level BPE splits multi-byte characters across tokens; decoding a prefix then ends in U+FFFD. Text is
released only once the window of recent tokens decodes cleanly (vLLM's prefix/read offsets). Stop
strings are matched on the text, so they are found across token boundaries and cut off before emission;
while running, the last len(longest stop) - 1 characters are held back so a streamed delta is never
taken back later.
"""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop_strings: list[str], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = stop_strings
        self.skip_special_tokens = skip_special_tokens
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens)

    def append(self, token_id: int, find_stops: bool = True) -> str | None:
        """Add one generated token; returns the stop string it completed, if any (text is cut before it).
        Without find_stops (a sequence short of its min_tokens) its text is only added."""
        self.token_ids.append(token_id)
        prefix_text = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.token_ids[self.prefix_offset :])
        if len(new_text) < len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return None  # an incomplete character: wait for the token that finishes it
        delta = new_text[len(prefix_text) :]
        # A token with no text of its own (a skipped special token, an id past the tokenizer's vocabulary)
        # moves the window on too: held back, every later step would decode an ever longer window.
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        if not find_stops:
            self.text += delta
            return None
        return self._add_text(delta) if delta else None

    def flush(self) -> None:
        """At the end, release whatever is still pending even if it is an incomplete character."""
        pending = self._decode(self.token_ids[self.read_offset :])
        if self.read_offset < len(self.token_ids) and pending:
            self.text += pending
            self.read_offset = len(self.token_ids)

    def _add_text(self, delta: str) -> str | None:
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        found = [(self.text.find(stop, search_from), stop) for stop in self.stop_strings]
        found = [(position, stop) for position, stop in found if position != -1]
        if not found:
            return None
        position, stop = min(found)  # the stop that starts first wins
        self.text = self.text[:position]
        return stop

    def visible_text(self, finished: bool) -> str:
        if finished or not self.holdback:
            return self.text
        return self.text[: max(0, len(self.text) - self.holdback)]
