"""How many spans the Triton decode attention cuts a context into, on a 132-multiprocessor card (an H100 or
H200), without the card: the count is arithmetic on the shape."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from kvferry.kernels import triton_decode_attention  # noqa: E402 - after the skip
from kvferry.kernels.triton_decode_attention import MAX_SPLITS, choose_num_splits  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(triton_decode_attention, "device_multiprocessors", lambda device: 132)


@pytest.mark.parametrize(
    ("batch", "context", "splits"),
    [
        (1, 16384, 32),  # 2 x 132 / 8 kv heads = 33, rounded down to a power of two
        (1, 32768, 32),
        (1, 1024, 4),  # no span under 256 tokens
        (1, 100, 1),
        (16, 16384, 2),  # 264 // 128 programs
        (64, 4096, 1),
        (256, 1024, 1),
    ],
)
def test_about_two_programs_per_multiprocessor_as_a_power_of_two(hopper, batch, context, splits):
    assert choose_num_splits(batch, 8, context, CPU) == splits


def test_every_count_is_a_power_of_two_within_the_cap(hopper):
    for batch in range(1, 70):
        for kv_heads in (1, 2, 4, 8):
            for context in (16, 300, 4096, 65536, 1 << 20):
                splits = choose_num_splits(batch, kv_heads, context, CPU)
                assert 1 <= splits <= MAX_SPLITS and splits & (splits - 1) == 0, (batch, kv_heads, context, splits)
