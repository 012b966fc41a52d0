"""A request's output text decoded as its tokens arrive equals the whole decode at every length."""
import random

import pytest

from engine.tokenizer import OutputText, fast_decoder, load_tokenizer


@pytest.mark.parametrize("which", ["default", "qwen"])
def test_output_text_streams_and_equals_the_whole_decode_at_every_length(which, request):
    folder = request.getfixturevalue("default_model_path" if which == "default" else "tiny_qwen3_path")
    tokenizer = load_tokenizer(folder)
    decode = fast_decoder(tokenizer)
    vocab = tokenizer.backend_tokenizer.get_vocab_size()
    special = sorted(tokenizer.all_special_ids)
    rng = random.Random(0)
    streamed = held = 0
    for _ in range(60):
        # Byte tokens (the first few hundred) split characters across tokens; special ones vanish.
        ids = [rng.choice((rng.randrange(vocab), rng.randrange(300), rng.choice(special))) for _ in range(40)]
        text = decode.output_text()
        assert isinstance(text, OutputText)
        for n in range(len(ids) + 1):
            assert text(ids[:n]) == decode.without_special(ids[:n]), (ids[:n], n)
            held += text._held
            streamed += not text._held
    assert held and streamed   # both ways were taken: split characters and whole ones
    # A list that is not the one it followed (shorter) starts it again.
    text = decode.output_text()
    text([300, 301, 302])
    assert text([400]) == decode.without_special([400])


def test_one_tokens_text_is_kept_and_equals_the_tokenizers(tiny_qwen3_path):
    """A step spells each sampled token; the decoder keeps each token's text after the first time."""
    tokenizer = load_tokenizer(tiny_qwen3_path)
    decode = fast_decoder(tokenizer)
    for token in (0, 198, 151645, 9625, 198):
        assert decode([token]) == decode((token,)) == tokenizer.decode([token])
    assert decode([9625, 198]) == tokenizer.decode([9625, 198]) and len(decode._one) == 4
