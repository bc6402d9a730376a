"""Image requests for engines that expand placeholders themselves (vLLM, SGLang): one
placeholder per image."""

from types import SimpleNamespace

from rl_rollout.backends.multimodal import collapse_placeholders, placeholder_token_ids


def test_each_run_of_placeholders_becomes_one_token():
    pad, start, end = 9, 7, 8
    ids = [1, start, pad, pad, pad, pad, end, 2, start, pad, pad, end, pad, 3, 3]
    assert collapse_placeholders(ids, (pad,)) == [1, start, pad, end, 2, start, pad, end, pad, 3, 3]
    assert collapse_placeholders([1, 2, 2, 3], (pad,)) == [1, 2, 2, 3]  # other repeats stay


def test_placeholder_ids_of_a_config():
    assert placeholder_token_ids(SimpleNamespace(image_token_id=5, video_token_id=6)) == (5, 6)
    assert placeholder_token_ids(SimpleNamespace()) == ()
