"""The synchronous engine: requests in, one scheduler step at a time, incremental outputs out."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from kvferry.engine.block_manager import BlockManager
from kvferry.engine.cuda_graphs import DecodeGraphs
from kvferry.engine.detokenizer import IncrementalDetokenizer
from kvferry.engine.devices import make_current
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.generation_config import GenerationDefaults
from kvferry.engine.grammar import GrammarCompiler
from kvferry.engine.kv_budget import num_kv_blocks
from kvferry.engine.model import CausalLM
from kvferry.engine.model_config import ModelConfig
from kvferry.engine.model_runner import Launched, ModelRunner
from kvferry.engine.model_source import resolve_model
from kvferry.engine.outputs import CompletionOutput, EngineOccupancy, RequestOutput
from kvferry.engine.sampler import SamplerOutput
from kvferry.engine.sampling_params import SamplingParams
from kvferry.engine.scheduler import ScheduledBatch, Scheduler, SchedulerConfig
from kvferry.engine.sequence import Sequence, SequenceStatus
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.engine.weights import load_weights
from kvferry.engine.weights_fingerprint import weights_fingerprint
from kvferry.kvcache.allocator import BlockAllocator, OutOfBlocksError
from kvferry.kvcache.kv_pool import HostAllocator, KVPool, KVPoolLayout

PromptInput = str | dict[str, list[int]]
# Stands for a token still on the device (a step launched ahead reads it there); replaced once it is read.
PLACEHOLDER_TOKEN = -1

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVReservation:
    request_id: str
    block_ids: list[int]  # to be filled with the prompt's blocks from first_block on
    first_block: int  # leading prompt blocks this node already holds


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence]
    hold_kv: bool = False
    kv_block_ids: list[int] | None = None
    # Monotonic times that split a node's time to first token into waiting and computing.
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None

    def output(self) -> RequestOutput:
        completions = [
            CompletionOutput(
                index=seq.index,
                text=seq.new_text(),
                token_ids=seq.new_output_token_ids,  # already a fresh list: copied once, not twice
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                logprobs=None if seq.logprobs is None else list(seq.logprobs),
            )
            for seq in self.seqs
        ]
        queued = None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time
        return RequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, completions, self.seqs[0].num_cached_tokens,
            self.kv_block_ids, queued,
        )


class LLMEngine:
    def __init__(self, model_dir: str | Path, args: EngineArgs | None = None, pool_allocator: HostAllocator | None = None) -> None:
        """`model_dir`: a model folder, or anything else engine/model_source.py resolves (a .gguf file, the
        default model's name). `pool_allocator`: where a host KV pool's memory comes from (a node passes its
        transfer engine's allocate_managed_buffer, so that KV blocks written into it arrive by plain copies)."""
        args = args or EngineArgs()
        self.args = args
        self.model_dir = resolve_model(model_dir)
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self.device = args.resolve_device()
        make_current(self.device)  # before the weights, the pool, the kernels' first launches and the graphs
        self.dtype = args.resolve_dtype(self.model_config.torch_dtype, self.device)
        self.tokenizer = ModelTokenizer(self.model_dir)
        self.generation_defaults = GenerationDefaults.from_dir(self.model_dir, self.model_config, self.tokenizer)
        self.max_model_len = min(args.max_model_len or 8192, self.model_config.max_position_embeddings)
        self.served_model_name = args.served_model_name or self.model_dir.name

        cfg = self.model_config
        # Quantized here, the weights are not the checkpoint's: their KV differs from a 16-bit node's.
        quantize = args.quantize_at_load(cfg.quantization, self.device)
        self.pool_layout = KVPoolLayout(
            num_layers=cfg.num_layers,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            block_size=args.block_size,
            dtype=str(self.dtype).removeprefix("torch."),
            weights=weights_fingerprint(self.model_dir) + (f"+{quantize}" if quantize else ""),
        )
        # Weights first: on CUDA the pool gets what they and the activations leave of the memory budget.
        model = CausalLM(cfg, load_weights(self.model_dir, cfg, self.dtype, self.device, quantize), self.max_model_len)
        num_blocks = num_kv_blocks(args, model, self.pool_layout, self.device, self.max_model_len)
        self.block_manager = BlockManager(
            BlockAllocator(num_blocks, args.enable_prefix_caching), args.block_size, self.served_model_name
        )
        self._check_pool_holds_one_sequence(num_blocks)
        self.pool = KVPool(self.pool_layout, num_blocks, self.device, pool_allocator)
        graphs = None
        if self.device.type == "cuda" and args.cuda_graph_batch_sizes():
            graphs = DecodeGraphs(model, self.pool, args.cuda_graph_batch_sizes(), self.block_manager.blocks_for(self.max_model_len))
        self.runner = ModelRunner(model, self.pool, self.device, graphs)
        self.scheduler = Scheduler(
            SchedulerConfig(args.max_num_seqs, args.max_num_batched_tokens, self.max_model_len), self.block_manager
        )
        self.requests: dict[str, Request] = {}
        self.held_kv: dict[str, list[int]] = {}  # prefill side: finished requests whose blocks still travel
        self.reserved: dict[str, Sequence] = {}  # decode side: blocks reserved for KV arriving from a peer
        self._pending: tuple[ScheduledBatch, Launched] | None = None  # a step queued on the GPU, not yet read

    @property
    def allocator(self) -> BlockAllocator:
        return self.block_manager.allocator

    def _check_pool_holds_one_sequence(self, num_blocks: int) -> None:
        needed = self.block_manager.blocks_for(self.max_model_len)
        if num_blocks - 1 < needed:
            raise ValueError(
                f"num_kv_blocks={num_blocks} cannot hold one sequence of max_model_len={self.max_model_len} "
                f"({needed} blocks of {self.args.block_size} plus the null block): raise the KV budget or lower "
                "max_model_len"
            )

    # ---- requests ---------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return None, [int(t) for t in prompt["prompt_token_ids"]]
        raise TypeError("a prompt is a string or {'prompt_token_ids': [...]}")

    def add_request(
        self, request_id: str, prompt: PromptInput, params: SamplingParams | None = None, hold_kv: bool = False,
        resumed: list[int] | None = None,
    ) -> None:
        """Queue a request. With hold_kv (a prefill node's request) the prompt's blocks stay allocated after
        it finishes, listed in the output's kv_block_ids, until release_kv(request_id). `resumed`: the
        outputs a node that died sent already (Sequence.resume); the outputs report what follows them."""
        request = self._new_request(request_id, prompt, params, hold_kv, resumed or [])
        for seq in request.seqs:
            self.scheduler.add(seq)

    def _new_request(self, request_id: str, prompt: PromptInput, params: SamplingParams | None, hold_kv: bool,
                     resumed: list[int]) -> Request:
        params = params or SamplingParams()
        if request_id in self.requests or request_id in self.held_kv:
            raise ValueError(f"request_id {request_id!r} is already running")
        if hold_kv and params.n != 1:
            raise ValueError("n must be 1 for a request whose KV cache moves to another node")
        text, token_ids = self.tokenize_prompt(prompt)
        self._validate_prompt(token_ids + resumed)
        eos = frozenset() if params.ignore_eos else self.generation_defaults.eos_token_ids
        end_tokens = frozenset(params.stop_token_ids) | eos
        seqs = []
        for index in range(params.n):
            generator = None
            if params.seed is not None:
                generator = torch.Generator(self.device).manual_seed(params.seed + index)
            detokenizer = IncrementalDetokenizer(self.tokenizer.tokenizer, params.stop_strings, params.skip_special_tokens)
            grammar = self._grammars.matcher(params.grammar) if params.grammar is not None else None
            seqs.append(Sequence(request_id, index, token_ids, params, detokenizer, generator, end_tokens, grammar))
            if resumed:
                seqs[-1].resume(resumed, self.model_config.vocab_size)
        request = Request(request_id, text, token_ids, seqs, hold_kv)
        self.requests[request_id] = request
        return request

    @cached_property
    def _grammars(self) -> GrammarCompiler:
        """Built by the first request with a grammar: it loads xgrammar, which nodes without one never need."""
        end_tokens = self.generation_defaults.eos_token_ids
        return GrammarCompiler(self.tokenizer.tokenizer, self.model_config.vocab_size, end_tokens)

    def _validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but max_model_len is {self.max_model_len}: "
                "there is no room to generate"
            )
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids holds ids outside the vocabulary [0, {vocab}): {bad[:5]}")

    # ---- disaggregation: the prefill side holds KV, the decode side reserves and activates -----
    def release_kv(self, request_id: str) -> None:
        """The prefill side's transfer is over (sent or failed): free the blocks it held."""
        block_ids = self.held_kv.pop(request_id, None)
        if block_ids is not None:
            self.allocator.free(block_ids)

    def reserve(self, request_id: str, prompt: PromptInput, params: SamplingParams | None = None,
                resumed: list[int] | None = None) -> KVReservation:
        """Decode side: allocate the blocks a prompt's KV (and any resumed outputs') will arrive into. Blocks
        this node already holds (its prefix cache) are reused as first_block; raises OutOfBlocksError if short."""
        request = self._new_request(request_id, prompt, params, False, resumed or [])
        seq = request.seqs[0]
        self.block_manager.take_prefix_hits(seq)
        cached_blocks = len(seq.block_ids)
        if not self.block_manager.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens):
            self.block_manager.free(seq)
            del self.requests[request_id]
            raise OutOfBlocksError(f"no room for {seq.num_tokens} prompt tokens of {request_id!r}")
        seq.num_cached_tokens = seq.num_computed_tokens
        self.reserved[request_id] = seq
        return KVReservation(request_id, seq.block_ids[cached_blocks:], cached_blocks)

    def activate(self, request_id: str) -> None:
        """Decode side: the prompt's KV has arrived. The sequence joins the running batch with its last
        prompt token still to compute: the next step runs it as a decode row over the arrived blocks, and
        its logits give the first token, sampled here like every later one (as vLLM's decode side does).
        So the prefill node's sampled token never has to travel, and a seeded request draws from one
        generator, the same tokens as when colocated."""
        seq = self.reserved.pop(request_id)
        seq.num_computed_tokens = seq.num_tokens - 1
        self.block_manager.cache_computed_blocks(seq)
        seq.status = SequenceStatus.RUNNING
        self.scheduler.running.append(seq)

    def cancel_reservation(self, request_id: str) -> bool:
        """Decode side: the KV never arrived (lease expired, abort): free the reserved blocks. False when
        nothing was reserved under this id."""
        seq = self.reserved.pop(request_id, None)
        if seq is None:
            return False
        self.block_manager.free(seq)
        self.requests.pop(request_id, None)
        return True

    def abort_request(self, request_id: str) -> RequestOutput | None:
        self.cancel_reservation(request_id)
        self.release_kv(request_id)
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        return request.output()

    def occupancy(self) -> EngineOccupancy:
        return EngineOccupancy(
            len(self.scheduler.running), len(self.scheduler.waiting), len(self.reserved), len(self.held_kv),
            self.allocator.stats(), self.scheduler.num_preemptions,
        )

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- the loop ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step: its batch's new tokens as outputs. With decode graphs the next step is
        queued on the GPU before this step's tokens are detokenized and turned into outputs, so the GPU
        does not sit idle through that host work (on an H200 it was 0.2-1.4 ms of a 5-8 ms step). Where
        the next batch can only be this one again, one token further (_launch_ahead), it is queued even
        before this step's tokens reach the host, so the GPU does not wait for the sampling's round trip,
        the scheduler or the launch either. A sequence that a stop string or token ends meanwhile then has
        one wasted row in the queued step; a request that arrives meanwhile is admitted one step later."""
        make_current(self.device)  # steps may run on another thread than the constructor's (AsyncLLMEngine)
        launched = self._pending or self._launch_next()
        self._pending = None
        if launched is None:
            return []
        batch, handle = launched
        ahead = self._launch_ahead(batch, handle)
        sampled_seqs, sampled = self.runner.collect(handle)
        advanced, deferred = self._advance(batch, sampled_seqs, sampled, counted=ahead is not None)
        if ahead is not None:
            self._pending = ahead
        elif self.runner.graphs is not None and self.scheduler.has_unfinished:
            self._pending = self._launch_next()
        for seq, token in deferred:
            self._detokenize(seq, token)
        return [self._output(request_id) for request_id in dict.fromkeys(seq.request_id for seq in advanced)]

    def _launch_next(self) -> tuple[ScheduledBatch, Launched] | None:
        batch = self.scheduler.schedule()
        if batch.empty:
            return None
        self._mark_first_scheduled(batch)
        return batch, self.runner.launch(batch)

    def _launch_ahead(self, batch: ScheduledBatch, handle: Launched) -> tuple[ScheduledBatch, Launched] | None:
        """Queue the next step before this one's tokens are on the host, when the scheduler can only pick
        the same sequences again, each for one token: every sequence of the batch samples, they are all
        the running ones, none waits, none reaches its length limit, holds its KV for a transfer or wants
        logprobs (read on the host), and the pool has the blocks for all of them (so nothing is
        preempted). Each sequence gets a placeholder for the token on its way, and the next graph reads
        the real one on the device. None (nothing queued, nothing changed) otherwise."""
        graphs = self.runner.graphs
        seqs, running = batch.seqs, self.scheduler.running
        if (
            graphs is None
            or self.scheduler.waiting
            or len(handle.sampling_seqs) != len(seqs)
            or len(running) != len(seqs)
            or graphs.padded_size(len(seqs)) is None
            or any(a is not b for a, b in zip(running, seqs, strict=True))
        ):
            return None
        free_blocks = self.allocator.num_free_blocks
        for seq in seqs:
            params = seq.params
            if (
                params.logprobs is not None
                or seq.grammar is not None  # its matcher moves on the host, with each token
                or self.requests[seq.request_id].hold_kv
                or seq.num_output_tokens + 1 >= params.max_tokens
                or seq.num_tokens + 1 >= self.max_model_len
            ):
                return None
            free_blocks -= self.block_manager.blocks_for(seq.num_tokens + 1) - len(seq.block_ids)
        if free_blocks < 0:
            return None
        tokens = self.runner.sample_ahead(handle)
        self._count_computed(batch)
        for seq in seqs:
            seq.token_ids.append(PLACEHOLDER_TOKEN)
        following = self.scheduler.schedule()
        return following, self.runner.launch(following, feedback=tokens)

    def _mark_first_scheduled(self, batch: ScheduledBatch) -> None:
        now = time.monotonic()
        for seq in batch.seqs:
            request = self.requests.get(seq.request_id)
            if request is not None and request.first_scheduled_time is None:
                request.first_scheduled_time = now

    def _count_computed(self, batch: ScheduledBatch) -> None:
        for seq, count in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if not seq.is_finished:
                seq.num_computed_tokens += count
                self.block_manager.cache_computed_blocks(seq)

    def _advance(
        self, batch: ScheduledBatch, sampled_seqs: list[Sequence], sampled: SamplerOutput, counted: bool
    ) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        """Count the batch's computed tokens and append the sampled ones, skipping sequences that finished
        while the batch ran (an abort, a stop string found in the step before). counted: the next step
        was launched ahead, which counted them already and left a placeholder for each token. A token that
        ends its sequence without its text (a stop token, EOS, the length limit) finishes it here, before
        the next schedule; so does any token of a request holding its KV. The others' detokenization is
        returned to be done later. Returns (sequences that got a token, deferred (sequence, token) pairs)."""
        if not counted:
            self._count_computed(batch)
        advanced: list[Sequence] = []
        deferred: list[tuple[Sequence, int]] = []
        for seq, token, logprobs in zip(sampled_seqs, sampled.token_ids, sampled.logprobs, strict=True):
            if seq.is_finished:
                continue
            advanced.append(seq)
            if counted:
                seq.token_ids[-1] = token  # no logprobs: _launch_ahead does not take such sequences
            else:
                self._append_token(seq, token, logprobs)
            if self._finish_reason(seq, token, None)[0] or self.requests[seq.request_id].hold_kv:
                self._detokenize(seq, token)
            else:
                deferred.append((seq, token))
        return advanced, deferred

    def _append_token(self, seq: Sequence, token: int, logprobs: dict[int, float] | None) -> None:
        seq.token_ids.append(token)
        if seq.grammar is not None and not seq.grammar.accept_token(token):  # the mask let through what it forbids
            log.error("request %s: token %d breaks its grammar", seq.request_id, token)
        if seq.logprobs is not None:
            seq.logprobs.append(logprobs or {})

    def _detokenize(self, seq: Sequence, token: int) -> None:
        """Add the sequence's last token to its text and finish the sequence if that token ends it."""
        stop_string = seq.detokenizer.append(token, find_stops=seq.may_end)
        reason, stop_reason = self._finish_reason(seq, token, stop_string)
        if not reason:
            return
        if stop_string is None:
            seq.detokenizer.flush()
        request = self.requests[seq.request_id]
        if request.hold_kv:
            request.kv_block_ids = list(seq.block_ids)
            self.held_kv[seq.request_id] = request.kv_block_ids
            seq.block_ids = []  # ownership moves to held_kv, so finish() frees nothing
        self.scheduler.finish(seq, reason, stop_reason)

    def _output(self, request_id: str) -> RequestOutput:
        request = self.requests[request_id]
        output = request.output()
        if output.finished:
            del self.requests[request_id]
        return output

    def _finish_reason(self, seq: Sequence, token: int, stop_string: str | None) -> tuple[str | None, str | int | None]:
        params = seq.params
        if token in seq.end_token_ids:  # sampled only once the sequence may end
            return "stop", token if token in params.stop_token_ids else None
        if seq.grammar is not None and seq.grammar.is_terminated():  # an end the grammar allowed (ignore_eos too)
            return "stop", None
        if stop_string is not None:
            return "stop", stop_string
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None, None
