"""A request's output text decoded as its tokens arrive equals the whole decode at every length."""
import random

import pytest

from engine.tokenizer import OutputText, fast_decoder, load_tokenizer


def sentencepiece_style_tokenizer():
    """A Llama-style tokenizer built here (no download): word pieces marked with U+2581, byte
    tokens for what they lack, and a decoder that turns the marks into spaces and strips the
    first one, so a token's text depends on whether a decode starts at it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for piece in ("\u2581", "\u2581the", "\u2581a", "he", "llo", "\u2581hello", "\u00e9", "\u4e2d", "x"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("which", ["default", "qwen", "sentencepiece"])
def test_output_text_streams_and_equals_the_whole_decode_at_every_length(which, request):
    if which == "sentencepiece":
        tokenizer = sentencepiece_style_tokenizer()
    else:
        tokenizer = load_tokenizer(request.getfixturevalue("default_model_path" if which == "default"
                                                           else "tiny_qwen3_path"))
    decode = fast_decoder(tokenizer)
    vocab = tokenizer.backend_tokenizer.get_vocab_size()
    special = sorted(tokenizer.all_special_ids)
    rng = random.Random(0)
    streamed = held = whole = 0
    for _ in range(60):
        # Byte tokens (the first few hundred) split characters across tokens; special ones vanish.
        ids = [rng.choice((rng.randrange(vocab), rng.randrange(300), rng.choice(special))) for _ in range(40)]
        text = decode.output_text()
        assert isinstance(text, OutputText)
        for n in range(len(ids) + 1):
            assert text(ids[:n]) == decode.without_special(ids[:n]), (ids[:n], n)
            held += text._held
            streamed += not text._held
        whole += text._stream is None
    assert held and streamed   # both ways were taken: split characters and whole ones
    # DecodeStream gives up on byte-fallback bytes that are no UTF-8 (a ByteLevel tokenizer's
    # bytes never make it): those outputs are decoded whole, the others all stream.
    assert (whole > 0) == (which == "sentencepiece") and whole < 30, whole
    # A list that is not the one it followed (shorter) starts it again.
    text = decode.output_text()
    text([300, 301, 302])
    assert text([400]) == decode.without_special([400])


def test_output_text_held_back_decodes_only_the_held_tail(tiny_qwen3_path):
    """While characters are split across tokens, the text is decoded from the last chunks, not
    whole: what a held step decodes does not grow with the output (a random model's output holds
    bytes back at most steps)."""
    tokenizer = load_tokenizer(tiny_qwen3_path)
    decode = fast_decoder(tokenizer)
    lengths: list[int] = []
    text = OutputText(tokenizer.backend_tokenizer, lambda ids: lengths.append(len(ids)) or decode.without_special(ids))
    rng = random.Random(1)
    ids = [rng.choice((rng.randrange(150_000), rng.randrange(300))) for _ in range(400)]
    held = 0
    for n in range(1, len(ids) + 1):
        assert text(ids[:n]) == decode.without_special(ids[:n]), n
        held += text._held
    assert held > 50 and lengths and max(lengths) < 40, (held, max(lengths))


def test_one_tokens_text_is_kept_and_equals_the_tokenizers(tiny_qwen3_path):
    """A step spells each sampled token; the decoder keeps each token's text after the first time."""
    tokenizer = load_tokenizer(tiny_qwen3_path)
    decode = fast_decoder(tokenizer)
    for token in (0, 198, 151645, 9625, 198):
        assert decode([token]) == decode((token,)) == tokenizer.decode([token])
    assert decode([9625, 198]) == tokenizer.decode([9625, 198]) and len(decode._one) == 4
