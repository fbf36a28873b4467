"""Lossless samplers on Lumina-mGPT (a tiny random folder, 32-px images of 2 x 2 codes with a new-line token after
each row): whole images drawn by ``ar`` and ``mcsjd`` (a window across the row end) follow the law of Lumina's own
forward pass under its inference solver's rule (guidance on raw logits against the context that starts at
``<racm3:break>``, then top-k over the image tokens), a chi-square test; greedy speculative equals greedy AR."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from safetensors.torch import load_file

from vgen.models.conditioning import PrefixCondition
from vgen.samplers import SamplingParams, get_sampler

pytest.importorskip("transformers", reason="Lumina-mGPT needs transformers (pip install -e .[t2i])")

from vgen.models.chameleon import LoadedLumina, load_lumina  # noqa: E402

ALL_IMAGES = torch.tensor(list(itertools.product(range(4), repeat=4)))  # 256 x 4 codes
RULE = SamplingParams(cfg_scale=3.0, top_k=3)  # Lumina's rule; a top-k that bites on 4 codes


@pytest.fixture(scope="module")
def small(tiny_lumina_dir) -> LoadedLumina:
    return load_lumina(tiny_lumina_dir, image_size=32, max_prompt_tokens=40)


@pytest.fixture(scope="module")
def lumina(tiny_lumina_dir) -> LoadedLumina:
    return load_lumina(tiny_lumina_dir, image_size=64, max_prompt_tokens=40)


@torch.no_grad()
def lumina_law(lumina: LoadedLumina, reference, folder, prompt: list[int], cfg: float, top_k: int) -> torch.Tensor:
    """P(image) [256] under Lumina: each code's logits from the reference forward of the prompt (and of the
    unconditional header) followed by the image so far, new lines written in, merged as ``u + cfg (c - u)`` over
    the raw logits, restricted to the image tokens, top-k kept."""
    w, hf = load_file(folder / "model.safetensors"), json.loads((folder / "config.json").read_text())
    ids, newline = lumina.model.code_ids[ALL_IMAGES], lumina.model.config.row_end[0]
    body = torch.cat([ids[:, :2], torch.full((256, 1), newline), ids[:, 2:3]], dim=1)  # c0 c1 NL c2
    reads = [-5, -4, -2, -1]  # the positions before c0, c1, c2 (after the new line), c3
    logits = []
    for context in (prompt, prompt[-3:]):
        out = reference(w, hf, torch.cat([torch.tensor(context).expand(256, -1), body], dim=1))
        logits.append(out[:, reads][..., lumina.model.code_ids])
    scores = logits[1] + cfg * (logits[0] - logits[1])
    scores = scores.masked_fill(scores < scores.topk(top_k, dim=-1).values[..., -1:], float("-inf"))
    return scores.softmax(-1).gather(-1, ALL_IMAGES[..., None])[..., 0].prod(-1)


def image_counts(run_sampler, lumina: LoadedLumina, sampler, params: SamplingParams, rows: int = 3000) -> torch.Tensor:
    cond = lumina.condition(["a red star"])
    cond = PrefixCondition(cond.values.expand(rows, -1).clone(), cond.mask.expand(rows, -1).clone())
    tokens = run_sampler(sampler, lumina.model, cond, params, tokenizer=lumina.tokenizer).tokens
    return torch.bincount((tokens * torch.tensor([64, 16, 4, 1])).sum(-1), minlength=256).float()


@pytest.mark.parametrize(("sampler", "kwargs"), [("ar", {}), ("mcsjd", dict(window=3))])
def test_lossless_samplers_follow_lumina_law(chi_square_p, small, lumina_reference, tiny_lumina_dir, run_sampler,
                                             sampler, kwargs) -> None:
    cond = small.condition(["a red star"])
    prompt = cond.values[0][cond.mask[0]].tolist()
    probs = lumina_law(small, lumina_reference, tiny_lumina_dir, prompt, RULE.cfg_scale, RULE.top_k)
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))
    assert probs.max() < 0.5 and int((probs == 0).sum()) > 0  # informative, and top-k removes images
    counts = image_counts(run_sampler, small, get_sampler(sampler, **kwargs), RULE)
    assert counts[probs == 0].sum() == 0
    assert chi_square_p(counts, probs) > 1e-3


@pytest.mark.parametrize(("name", "kwargs"), [("sjd", dict(window=5)), ("speculative", dict(accept="match", window=5))])
def test_greedy_speculative_equals_greedy_ar_on_lumina(lumina, run_sampler, name, kwargs) -> None:
    cond = lumina.condition(["a red star", "a big blue cat on the moon"])
    params = SamplingParams(temperature=0.0, cfg_scale=3.0)
    expected = run_sampler("ar", lumina.model, cond, params, tokenizer=lumina.tokenizer).tokens
    out = run_sampler(get_sampler(name, **kwargs), lumina.model, cond, params, tokenizer=lumina.tokenizer)
    assert torch.equal(out.tokens, expected)
    assert out.stats.forward_passes <= lumina.model.num_tokens
