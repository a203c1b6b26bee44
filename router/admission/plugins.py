"""Request plugins: ordered hooks that may rewrite a request before it is routed, refuse it with a 4xx,
and post-process the text that comes back.

A plugin is found by name among the entry points of the group `kvferry.plugins` (or as "module:attribute")
and built with the options the config gives it. A plugin that raises anything but PluginRejected fails
its own request with a 500 naming it; the router keeps serving.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal

from kvferry.router.api.errors import APIError
from kvferry.router.config import PluginSection

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "kvferry.plugins"


@dataclass
class PluginContext:
    """The request as plugins see it; hooks change it in place."""

    kind: Literal["chat", "completion"]
    model: str
    messages: list[dict[str, Any]] | None = None  # chat: role and text content (and tool_calls, tool_call_id)
    prompts: list[str | list[int]] | None = None  # completion: text or token ids per prompt
    prompt_token_ids: list[list[int]] | None = None  # set once tokenized, before on_tokens
    user: str | None = None  # the request's `user`: the end user, as the client names them
    metadata: dict[str, Any] = field(default_factory=dict)  # for plugins to pass notes to their later hooks


class PluginRejected(Exception):
    """Raised by a hook to refuse the request with a 4xx and a message for the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        if not 400 <= status < 500:
            raise ValueError(f"a plugin rejects with a 4xx status, not {status}")
        super().__init__(message)
        self.status = status


class RequestPlugin:
    """Base class: override the hooks you need; the others leave the request alone."""

    name = "plugin"

    def on_request(self, context: PluginContext) -> None:
        """Before tokenization: rewrite `messages` or `prompts`, or raise PluginRejected."""

    def on_tokens(self, context: PluginContext) -> None:
        """After tokenization: rewrite `prompt_token_ids`, or raise PluginRejected."""

    def on_output(self, context: PluginContext, text: str) -> str:
        """Each piece of generated text (a whole choice, or one streamed delta) on its way to the client."""
        return text


class PluginChain:
    def __init__(self, plugins: Sequence[RequestPlugin]) -> None:
        self.plugins = list(plugins)

    def on_request(self, context: PluginContext) -> None:
        for plugin in self.plugins:
            self._run(plugin, plugin.on_request, context)

    def on_tokens(self, context: PluginContext) -> None:
        for plugin in self.plugins:
            self._run(plugin, plugin.on_tokens, context)

    def on_output(self, context: PluginContext, text: str) -> str:
        for plugin in self.plugins:
            text = self._run(plugin, plugin.on_output, context, text)
        return text

    @staticmethod
    def _run(plugin: RequestPlugin, hook: Callable[..., Any], *args: Any) -> Any:
        try:
            return hook(*args)
        except PluginRejected as exc:
            raise APIError(exc.status, f"rejected by plugin {plugin.name}: {exc}", code="rejected_by_plugin") from None
        except Exception as exc:
            log.exception("plugin %s failed", plugin.name)
            raise APIError(500, f"plugin {plugin.name} failed: {exc!r}", code="plugin_error") from None


def _factory(name: str) -> Callable[..., RequestPlugin]:
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == name:
            return entry_point.load()
    if ":" in name:
        module, _, attribute = name.partition(":")
        return getattr(importlib.import_module(module), attribute)
    known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    raise ValueError(f"no plugin {name!r}: not an entry point of {ENTRY_POINT_GROUP} ({known}) nor module:attribute")


def load_plugins(sections: Sequence[PluginSection]) -> PluginChain:
    """Build the configured plugins in order; a bad name or options stop the router at start-up."""
    plugins = []
    for section in sections:
        plugin = _factory(section.name)(**section.options)
        plugin.name = section.name
        plugins.append(plugin)
    return PluginChain(plugins)
