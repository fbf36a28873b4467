"""The word-level text encoder: prompts in, left-padded caption features and mask out, as T5's are."""

from __future__ import annotations

import pytest
import torch

from vgen.data.scenes import caption_vocabulary
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.text_encoder import PromptTruncatedWarning
from vgen.models.word_encoder import END, PAD, UNKNOWN, UnknownWordsWarning, WordEncoderConfig, WordTextEncoder

CONFIG = WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2, max_length=8)


@pytest.fixture(scope="module")
def encoder() -> WordTextEncoder:
    torch.manual_seed(0)
    return WordTextEncoder(CONFIG).eval()


def test_tokenize_ends_each_prompt_and_pads_on_the_right(encoder):
    ids = encoder.tokenize(["A red star", "blue ring"])
    index = encoder.index
    assert ids[0, :4].tolist() == [index["a"], index["red"], index["star"], index[END]]
    assert ids[0, 4:].tolist() == [index[PAD]] * 4
    assert ids[1, :3].tolist() == [index["blue"], index["ring"], index[END]]


def test_unknown_words_read_as_unknown_with_a_warning_naming_them(encoder):
    with pytest.warns(UnknownWordsWarning, match="giraffe, zebra"):
        ids = encoder.tokenize("a zebra giraffe")
    assert ids[0, 1].item() == ids[0, 2].item() == encoder.index[UNKNOWN]


UNKNOWN_SAID = "prompt 0: words this model does not know, read as unknown: "


@pytest.mark.parametrize(("prompt", "said"), [
    ("a bleu star", UNKNOWN_SAID + "bleu (did you mean 'blue'?)"),
    ("a red stars", UNKNOWN_SAID + "stars (say 'star'); stars: the model draws a single shape"),
    ("three red crosses", UNKNOWN_SAID + "crosses (say 'cross'), three; crosses, three: the model draws a single "
                                         "shape"),
    ("2 red star", "prompt 0: 2: the model draws a single shape (digits are not read)"),
])
def test_the_warning_says_what_to_write_instead(encoder, prompt, said):
    with pytest.warns(UnknownWordsWarning) as caught:
        encoder.tokenize(prompt)
    assert [str(w.message) for w in caught] == [said]


def test_long_prompts_are_cut_saying_what_was_dropped(encoder):
    dropped = "13 words .* keeps 7: .* dropped: 'left corner on a white background'"
    with pytest.warns(PromptTruncatedWarning, match=dropped):
        ids = encoder.tokenize("a small red star in the top left corner on a white background")
    assert ids.shape == (1, 8) and ids[0, -1].item() == encoder.index[END]


def test_features_are_left_padded_with_their_mask(encoder):
    values, mask = encoder.encode(["a red star", "a small blue ring at top"])
    assert values.shape == (2, 8, 16)
    assert mask.tolist() == [[False] * 4 + [True] * 4, [False] + [True] * 7]
    assert torch.all(values[0, :4] == 0)


def test_a_prompt_means_the_same_alone_or_beside_a_longer_one(encoder):
    alone, _ = encoder.encode(["a red star"])
    together, _ = encoder.encode(["a red star", "a small blue ring at top"])
    torch.testing.assert_close(alone[0], together[0])
    other, _ = encoder.encode(["a blue star"])
    assert not torch.allclose(alone, other)


def test_no_prompt_is_refused(encoder):
    with pytest.raises(ValueError, match="no prompt"):
        encoder.tokenize([])


def test_saves_and_loads_with_its_vocabulary(encoder, tmp_path):
    loaded = from_pretrained(save_pretrained(encoder, tmp_path / "text_encoder"))
    assert loaded.config == CONFIG
    torch.testing.assert_close(loaded.encode("a red star")[0], encoder.encode("a red star")[0])


def test_a_vocabulary_must_start_with_the_special_words():
    with pytest.raises(ValueError, match="must start with"):
        WordEncoderConfig(vocabulary=("a", "b"))
