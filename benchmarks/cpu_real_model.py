"""The real default model on this CPU, side by side: kvferry, transformers and llama.cpp (llama-cpp-python).

SmolLM2-135M-Instruct, the model `kvferry up` serves. kvferry and transformers compute in float32 from
kvferry's import of the Q4_1 GGUF; llama.cpp runs twice: on an F32 GGUF that llama.cpp's own
convert_hf_to_gguf.py writes from that same import (the precision kvferry computes in), and on the Q4_1
file itself, as a user would run it. One process, one engine after the other, the same token ids, greedy,
EOS ignored so every request produces exactly its tokens. Rows:
- batch-1 decode tokens/s: one 16-token prompt, 128 new tokens, time after the first token;
- TTFT for a 512-token prompt: the prompt and one new token;
- 16 concurrent requests: 16 prompts of 32 tokens, 64 new tokens each, all generated tokens over the wall
  time (kvferry: continuous batching; transformers: one padded `generate`; llama.cpp: 16 sequences in one
  llama_batch through its low-level API, since its high-level `Llama` runs one sequence at a time).

Quantized rows: kvferry's int8 weights (`--quantization int8`, kernels/int8_linear.py) from the same import,
and, on one Q8_0 GGUF that convert_hf_to_gguf.py writes from it, llama.cpp beside kvferry int8 loading that
very file. For those two, agreement with llama.cpp on the same file: 8 English prompts x 64 tokens, kvferry's
top-1 after each prefix of llama.cpp's greedy reply (teacher-forced), with kvferry float32 on the same file
(its weights dequantized exactly) as the measure of what the formats' arithmetic alone parts.

Each row also says how many weight bytes a decode step reads and the batch-1 rate that reading them once a
token at this process's measured memory read bandwidth allows (`bandwidth_bound_tok_s`), the bound every
engine's batch-1 decode sits under.

bfloat16 rows: kvferry with `--dtype bfloat16` and llama.cpp on a BF16 GGUF that convert_hf_to_gguf.py writes
from the same import, with the same teacher-forced agreement between the two.

int4 row: kvferry with `--quantization int4 --dtype bfloat16` (kernels/int4_linear.py: the linear layers in
groups of 32 as the Q4_1 file has them, the LM head in int8 as its Q8_0) beside llama.cpp on the Q4_1 file,
with the same agreement on that file: kvferry int4, and kvferry float32 (the file dequantized exactly).

float32, bfloat16 and int4 run twice: with kvferry's C kernels (the default: the linear layers of decode
batches in kernels/cpu_gemv.py, for float32 and bfloat16; their other decode-step kernels in
kernels/cpu_decode.py) and with `KVFERRY_KERNELS=torch` ("torch kernels"): oneDNN's prepacked linear layers
(kernels/cpu_linear.py) and the torch ops the others replace.

llama-cpp-python is not a dependency of kvferry: `make bench-llama-cpp` builds it from source (about ten
minutes here); its source distribution carries the convert script, unpacked once into the kvferry cache.

    make bench-llama-cpp
    .venv/bin/python -m benchmarks.cpu_real_model
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy
import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import CACHE, environment
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.side_by_side import with_ratios
from benchmarks.harness.table import print_table
from benchmarks.harness.warmup import warm_up
from kvferry.engine import LLM, SamplingParams
from kvferry.engine.model_source import default_gguf, default_model
from kvferry.kernels.dispatch import BACKEND_VARIABLE

THREADS = torch.get_num_threads()
# ctypes callbacks handed to llama.cpp, kept alive for as long as the process runs (it may call them any time).
_LLAMA_CALLBACKS: list[object] = []


@dataclass(frozen=True)
class Sizes:
    decode_prompt: int = 16
    decode_tokens: int = 128
    ttft_prompt: int = 512
    batch: int = 16
    batch_prompt: int = 32
    batch_tokens: int = 64


QUICK = Sizes(decode_prompt=8, decode_tokens=8, ttft_prompt=64, batch=4, batch_prompt=8, batch_tokens=8)
AGREEMENT_PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Explain recursion in one sentence:",
    "The best way to learn a language is",
    "Water boils at",
)
AGREEMENT_TOKENS = 64
# The engines the agreement runs again after their rows: kept, where the others go once measured.
AGREEMENT_ENGINES = ("llama.cpp Q8_0 GGUF", "kvferry int8 on the Q8_0 GGUF", "llama.cpp BF16 GGUF", "kvferry bfloat16",
                     "llama.cpp Q4_1 GGUF", "kvferry int4", "kvferry float32")


def prompts(vocab: int, sizes: Sizes) -> dict[str, list[list[int]]]:
    rng = random.Random(0)
    draw = lambda n: [rng.randrange(1000, vocab) for _ in range(n)]  # noqa: E731 - ordinary ids, no specials
    return {
        "decode": [draw(sizes.decode_prompt)],
        "ttft": [draw(sizes.ttft_prompt)],
        "batch": [draw(sizes.batch_prompt) for _ in range(sizes.batch)],
    }


Generate = Callable[[list[list[int]], int], list[list[int]]]  # (prompts, new tokens) -> each one's new tokens


def rows_from(
    generate: Generate, cases: dict[str, list[list[int]]], sizes: Sizes
) -> tuple[dict[str, float], list[int]]:
    """The three rows for one engine, and its greedy tokens for the decode prompt (to compare engines)."""
    warm_up(lambda: generate(cases["decode"], 2))  # allocations, kernels, caches
    start = time.perf_counter()
    generate(cases["decode"], 1)
    first = time.perf_counter() - start
    start = time.perf_counter()
    [tokens] = generate(cases["decode"], sizes.decode_tokens + 1)
    decode_s = time.perf_counter() - start - first
    start = time.perf_counter()
    generate(cases["ttft"], 1)
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    generate(cases["batch"], sizes.batch_tokens)
    batch_s = time.perf_counter() - start
    return {
        "decode_tok_s": round(sizes.decode_tokens / decode_s, 1),
        "ttft_ms": round(1e3 * ttft, 1),
        "concurrent_tok_s": round(sizes.batch * sizes.batch_tokens / batch_s, 1),
    }, tokens


def kvferry_generate(model: Path, quantization: str | None = None, dtype: str = "float32",
                     kernels: str = "auto") -> Generate:
    """`kernels`: KVFERRY_KERNELS while it generates ("torch": without the bfloat16 C kernels)."""
    llm = LLM(model, dtype=dtype, quantization=quantization)

    def generate(batch: list[list[int]], new_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        with kernels_side(kernels):
            outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
        assert all(len(o.outputs[0].token_ids) == new_tokens for o in outputs)
        return [list(o.outputs[0].token_ids) for o in outputs]

    return generate


@contextlib.contextmanager
def kernels_side(side: str) -> Iterator[None]:
    before = os.environ.get(BACKEND_VARIABLE)
    os.environ[BACKEND_VARIABLE] = side
    try:
        yield
    finally:
        if before is None:
            del os.environ[BACKEND_VARIABLE]
        else:
            os.environ[BACKEND_VARIABLE] = before


def transformers_generate(model: Path) -> Generate:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

    @torch.no_grad()
    def generate(batch: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(batch)  # equal lengths within a row of this benchmark: no padding needed
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        assert out.shape[1] == ids.shape[1] + new_tokens
        return out[:, ids.shape[1] :].tolist()

    return generate


def llama_cpp_generate(gguf: Path, sizes: Sizes) -> Generate:
    """Greedy decoding of several sequences at once through llama.cpp's C API (llama_batch, llama_decode)."""
    import llama_cpp as ll

    silence = ll.llama_log_callback(
        lambda _level, _text, _data: None
    )  # it logs every load and graph otherwise
    _LLAMA_CALLBACKS.append(silence)
    ll.llama_log_set(silence, None)
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(str(gguf).encode(), params)
    context_params = ll.llama_context_default_params()
    context_params.n_ctx = sizes.batch * (sizes.batch_prompt + sizes.batch_tokens) + sizes.ttft_prompt + 64
    context_params.n_batch = context_params.n_ubatch = sizes.ttft_prompt + sizes.batch * sizes.batch_prompt
    context_params.n_seq_max = sizes.batch
    # One KV cache shared by the sequences (else each gets n_ctx / n_seq_max and the 512-token prompt does not fit).
    context_params.kv_unified = True
    context_params.n_threads = context_params.n_threads_batch = THREADS
    context = ll.llama_init_from_model(model, context_params)
    vocab = ll.llama_n_vocab(ll.llama_model_get_vocab(model))
    batch = ll.llama_batch_init(context_params.n_batch, 0, sizes.batch)

    def fill(entries: list[tuple[int, int, int, bool]]) -> None:  # (token, position, sequence, wants logits)
        batch.n_tokens = len(entries)
        for i, (token, position, sequence, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, position, 1
            batch.seq_id[i][0], batch.logits[i] = sequence, logits

    def argmax(index: int) -> int:
        return int(numpy.ctypeslib.as_array(ll.llama_get_logits_ith(context, index), shape=(vocab,)).argmax())

    def generate(prompts_: list[list[int]], new_tokens: int) -> list[list[int]]:
        ll.llama_memory_clear(ll.llama_get_memory(context), True)
        fill(
            [
                (t, p, s, p == len(prompt) - 1)
                for s, prompt in enumerate(prompts_)
                for p, t in enumerate(prompt)
            ]
        )
        assert ll.llama_decode(context, batch) == 0
        last = [i for i in range(batch.n_tokens) if batch.logits[i]]
        positions = [len(p) for p in prompts_]
        generated: list[list[int]] = [[] for _ in prompts_]
        for step in range(new_tokens):
            tokens = [argmax(i) for i in last]
            for sequence, token in enumerate(tokens):
                generated[sequence].append(token)
            if step == new_tokens - 1:
                return generated
            fill([(t, positions[s] + step, s, True) for s, t in enumerate(tokens)])
            assert ll.llama_decode(context, batch) == 0
            last = list(range(len(prompts_)))
        return generated

    return generate


def convert_script() -> Path:
    """llama.cpp's convert_hf_to_gguf.py from the source distribution of the installed llama-cpp-python,
    fetched from PyPI once and unpacked into the kvferry cache."""
    from importlib.metadata import version

    import httpx

    release = version("llama-cpp-python")
    script = CACHE / f"llama_cpp_python-{release}" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.is_file():
        name = f"llama_cpp_python-{release}.tar.gz"
        index = httpx.get(
            "https://pypi.org/simple/llama-cpp-python/",
            timeout=30,
            follow_redirects=True,
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        )  # PEP 691
        [sdist] = [entry["url"] for entry in index.json()["files"] if entry["filename"] == name]
        archive_path = CACHE / "downloads" / name
        archive_path.parent.mkdir(parents=True, exist_ok=True)
        with (
            httpx.stream("GET", sdist, timeout=120, follow_redirects=True) as response,
            archive_path.open("wb") as out,
        ):
            response.raise_for_status()
            for chunk in response.iter_bytes(1 << 20):
                out.write(chunk)
        with tarfile.open(archive_path) as archive:
            archive.extractall(CACHE, filter="data")
    return script


def converted_gguf(model: Path, outtype: str) -> Path:
    """The model folder written as a GGUF of `outtype` (f32, bf16, q8_0) by llama.cpp's own convert script, once."""
    out = CACHE / "models" / f"{model.name}-{outtype}.gguf"
    if not out.is_file():
        script = convert_script()
        env = {"PYTHONPATH": str(script.parent / "gguf-py"), "PATH": "/usr/bin:/bin"}
        subprocess.run(
            [sys.executable, str(script), str(model), "--outtype", outtype, "--outfile", str(out)],
            check=True,
            env=env,
        )
    return out


def parameter_count(model: Path) -> int:
    """The model folder's parameters, from its safetensors headers."""
    from safetensors import safe_open

    count = 0
    for shard in model.glob("*.safetensors"):
        with safe_open(shard, "pt") as tensors:
            count += sum(numpy.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return int(count)


def int4_bytes(model: Path, parameters: int) -> float:
    """What a decode step reads in int4: the linear layers at half a byte a weight plus a bfloat16 scale and
    zero a group of 32, the LM head (the embedding) in int8 with a scale a row."""
    import json

    config = json.loads((model / "config.json").read_text())
    head = config["vocab_size"] * config["hidden_size"]
    return head + 4 * config["vocab_size"] + (parameters - head) * (0.5 + 4 / 32)


def gguf_bytes(path: Path) -> int:
    """The bytes of a GGUF's tensors, as the file stores them (quantized blocks with their scales)."""
    from gguf import GGUFReader

    return sum(int(tensor.n_bytes) for tensor in GGUFReader(path).tensors)


def read_bandwidth() -> float:
    """Bytes a second that this process's threads read from memory: the best of five sums over 1 GiB."""
    data = torch.ones(1 << 28)
    data.sum()  # pages touched before timing
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * data.element_size() / best


def agreement_prompts(model: Path, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer(text).input_ids for text in AGREEMENT_PROMPTS[:count]]


def teacher_forced_agreement(reference: Generate, candidate: Generate, prompts_: list[list[int]], tokens: int) -> float:
    """How often `candidate` picks `reference`'s next token after each prefix of `reference`'s greedy replies."""
    replies = reference(prompts_, tokens)
    prefixes = [prompt + reply[:t] for prompt, reply in zip(prompts_, replies, strict=True) for t in range(tokens)]
    picks = [reply[0] for reply in candidate(prefixes, 1)]
    expected = [token for reply in replies for token in reply]
    return round(sum(a == b for a, b in zip(picks, expected, strict=True)) / len(expected), 4)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "cpu_real_model")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run at small sizes (its result in a temp folder)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    model, q4 = default_model(), default_gguf()
    cases = prompts(49152, sizes)
    parameters = parameter_count(model)
    f32, bf16, q8 = (converted_gguf(model, outtype) for outtype in ("f32", "bf16", "q8_0"))
    # Each engine, and the weight bytes one decode step reads (every weight: the LM head is the embedding).
    engines: dict[str, tuple[Callable[[], Generate], float]] = {
        "kvferry float32": (lambda: kvferry_generate(model), 4 * parameters),
        "kvferry float32, torch kernels": (lambda: kvferry_generate(model, kernels="torch"), 4 * parameters),
        "transformers float32": (lambda: transformers_generate(model), 4 * parameters),
        "llama.cpp F32 GGUF": (lambda: llama_cpp_generate(f32, sizes), gguf_bytes(f32)),
        "llama.cpp Q4_1 GGUF": (lambda: llama_cpp_generate(q4, sizes), gguf_bytes(q4)),
        "kvferry bfloat16": (lambda: kvferry_generate(model, dtype="bfloat16"), 2 * parameters),
        "kvferry bfloat16, torch kernels": (lambda: kvferry_generate(model, dtype="bfloat16", kernels="torch"),
                                            2 * parameters),
        "llama.cpp BF16 GGUF": (lambda: llama_cpp_generate(bf16, sizes), gguf_bytes(bf16)),
        "kvferry int8": (lambda: kvferry_generate(model, "int8"), parameters),
        "llama.cpp Q8_0 GGUF": (lambda: llama_cpp_generate(q8, sizes), gguf_bytes(q8)),
        "kvferry int8 on the Q8_0 GGUF": (lambda: kvferry_generate(q8, "int8"), parameters),
        "kvferry int4": (lambda: kvferry_generate(model, "int4", dtype="bfloat16"), int4_bytes(model, parameters)),
        "kvferry int4, torch kernels": (lambda: kvferry_generate(model, "int4", dtype="bfloat16", kernels="torch"),
                                        int4_bytes(model, parameters)),
    }
    bandwidth = read_bandwidth()
    print(f"memory read bandwidth: {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows, reference = [], None
    kept: dict[str, Generate] = {}
    for name, (make, weight_bytes) in engines.items():
        generate = make()
        if name in AGREEMENT_ENGINES:
            kept[name] = generate
        measured, tokens = rows_from(generate, cases, sizes)
        reference = reference or tokens
        # Greedy tokens of the decode prompt, against kvferry's: equal where the precision is the same.
        same = next(
            (i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), len(tokens)
        )
        # What bounds batch-1 decode: reading every weight once a token at the measured bandwidth.
        bound = bandwidth / weight_bytes
        rows.append(
            {"variant": name, "engine": name, **measured, "same_tokens_as_kvferry": f"{same}/{len(tokens)}",
             "weight_mb_per_token": round(weight_bytes / 1e6), "bandwidth_bound_tok_s": round(bound, 1),
             "decode_share_of_bound": round(measured["decode_tok_s"] / bound, 2)}
        )  # fmt: skip
        print(rows[-1], flush=True)
    # The same Q8_0 file on both engines: kvferry int8, and kvferry float32 (the file dequantized exactly),
    # each teacher-forced on llama.cpp's greedy replies; and bfloat16 on both, from the same weights.
    agreement_cases = agreement_prompts(model, 2 if args.quick else len(AGREEMENT_PROMPTS))
    tokens = sizes.batch_tokens if args.quick else AGREEMENT_TOKENS
    llama_q8 = kept["llama.cpp Q8_0 GGUF"]
    agreement = {
        "prompts": len(agreement_cases),
        "tokens": tokens,
        "kvferry int8 on the Q8_0 GGUF": teacher_forced_agreement(
            llama_q8, kept["kvferry int8 on the Q8_0 GGUF"], agreement_cases, tokens
        ),
        "kvferry float32 on the Q8_0 GGUF": teacher_forced_agreement(
            llama_q8, kvferry_generate(q8), agreement_cases, tokens
        ),
    }
    print(f"top-1 agreement with llama.cpp on the Q8_0 file: {agreement}", flush=True)
    bf16_agreement = {
        "prompts": len(agreement_cases),
        "tokens": tokens,
        "kvferry bfloat16": teacher_forced_agreement(
            kept["llama.cpp BF16 GGUF"], kept["kvferry bfloat16"], agreement_cases, tokens
        ),
    }
    print(f"top-1 agreement with llama.cpp BF16: {bf16_agreement}", flush=True)
    llama_q4 = kept["llama.cpp Q4_1 GGUF"]
    q4_agreement = {
        "prompts": len(agreement_cases),
        "tokens": tokens,
        "kvferry int4": teacher_forced_agreement(llama_q4, kept["kvferry int4"], agreement_cases, tokens),
        "kvferry float32": teacher_forced_agreement(llama_q4, kept["kvferry float32"], agreement_cases, tokens),
    }
    print(f"top-1 agreement with llama.cpp on the Q4_1 file: {q4_agreement}", flush=True)
    baseline = rows[0]["variant"]
    rows = with_ratios(rows, baseline, ["decode_tok_s", "concurrent_tok_s"])
    print_table(rows, list(rows[0]))
    params = {"model": "SmolLM2-135M-Instruct", "sizes": asdict(sizes)}
    result = new_result(
        "cpu_real_model", params, rows, baseline=baseline, environment={**environment(), "threads": THREADS},
        summary={
            "top1_agreement_with_llama_cpp_q8_0": agreement,
            "top1_agreement_with_llama_cpp_bf16": bf16_agreement,
            "top1_agreement_with_llama_cpp_q4_1": q4_agreement,
            "memory_read_gb_s": round(bandwidth / 1e9, 1),
        },
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
