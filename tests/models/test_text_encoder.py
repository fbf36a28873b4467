"""The T5 text encoder against transformers' own encoder on a tiny random T5 folder: LlamaGen's left padding,
batch independence, truncation with its warning, and the one-line errors for bad folders and inputs."""

from __future__ import annotations

import io
import json
import shutil
import sys
import warnings

import pytest
import torch

from vgen.models.text_encoder import (
    PromptTruncatedWarning,
    T5TextEncoder,
    check_caption_dim,
    resolve_t5_folder,
)

transformers = pytest.importorskip("transformers", reason="the text encoder needs transformers "
                                                          "(pip install -e '.[t2i]')")

SHORT = "a red square"
LONG = "a photo of the astronaut riding a horse in the forest next to a river"


@pytest.fixture(scope="module")
def encoder(tiny_t5_dir) -> T5TextEncoder:
    return T5TextEncoder.from_pretrained(tiny_t5_dir)


@pytest.fixture
def t5_copy(tiny_t5_dir, tmp_path):
    """A writable copy of the tiny T5 folder, to break."""
    return shutil.copytree(tiny_t5_dir, tmp_path / "t5")


def test_shapes_dtypes_and_caption_dim(encoder):
    embeddings, mask = encoder.encode([SHORT, LONG])
    assert encoder.max_length == 120
    assert encoder.caption_dim == 32
    assert embeddings.shape == (2, 120, 32) and embeddings.dtype == torch.float32
    assert mask.shape == (2, 120) and mask.dtype == torch.bool
    # "a red square" is 3 word pieces + </s>
    assert mask.sum(dim=1).tolist()[0] == 4


def test_left_padding_is_the_encoder_output_rotated_to_the_end(encoder, tiny_t5_dir):
    """Reference: transformers' tokenizer and T5EncoderModel, right-padded to 120; each row's n valid outputs
    move to the last n positions, the rest is zero, and the mask is the flipped right-padded mask."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_t5_dir, local_files_only=True)
    model = transformers.T5EncoderModel.from_pretrained(tiny_t5_dir, local_files_only=True).eval()
    batch = tokenizer([SHORT, LONG], max_length=120, padding="max_length", truncation=True, return_tensors="pt")
    with torch.no_grad():
        reference = model(**batch).last_hidden_state

    embeddings, mask = encoder.encode([SHORT, LONG])
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    assert lengths[0] != lengths[1]
    assert torch.equal(mask, batch["attention_mask"].flip(-1).bool())
    for row, n in enumerate(lengths):
        torch.testing.assert_close(embeddings[row, 120 - n:], reference[row, :n], rtol=0, atol=1e-6)
        assert torch.count_nonzero(embeddings[row, :120 - n]) == 0


def test_a_prompt_does_not_depend_on_the_others_in_its_batch(encoder):
    together, together_mask = encoder.encode([SHORT, LONG])
    for row, prompt in enumerate([SHORT, LONG]):
        alone, alone_mask = encoder.encode([prompt])
        assert torch.equal(alone_mask[0], together_mask[row])
        torch.testing.assert_close(alone[0], together[row], rtol=0, atol=1e-5)


def test_prompts_are_lower_cased_and_stripped(encoder):
    torch.testing.assert_close(encoder.encode(["  A Red SQUARE "])[0], encoder.encode([SHORT])[0], rtol=0, atol=0)


def test_a_single_string_is_one_prompt(encoder):
    torch.testing.assert_close(encoder.encode(SHORT)[0], encoder.encode([SHORT])[0], rtol=0, atol=0)


def test_truncation_warns_with_the_dropped_text_and_keeps_the_start(tiny_t5_dir):
    """max_length 6 keeps 5 word pieces and </s>: the long prompt encodes as its first five words."""
    short_encoder = T5TextEncoder.from_pretrained(tiny_t5_dir, max_length=6)
    with pytest.warns(PromptTruncatedWarning) as record:
        embeddings, mask = short_encoder.encode([SHORT, LONG])
    assert len(record) == 1
    message = str(record[0].message)
    assert "prompt 1 " in message and "keeps 5" in message
    assert "dropped: 'riding a horse in the forest next to a river'" in message
    assert record[0].filename == __file__

    first_words = " ".join(LONG.split()[:5])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly max_length tokens: nothing is cut
        kept, kept_mask = short_encoder.encode([first_words])
    assert mask[1].all() and kept_mask[0].all()
    torch.testing.assert_close(embeddings[1], kept[0], rtol=0, atol=1e-6)


def test_to_moves_dtype(tiny_t5_dir):
    encoder = T5TextEncoder.from_pretrained(tiny_t5_dir, dtype=torch.bfloat16)
    assert encoder.dtype == torch.bfloat16 and encoder.device == torch.device("cpu")
    assert encoder.encode([SHORT])[0].dtype == torch.bfloat16
    assert encoder.to(dtype=torch.float32).encode([SHORT])[0].dtype == torch.float32


def test_llamagen_layout_with_a_flan_t5_xl_subfolder_is_found(tiny_t5_dir, tmp_path):
    shutil.copytree(tiny_t5_dir, tmp_path / "flan-t5-xl")
    assert resolve_t5_folder(tmp_path) == tmp_path / "flan-t5-xl"


def test_missing_folder_says_where_to_put_flan_t5_xl(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no T5 folder at .*nowhere: put the FLAN-T5-XL files there.*"
                                                r"google/flan-t5-xl"):
        T5TextEncoder.from_pretrained(tmp_path / "nowhere")


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        T5TextEncoder.from_pretrained(tmp_path)


def test_folder_of_another_model_type_is_refused(t5_copy):
    (t5_copy / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="holds a 'llama' model, not a T5 one"):
        T5TextEncoder.from_pretrained(t5_copy)


def test_config_that_is_not_json_is_refused(t5_copy):
    (t5_copy / "config.json").write_text("not json")
    with pytest.raises(ValueError, match="is not a model config"):
        T5TextEncoder.from_pretrained(t5_copy)


def test_folder_without_tokenizer_is_refused(t5_copy):
    (t5_copy / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"has no tokenizer \(tokenizer.json or spiece.model\)"):
        T5TextEncoder.from_pretrained(t5_copy)


def test_folder_without_weights_is_refused(t5_copy):
    (t5_copy / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        T5TextEncoder.from_pretrained(t5_copy)


def test_missing_transformers_says_which_extra_to_install(tiny_t5_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(ImportError, match=r'needs transformers: pip install -e "\.\[t2i\]"'):
        T5TextEncoder.from_pretrained(tiny_t5_dir)


def test_empty_prompt_list_is_refused(encoder):
    with pytest.raises(ValueError, match="no prompt given"):
        encoder.encode([])


def test_caption_dim_mismatch_names_both_numbers(encoder):
    check_caption_dim(encoder.caption_dim, 32)
    with pytest.raises(ValueError, match=r"the text encoder gives 32-dim caption features but the model expects "
                                         r"caption_dim=2048"):
        check_caption_dim(encoder.caption_dim, 2048)


def test_a_tokenizer_given_only_as_spiece_model_loads(t5_copy):
    """A folder with spiece.model and no tokenizer.json (as older T5 downloads have it) needs sentencepiece and
    protobuf, both in the t2i extra: a sentencepiece model trained here encodes like the words it was trained on."""
    spm = pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf", reason="reading spiece.model needs protobuf (pip install -e '.[t2i]')")
    model = io.BytesIO()
    sentences = [SHORT, LONG, "a blue circle on a green background", "the cat sat on the mat"] * 10
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=40,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>",
                                   eos_piece="</s>", unk_piece="<unk>", minloglevel=2)
    (t5_copy / "tokenizer.json").unlink()
    (t5_copy / "spiece.model").write_bytes(model.getvalue())
    (t5_copy / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))

    encoder = T5TextEncoder.from_pretrained(t5_copy)
    pieces = spm.SentencePieceProcessor(model_proto=model.getvalue()).encode(SHORT)
    embeddings, mask = encoder.encode([SHORT])
    assert mask[0].sum() == len(pieces) + 1  # </s> appended
    assert embeddings.shape == (1, 120, 32)
