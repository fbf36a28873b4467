"""``transformers``' Chameleon folders (Anole's converted checkpoint) generating as Anole's ``chameleon/inference/
chameleon.py`` does, on a tiny random folder that ``ChameleonForConditionalGeneration.save_pretrained`` wrote.

``transformers`` itself cannot generate images from such a folder: its forward sets every image-token logit to the
dtype's minimum, and its VQ model has no decoder. vgen reads the weights directly (the q/k norms are per head here)
and Chameleon's VQGAN from ``ckpts/chameleon/tokenizer/``. The oracle is the reference forward of the conftest
(``lumina_reference``, the same Chameleon blocks) and a greedy loop written here from Anole's ``ImageDecoder``: three
rows (the prompt, its image-conditioned part, ``[BOS, <racm3:break>]``) mixed as ``u + 1.2 (i - u) + 3 (c - i)``, only
image tokens allowed, ``<eoss>`` after the last code."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from vgen.models.chameleon import is_anole_folder, is_lumina_folder, load_anole
from vgen.samplers import SamplingParams, get_sampler

transformers = pytest.importorskip("transformers", reason="Anole needs transformers (pip install -e .[t2i])")

PROMPTS = ["a red star", "a big blue cat on the moon"]


@pytest.fixture(scope="module")
def anole(tiny_anole_dir):
    return load_anole(tiny_anole_dir, image_size=64)


@pytest.fixture(scope="module")
def forward(lumina_reference, tiny_anole_dir):
    """One unpadded sequence (a list of ids) -> its logits [T, text vocab], by the reference."""
    weights = load_file(tiny_anole_dir / "model.safetensors")
    hf = json.loads((tiny_anole_dir / "config.json").read_text())
    return lambda ids: lumina_reference(weights, hf, torch.tensor([ids]))[0]


def prompt_rows(cond) -> list[list[int]]:
    return [row[mask].tolist() for row, mask in zip(cond.values, cond.mask)]


def test_anole_and_lumina_folders_are_told_apart(tiny_anole_dir, tiny_lumina_dir) -> None:
    assert is_anole_folder(tiny_anole_dir) and not is_lumina_folder(tiny_anole_dir)
    assert is_lumina_folder(tiny_lumina_dir) and not is_anole_folder(tiny_lumina_dir)


def test_prompt_is_anole_text2image_and_null_is_bos_begin_image(anole) -> None:
    tok, config = anole.text_tokenizer, anole.model.config
    vocab = tok.get_vocab()
    assert (config.head_tokens, config.row_end, config.tail) == ((vocab["<racm3:break>"],), (), (vocab["<eoss>"],))
    assert config.grid == (4, 4) and anole.defaults == {"cfg_scale": 3.0, "temperature": 0.7, "top_p": 0.9}
    cond = anole.condition(PROMPTS)
    assert prompt_rows(cond)[0] == [vocab["<s>"], *tok.encode("a red star", add_special_tokens=False),
                                    vocab["<reserved08706>"], vocab["<racm3:break>"]]
    null = anole.model.null_condition(cond)
    assert null.values.tolist() == [[vocab["<s>"], vocab["<racm3:break>"]]] * 2 and bool(null.mask.all())


@torch.no_grad()
def test_teacher_forced_logits_equal_the_reference_and_transformers_masks_them(anole, forward, tiny_anole_dir) -> None:
    model = anole.model
    cond = anole.condition(PROMPTS)
    codes = torch.randint(4, (2, model.num_tokens), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(2)
    logits = torch.cat([model.prefill(cond, cache)[:, None], model.decode(codes[:, :-1], cache)], dim=1)
    for b, prompt in enumerate(prompt_rows(cond)):
        seq = prompt + model.code_ids[codes[b]].tolist()
        expected = forward(seq)[len(prompt) - 1:-1][:, model.code_ids]
        torch.testing.assert_close(logits[b], expected, rtol=1e-4, atol=1e-4)
    tf = transformers.ChameleonForConditionalGeneration.from_pretrained(tiny_anole_dir).eval()
    out = tf(torch.tensor([seq])).logits[0][:, model.code_ids]
    assert bool((out == torch.finfo(out.dtype).min).all())  # transformers' forward: no image token can be drawn


def anole_greedy(forward, prompt: list[int], image_ids: list[int], bos: int, begin: int, end: int,
                 num_codes: int) -> list[int]:
    """Anole's ``ImageDecoder`` with ``greedy=True``: the three rows' logits mixed (text 3.0, image 1.2), only image
    tokens allowed, argmax; ``<eoss>`` once ``num_codes`` codes are drawn."""
    allowed = set(image_ids) | {bos, begin, end}
    rows = [list(prompt), [i for i in prompt if i in allowed], [bos, begin]]
    out = []
    while len(out) < num_codes:
        full, image, uncond = (forward(row)[-1] for row in rows)
        mixed = uncond + 1.2 * (image - uncond) + 3.0 * (full - image)
        only = torch.full_like(mixed, float("-inf")).index_fill(0, torch.tensor(image_ids), 0.0)
        token = int((mixed + only).argmax())
        out.append(token)
        for row in rows:
            row.append(token)
    return out + [end]


@torch.no_grad()
def test_greedy_ar_equals_anole_image_decoder(anole, forward) -> None:
    model, config = anole.model, anole.model.config
    cond = anole.condition(PROMPTS)
    params = SamplingParams(temperature=0.0, cfg_scale=config.cfg_scale)
    tokens = get_sampler("ar").sample(model, cond, params, generator=torch.Generator().manual_seed(0)).tokens
    vocab = anole.text_tokenizer.get_vocab()
    for b, prompt in enumerate(prompt_rows(cond)):
        expected = anole_greedy(forward, prompt, model.code_ids.tolist(), vocab["<s>"], vocab["<racm3:break>"],
                                vocab["<eoss>"], model.num_tokens)
        assert config.layout.sequence(model.code_ids[tokens[b:b + 1]])[0, 1:].tolist() == expected
