"""Multi-turn conversations: session-aware routing against prefix routing alone.

An agent's workload: conversations of TURNS turns each, run side by side, every turn the whole conversation so
far (system prompt, each earlier question and answer) and a new question, so the context grows turn by turn.
Two prefill and two decode nodes (one of each pinned to each core) and two routers over them, both with the
Redis prefix index: `session` runs the `session` policy (the default's weights, and its `session` scorer
keeps a conversation on the nodes of its last turn), `prefix` the default policy. Each request names its conversation
(`prompt_cache_key`). The decode node of a conversation's last turn holds its prompt's and its answer's KV; the
prefill node holds the prompt's blocks only. Outputs have exactly OUTPUT_LEN tokens (ignore_eos), so both
routers serve the same token counts. Each round runs every conversation through one router and then the
other (the order alternates between rounds), with a system prompt of its own per run so no run finds
another's blocks cached. TTFT: from sending a turn to its first content chunk. Hit rates, from the nodes'
counters before and after each run: the prefill nodes' (prompt tokens they did not compute) and the decode
nodes' (prompt tokens whose KV a decode node already held at its reservation: they did not travel).

    .venv/bin/python -m benchmarks.multi_turn_sessions           # -> benchmarks/results/multi_turn_sessions.json
    .venv/bin/python -m benchmarks.multi_turn_sessions --quick   # tiny model, 2 conversations of 3 turns
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.plot import pyplot_or_none
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, RouterSpec, ServingCluster, counter_total
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.datasets import TokenWords

PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "multi_turn_sessions.png"
ROUTERS = ("session", "prefix")  # the router names; their policies: session, default
HIT_COUNTER, QUERY_COUNTER = "kvferry:prefix_cache_hits_tokens", "kvferry:prefix_cache_queries_tokens"


@dataclass(frozen=True)
class Turn:
    router: str
    turn: int
    ttft_s: float
    prompt_tokens: int


async def conversation(client: httpx.AsyncClient, url: str, model: str, name: str, system: str, questions: list[str],
                       output_len: int, router: str) -> list[Turn]:
    messages = [{"role": "system", "content": system}]
    turns = []
    for index, question in enumerate(questions):
        messages.append({"role": "user", "content": question})
        body = {"model": model, "messages": messages, "max_tokens": output_len, "ignore_eos": True, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}, "prompt_cache_key": name}
        sent, first, answer, usage = time.perf_counter(), None, "", {}
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{router} turn {index}: {response.status_code} {await response.aread()!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk["choices"]:
                    text = choice["delta"].get("content")
                    if text:
                        first = first or time.perf_counter()
                        answer += text
        if first is None:
            raise RuntimeError(f"{router} turn {index}: no content streamed")
        messages.append({"role": "assistant", "content": answer})
        turns.append(Turn(router, index, first - sent, usage["prompt_tokens"]))
    return turns


async def run(url: str, model: str, router: str, run_tag: str, words: TokenWords, args: argparse.Namespace) -> list[Turn]:
    rng = random.Random(run_tag)
    system = f"Run {run_tag}." + words.text(rng, args.system_len)
    conversations = [[words.text(rng, args.question_len) for _ in range(args.turns)] for _ in range(args.conversations)]
    async with httpx.AsyncClient(timeout=600) as client:
        async def staggered(index: int, questions: list[str]) -> list[Turn]:
            await asyncio.sleep(index * args.stagger_s)  # conversations arrive one after another, then overlap
            return await conversation(client, url, model, f"{run_tag}-{index}", system, questions, args.output_len, router)

        results = await asyncio.gather(*(staggered(index, questions) for index, questions in enumerate(conversations)))
    return [turn for turns in results for turn in turns]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def counters(urls: list[str]) -> tuple[float, float]:
    return counter_total(urls, HIT_COUNTER), counter_total(urls, QUERY_COUNTER)


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float:
    return round((after[0] - before[0]) / max(1.0, after[1] - before[1]), 3)


def row(router: str, turns: list[Turn], hits: dict[str, list[float]]) -> dict[str, object]:
    ttfts = [turn.ttft_s for turn in turns]
    later = [turn.ttft_s for turn in turns if turn.turn > 0]
    return {"variant": router, "turns": len(turns), "ttft_p50_s": round(statistics.median(ttfts), 4),
            "ttft_p90_s": round(percentile(ttfts, 0.9), 4), "later_turns_ttft_p50_s": round(statistics.median(later), 4),
            "prefill_hit_rate": round(statistics.mean(hits["prefill"]), 3),
            "decode_hit_rate": round(statistics.mean(hits["decode"]), 3),
            "prompt_tokens_last_turn": max(t.prompt_tokens for t in turns)}


def plot(turns: list[Turn], path: Path) -> None:
    pyplot = pyplot_or_none()
    if pyplot is None:
        return
    figure, axis = pyplot.subplots(figsize=(7, 4))
    for router in ROUTERS:
        by_turn = sorted({t.turn for t in turns})
        medians = [statistics.median(t.ttft_s * 1e3 for t in turns if t.router == router and t.turn == n) for n in by_turn]
        axis.plot([n + 1 for n in by_turn], medians, marker="o", label=router)
    axis.set_xlabel("turn")
    axis.set_ylabel("p50 TTFT (ms)")
    axis.set_title("Multi-turn conversations: session-aware vs prefix routing")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "multi_turn_sessions")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 conversations of 3 turns")
    parser.add_argument("--size", default="small", help="the random-weight checkpoint's size")
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="each router once per round, the order alternating")
    parser.add_argument("--system-len", type=int, default=96, help="system prompt tokens")
    parser.add_argument("--question-len", type=int, default=48, help="tokens of each new question")
    parser.add_argument("--output-len", type=int, default=24, help="tokens of each answer")
    parser.add_argument("--stagger-s", type=float, default=0.5, help="between the conversations' first turns")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.size, args.conversations, args.turns, args.rounds = "tiny", 2, 3, 1
    model = cached_model("llama", args.size)
    words = TokenWords(ModelTokenizer(model))
    load_at_start = os.getloadavg()
    nodes = [NodeSpec(role, f"{role}-{core}", core=core) for role in ("prefill", "decode") for core in (0, 1)]
    routers = [RouterSpec("session", ("--policy", "session"), with_index=True), RouterSpec("prefix", with_index=True)]
    turns: list[Turn] = []
    hits: dict[str, dict[str, list[float]]] = {router: {"prefill": [], "decode": []} for router in ROUTERS}
    with ServingCluster(model, nodes, routers) as cluster:
        role_urls = {role: [url for name, url in cluster.node_urls.items() if name.startswith(role)]
                     for role in ("prefill", "decode")}
        for round_index in range(args.rounds):
            order = ROUTERS if round_index % 2 == 0 else tuple(reversed(ROUTERS))
            for router in order:
                started, before = time.perf_counter(), {role: counters(urls) for role, urls in role_urls.items()}
                done = asyncio.run(run(cluster.router_urls[router], model.name, router, f"{round_index}{router}",
                                       words, args))
                for role, urls in role_urls.items():
                    hits[router][role].append(hit_rate(before[role], counters(urls)))
                turns += done
                print(f"round {round_index} {router}: {len(done)} turns in {time.perf_counter() - started:.1f} s",
                      flush=True)
    rows = [row(router, [t for t in turns if t.router == router], hits[router]) for router in ROUTERS]
    session, prefix = rows
    ratios = {"ttft_p50_prefix_over_session": round(prefix["ttft_p50_s"] / session["ttft_p50_s"], 3),  # type: ignore[operator]
              "ttft_p90_prefix_over_session": round(prefix["ttft_p90_s"] / session["ttft_p90_s"], 3)}  # type: ignore[operator]
    print_table(rows, ["variant", "turns", "ttft_p50_s", "ttft_p90_s", "later_turns_ttft_p50_s", "prefill_hit_rate",
                       "decode_hit_rate", "prompt_tokens_last_turn"])
    print(ratios)
    params = {key: getattr(args, key) for key in ("size", "conversations", "turns", "rounds", "system_len",
                                                  "question_len", "output_len", "stagger_s")}
    load_avg = {"start": list(load_at_start), "end": list(os.getloadavg())}
    result = new_result("multi_turn_sessions", params, rows, baseline="prefix", summary=ratios,
                        environment={**environment(), "load_avg": load_avg, "cpu_cores": os.cpu_count()})
    print(f"wrote {write_result(result, output_dir(args))}")
    plot(turns, PLOT if not args.quick else Path(tempfile.gettempdir()) / "multi_turn_sessions_quick.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
