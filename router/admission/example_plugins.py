"""Two example request plugins (entry points `system_prompt` and `prompt_guard`, docs/router.md)."""

from __future__ import annotations

import re

from kvferry.router.admission.plugins import PluginContext, PluginRejected, RequestPlugin


class SystemPromptInjector(RequestPlugin):
    """Puts a system prompt in front of every chat (unless it has one, or `replace` is set) and in front
    of every text completion prompt."""

    def __init__(self, prompt: str, replace: bool = False) -> None:
        self.prompt, self.replace = prompt, replace

    def on_request(self, context: PluginContext) -> None:
        if context.messages is not None:
            has_system = bool(context.messages) and context.messages[0]["role"] in ("system", "developer")
            if has_system and self.replace:
                context.messages[0] = {"role": "system", "content": self.prompt}
            elif not has_system:
                context.messages.insert(0, {"role": "system", "content": self.prompt})
        if context.prompts is not None:
            context.prompts = [self.prompt + p if isinstance(p, str) else p for p in context.prompts]


class RegexPromptGuard(RequestPlugin):
    """Refuses prompts matching any of `deny` (case-insensitive) with `status`, and replaces matches of
    `redact` in the output. Streamed output is redacted delta by delta: a match split across deltas passes."""

    def __init__(self, deny: list[str], redact: list[str] | None = None, status: int = 400) -> None:
        self.deny = [re.compile(pattern, re.IGNORECASE) for pattern in deny]
        self.redact = [re.compile(pattern) for pattern in redact or []]
        self.status = status

    def on_request(self, context: PluginContext) -> None:
        texts = [m["content"] for m in context.messages or []] + [p for p in context.prompts or [] if isinstance(p, str)]
        for text in texts:
            for pattern in self.deny:
                if pattern.search(text):
                    raise PluginRejected(f"the prompt matches the denied pattern {pattern.pattern!r}", self.status)

    def on_output(self, context: PluginContext, text: str) -> str:
        for pattern in self.redact:
            text = pattern.sub("[redacted]", text)
        return text
