import subprocess
import sys
from array import array

from kvferry.kvcache import hash_block_tokens, hash_prompt_blocks
from kvferry.kvcache.block_hash import ROOT_PARENT


def test_chain_links_each_block_to_its_parent():
    tokens = list(range(40))
    hashes = hash_prompt_blocks(tokens, 16)
    assert len(hashes) == 2  # the 8 trailing tokens form no full block
    assert hashes[0] == hash_block_tokens(ROOT_PARENT, tokens[:16])
    assert hashes[1] == hash_block_tokens(hashes[0], tokens[16:32])


def test_same_block_under_another_prefix_hashes_differently():
    a = hash_prompt_blocks([1] * 16 + [7] * 16, 16)
    b = hash_prompt_blocks([2] * 16 + [7] * 16, 16)
    assert a[1] != b[1]


def test_salt_separates_models():
    assert hash_prompt_blocks(list(range(16)), 16, "model-a") != hash_prompt_blocks(list(range(16)), 16, "model-b")


def test_hash_is_stable_across_processes():
    # Python's built-in hash is randomized per process; the block hash must not be.
    code = "from kvferry.kvcache import hash_prompt_blocks; print(hash_prompt_blocks(list(range(32)), 16, 's'))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout for _ in range(2)}
    assert runs == {f"{hash_prompt_blocks(list(range(32)), 16, 's')}\n"}


def test_hashes_keep_their_values():
    # Values the numpy implementation gave (tokens as native int64 bytes): a change of how tokens become
    # bytes would make every prefix index entry written before it a miss.
    assert hash_prompt_blocks(list(range(40)), 16, "tiny") == [9183729562198827442, 9192747109728761586]
    assert hash_block_tokens(7, [151643, 0, 2**31, 5], "m") == 10907134350734173220


def test_token_arrays_hash_as_their_values():
    # The engine's token lists hold ints; an int32 array of the same tokens must chain the same.
    tokens = list(range(16))
    assert hash_block_tokens(ROOT_PARENT, array("i", tokens)) == hash_block_tokens(ROOT_PARENT, tokens)
