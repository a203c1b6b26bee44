"""The engine on CPU tensors with every kernel forced to Triton (interpreted) produces the same greedy
tokens as with the torch references: the dispatch reaches each kernel and the kernels agree in place."""

from __future__ import annotations

from kvferry.engine import LLM, SamplingParams
from kvferry.engine.make_model import make_model
from kvferry.kernels.dispatch import BACKEND_VARIABLE

# The second prompt shares the first one's first block, so it extends a cached prefix; a 16-token step
# budget chunks the first prompt's prefill.
PROMPTS = [list(range(3, 40)), list(range(3, 19)) + [7, 9, 11]]


def test_triton_and_torch_backends_generate_the_same_tokens(tmp_path, monkeypatch):
    model_dir = make_model("qwen3", "tiny", tmp_path / "qwen3", seed=1)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv(BACKEND_VARIABLE, backend)
        llm = LLM(model_dir, dtype="float32", max_model_len=128, max_num_batched_tokens=16)
        outputs[backend] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)]
    assert outputs["triton"] == outputs["torch"]
    assert all(len(tokens) == 4 for tokens in outputs["triton"])

