import pytest

from kvferry.engine import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logprobs": -1}, "logprobs"),
    ],
)
def test_invalid_values_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        SamplingParams(**kwargs)


def test_stop_string_is_normalized_to_a_list():
    assert SamplingParams(stop="END").stop_strings == ["END"]
    assert SamplingParams(stop=["a", ""]).stop_strings == ["a"]
    assert SamplingParams(temperature=0).greedy
