"""`best_of` (completions): each prompt's choices are generated best_of times and the n most likely returned,
ranked by the sum of their tokens' log-probabilities, as OpenAI and vLLM rank them."""

from __future__ import annotations

from kvferry.router.api.completion_shapes import Choice


def cumulative_logprob(choice: Choice) -> float:
    # Node chunks carry {token_id: logprob} (string keys after JSON), the sampled token always among them.
    return sum(entry.get(str(token), float("-inf")) for token, entry in zip(choice.token_ids, choice.logprobs, strict=True))


def most_likely(choices: list[Choice], generated: int, returned: int) -> list[Choice]:
    """Of each prompt's `generated` consecutive choices, the `returned` most likely, indexed anew (prompt by
    prompt, as OpenAI numbers n choices)."""
    kept = []
    for first in range(0, len(choices), generated):
        ranked = sorted(choices[first : first + generated], key=cumulative_logprob, reverse=True)[:returned]
        for rank, choice in enumerate(ranked):
            choice.index = first // generated * returned + rank
            kept.append(choice)
    return kept
