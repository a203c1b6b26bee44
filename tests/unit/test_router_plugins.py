"""Request plugins: loading by entry point and by module:attribute, order, rejections, failures, and the
two example plugins."""

from __future__ import annotations

import pytest

from kvferry.router.admission.example_plugins import RegexPromptGuard, SystemPromptInjector
from kvferry.router.admission.plugins import PluginContext, PluginRejected, RequestPlugin, load_plugins
from kvferry.router.api.errors import APIError
from kvferry.router.config import PluginSection


def chat(*messages: tuple[str, str]) -> PluginContext:
    return PluginContext("chat", "m", messages=[{"role": role, "content": text} for role, text in messages])


def test_example_plugins_load_from_their_entry_points_in_the_configured_order():
    chain = load_plugins([PluginSection(name="prompt_guard", options={"deny": ["x"]}),
                          PluginSection(name="system_prompt", options={"prompt": "Be brief."})])
    assert [type(p) for p in chain.plugins] == [RegexPromptGuard, SystemPromptInjector]
    assert [p.name for p in chain.plugins] == ["prompt_guard", "system_prompt"]


def test_system_prompt_goes_in_front_unless_one_is_there():
    injector = SystemPromptInjector("Be brief.")
    context = chat(("user", "Hi"))
    injector.on_request(context)
    assert context.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    own = chat(("system", "Mine"), ("user", "Hi"))
    injector.on_request(own)
    assert own.messages[0] == {"role": "system", "content": "Mine"}
    SystemPromptInjector("Theirs", replace=True).on_request(own)
    assert [m["content"] for m in own.messages] == ["Theirs", "Hi"]
    completion = PluginContext("completion", "m", prompts=["Q: 2+2?", [1, 2, 3]])
    injector.on_request(completion)
    assert completion.prompts == ["Be brief.Q: 2+2?", [1, 2, 3]]  # token ids are left alone


def test_prompt_guard_rejects_matches_and_redacts_output():
    guard = RegexPromptGuard(deny=[r"\bpassword\b"], redact=[r"\d{4}-\d{4}"], status=403)
    guard.on_request(chat(("user", "passwords are fine")))
    with pytest.raises(PluginRejected, match="password") as rejected:
        guard.on_request(chat(("user", "tell me the PASSWORD")))
    assert rejected.value.status == 403
    with pytest.raises(PluginRejected):
        guard.on_request(PluginContext("completion", "m", prompts=["my password"]))
    assert guard.on_output(chat(), "card 1234-5678 ok") == "card [redacted] ok"


def test_the_chain_turns_rejections_into_4xx_and_failures_into_500_of_that_request():
    class Broken(RequestPlugin):
        def on_tokens(self, context: PluginContext) -> None:
            raise KeyError("boom")

    class Shout(RequestPlugin):
        def on_output(self, context: PluginContext, text: str) -> str:
            return text.upper()

    chain = load_plugins([PluginSection(name="prompt_guard", options={"deny": ["no"]})])
    with pytest.raises(APIError) as refused:
        chain.on_request(chat(("user", "no way")))
    assert (refused.value.status, refused.value.code) == (400, "rejected_by_plugin")
    assert "prompt_guard" in refused.value.message
    chain.plugins += [Broken(), Shout()]
    with pytest.raises(APIError) as failed:
        chain.on_tokens(chat(("user", "fine")))
    assert failed.value.status == 500 and "boom" in failed.value.message
    assert chain.on_output(chat(), "quiet") == "QUIET"


def test_plugins_load_by_module_attribute_and_unknown_names_fail_at_start():
    chain = load_plugins([PluginSection(name="kvferry.router.admission.example_plugins:SystemPromptInjector", options={"prompt": "p"})])
    assert isinstance(chain.plugins[0], SystemPromptInjector)
    with pytest.raises(ValueError, match="no plugin 'nope'"):
        load_plugins([PluginSection(name="nope")])
    with pytest.raises(ValueError, match="4xx"):
        PluginRejected("bad", status=500)
