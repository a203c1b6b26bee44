"""Engine settings: one frozen model of everything `LLM(...)` and the nodes accept."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvferry.engine.devices import resolve_device

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Weight formats a 16/32-bit checkpoint can be quantized to at load (engine/weights.py QUANTIZERS).
QUANTIZATIONS = ("fp8", "int8", "int4")
# Those computed by CPU kernels alone (kvferry's C linear kernel, torch's CPU int4 matmul).
CPU_QUANTIZATIONS = ("int8", "int4")


@dataclass(frozen=True)
class EngineArgs:
    dtype: str = "auto"  # "auto": the checkpoint's dtype on CUDA, float32 on the CPU
    # "fp8": linear layers in FP8 e4m3 with per-channel scales, quantized at load from a 16/32-bit checkpoint
    # (an FP8 checkpoint is read as FP8 either way). Activations and the KV cache keep `dtype`.
    # "int8" (CPU only): linear layers and the LM head in int8 with per-channel scales, multiplied by kvferry's
    # C kernel against the activations quantized to int8 in blocks of 32, as llama.cpp's Q8_0 (kernels/int8_linear.py).
    # "int4" (CPU only): linear layers (not the LM head) in 4 bits, a scale and a zero per 32 weights of a row
    # (Q4_1's layout), multiplied in bfloat16 (kernels/int4_linear.py); fastest with dtype "bfloat16".
    quantization: str | None = None
    device: str = "auto"  # "auto": cuda:0 when a GPU is visible, else cpu; "cuda:N": GPU N (checked at start)
    max_model_len: int | None = None  # default: the model's max_position_embeddings, capped at 8192
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None  # default: as many as kv_cache_bytes holds
    kv_cache_bytes: int | None = None  # default: from gpu_memory_fraction on CUDA, 1 GiB on the CPU
    # The share of the GPU's total memory this engine may fill, weights, activations and KV pool together
    # (everything already in use on the GPU, other processes too, counts against it, as in vLLM).
    gpu_memory_fraction: float = 0.9
    enforce_eager: bool = False  # True: no CUDA graphs for decode batches
    enable_prefix_caching: bool = True
    served_model_name: str | None = None  # also the prefix-hash salt; default: the folder's name
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS} or None, got {self.quantization!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.gpu_memory_fraction <= 1:
            raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be at least 2, got {self.num_kv_blocks}")

    def resolve_device(self) -> torch.device:
        return resolve_device(self.device, torch.cuda.device_count())

    def cuda_graph_batch_sizes(self) -> list[int]:
        """Decode batch sizes captured as CUDA graphs; a batch is padded up to the next one. Powers of two up
        to 8, where padding would waste the largest share, then every 16 up to 128, then every 32."""
        if self.enforce_eager:
            return []
        sizes = [1, 2, 4, 8, *range(16, 129, 16), *range(160, 1025, 32)]
        capped = [size for size in sizes if size < self.max_num_seqs]
        return [*capped, self.max_num_seqs]

    def quantize_at_load(self, checkpoint_quantization: str | None, device: torch.device) -> str | None:
        """The format the loader turns the checkpoint's 16/32-bit linear weights into, or None to keep them
        (no quantization asked for, or the checkpoint already stores that format)."""
        if self.quantization is None or self.quantization == checkpoint_quantization:
            return None
        if checkpoint_quantization is not None:
            raise ValueError(f"the checkpoint's weights are {checkpoint_quantization}; they cannot be requantized to "
                             f"{self.quantization}")  # fmt: skip
        if self.quantization in CPU_QUANTIZATIONS and device.type != "cpu":
            raise ValueError(f"{self.quantization} weights run on the CPU only; on {device} use quantization 'fp8'")
        return self.quantization

    def resolve_dtype(self, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        if device.type == "cpu":
            return torch.float32
        return DTYPES.get(checkpoint_dtype, torch.bfloat16)
