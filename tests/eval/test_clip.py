"""The CLIP score on a tiny random CLIP: equal to torchmetrics' ``CLIPScore`` and to its formula computed here
(processor -> CLIPModel's projected embeddings -> normalise -> 100 cos -> mean -> clamp at 0), the processor's
preprocessing, long prompts cut as torchmetrics cuts them, batching that changes nothing, one-line errors."""

from __future__ import annotations

import json
import re
import shutil
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchmetrics.multimodal.clip_score import CLIPScore

from vgen.eval.clip import ClipScorer, PromptTruncatedWarning, clip_mean, clip_score, load_clip
from vgen.eval.weights import sha256_of

PROMPTS = ["a red cat", "blue dog on a mat", "green", "a photo of the moon", "sushi", "a horse in a forest"]
OPENAI_MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
OPENAI_STD = np.array([0.26862954, 0.26130258, 0.27577711])


@pytest.fixture(scope="module")
def scorer(tiny_clip_dir) -> ClipScorer:
    return load_clip(tiny_clip_dir)


def random_images(n: int, seed: int = 0, size: tuple[int, int] = (40, 48)) -> np.ndarray:
    """Non-square images, so that the processor resizes and crops them."""
    return np.random.default_rng(seed).integers(0, 256, (n, *size, 3), dtype=np.uint8)


def formula(scorer: ClipScorer, images: np.ndarray, prompts: list[str]) -> np.ndarray:
    """100 cos of each pair, from the processor's inputs through CLIPModel's projections, in this test's words."""
    model, processor = scorer.model, scorer.processor
    text = processor(text=prompts, padding=True, return_tensors="pt")
    pixels = processor(images=list(images), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        image = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)
        caption = model.text_projection(model.text_model(input_ids=text["input_ids"][:, :77],
                                                         attention_mask=text["attention_mask"][:, :77]).pooler_output)
    image, caption = image / image.norm(dim=-1, keepdim=True), caption / caption.norm(dim=-1, keepdim=True)
    return (100 * (image * caption).sum(-1)).double().numpy()


class TensorFeatures(nn.Module):
    """A CLIPModel whose ``get_*_features`` return the projected embeddings as tensors (as in transformers 4), so
    that torchmetrics 1.9's ``CLIPScore`` runs on transformers 5."""

    def __init__(self, clip: nn.Module) -> None:
        super().__init__()
        self.clip, self.config = clip, clip.config

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.clip.get_image_features(pixel_values=pixel_values).pooler_output

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.clip.get_text_features(input_ids=input_ids, attention_mask=attention_mask).pooler_output


def torchmetrics_clip_score(scorer: ClipScorer, images: np.ndarray, prompts: list[str]) -> float:
    metric = CLIPScore(model_name_or_path=lambda: (TensorFeatures(scorer.model), scorer.processor))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its own warning about captions longer than 77 tokens
        metric.update(torch.from_numpy(images).permute(0, 3, 1, 2), prompts)
    return float(metric.compute())


def test_the_pair_scores_are_100_cos_of_the_projected_embeddings_and_the_set_score_their_clamped_mean(scorer):
    images = random_images(len(PROMPTS))
    expected = formula(scorer, images, PROMPTS)
    assert (expected < 0).any() and (expected > 0).any()  # the set exercises the clamp
    scores = scorer.scores(images, PROMPTS, batch_size=len(PROMPTS))
    assert scores.dtype == np.float64 and scores.shape == (len(PROMPTS),)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-5)
    # torchmetrics clamps the mean, not each pair
    assert clip_mean(scores) == pytest.approx(max(expected.mean(), 0), abs=1e-5)
    assert clip_mean(scores) < np.maximum(expected, 0).mean() - 0.1
    assert clip_mean(scores[expected < 0]) == 0.0


def test_the_score_equals_torchmetrics_clipscore(scorer):
    images = random_images(len(PROMPTS))
    prompts = PROMPTS[:-1] + ["a red cat " * 30]  # and one prompt over 77 tokens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptTruncatedWarning)
        scores = scorer.scores(images, prompts)
    assert clip_mean(scores) == pytest.approx(torchmetrics_clip_score(scorer, images, prompts), abs=1e-5)
    negative = scores < 0
    assert torchmetrics_clip_score(scorer, images[negative], list(np.array(prompts)[negative])) == 0.0


def test_the_preprocessing_is_the_clip_processors(scorer):
    images = random_images(3)
    pixels = scorer.pixel_values(images)
    # what torchmetrics hands the processor: [3, H, W] tensors
    processed = scorer.processor(images=[torch.from_numpy(im).permute(2, 0, 1) for im in images], return_tensors="pt")
    assert torch.equal(pixels, processed["pixel_values"])
    # the shortest edge resized to 32 (PIL bicubic), the center 32x32 cropped, rescaled to [0, 1] and normalised
    resized = np.stack([np.asarray(Image.fromarray(im).resize((38, 32), Image.BICUBIC)) for im in images])
    expected = ((resized[:, :, 3:35] / 255 - OPENAI_MEAN) / OPENAI_STD).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(pixels.numpy(), expected, rtol=0, atol=1e-6)


def test_a_prompt_over_77_tokens_is_cut_to_its_first_77_tokens_with_one_warning_that_counts_it(scorer):
    # a letter is a token and the start and end tokens add 2: 75 letters fit, 76 do not
    fits, cut = "x" * 75, "a red cat on " + "x" * 76
    prompts = [fits, cut, "blue dog", cut + " and more"]
    images = random_images(len(prompts))
    assert scorer.truncated(prompts) == 2
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        scores = scorer.scores(images, prompts, batch_size=2)
    assert [(r.category, str(r.message)[:40]) for r in records] == [
        (PromptTruncatedWarning, "2 of 4 prompts have more than 77 tokens,")]
    np.testing.assert_allclose(scores, formula(scorer, images, prompts), rtol=0, atol=1e-5)
    # the end token is cut too: not what the tokenizer's own truncation (which keeps it) gives
    kept_end = scorer.processor(text=[cut], truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        output = scorer.model(pixel_values=scorer.pixel_values(images[1:2]), **kept_end)
    assert abs(float(100 * (output.image_embeds * output.text_embeds).sum()) - scores[1]) > 1e-3


def test_batching_does_not_change_the_scores(scorer):
    images, prompts = random_images(5, seed=1), PROMPTS[:4] + ["x" * 90]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptTruncatedWarning)
        one, all_at_once, uneven = (scorer.scores(images, prompts, batch_size=b) for b in (1, 5, 2))
    np.testing.assert_allclose(one, all_at_once, rtol=0, atol=1e-4)
    np.testing.assert_allclose(uneven, all_at_once, rtol=0, atol=1e-4)


def test_clip_score_reports_the_value_the_counts_and_the_weights(scorer, tiny_clip_dir):
    images, prompts = random_images(3), ["a red cat", "x" * 80, "green"]
    result = clip_score(images, prompts, scorer)
    assert result["clip_score"] == pytest.approx(clip_mean(formula(scorer, images, prompts)), abs=1e-5)
    assert (result["count"], result["truncated"], result["max_tokens"]) == (3, 1, 77)
    assert result["clip"] == str(tiny_clip_dir) and result["weights"] == "model.safetensors"
    assert result["weights_sha256"] == sha256_of(tiny_clip_dir / "model.safetensors")
    assert len(result["warnings"]) == 1 and result["warnings"][0].startswith("1 of 3 prompts")
    assert json.loads(json.dumps(result)) == result
    assert clip_score(images, prompts, tiny_clip_dir)["clip_score"] == result["clip_score"]  # from the folder


@pytest.mark.parametrize(("images", "prompts", "message"), [
    (random_images(3), ["a", "b"], "3 images but 2 prompts: the CLIP score needs one prompt per image"),
    (random_images(2), ["a", "  "], "prompt 1 is empty (1 empty in all)"),
    (random_images(0), [], "no images and prompts to score"),
    (random_images(2)[..., 0], ["a", "b"], "expected uint8 images [N, H, W, 3], got uint8 (2, 40, 48)"),
])
def test_bad_pairs_are_one_line_errors(scorer, images, prompts, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        scorer.scores(images, prompts)


def test_a_folder_that_is_not_a_clip_model_is_a_one_line_error(tmp_path, tiny_clip_dir, tiny_t5_dir):
    with pytest.raises(FileNotFoundError, match=f"no CLIP folder at {tmp_path / 'none'}: give a CLIP model"):
        load_clip(tmp_path / "none")
    with pytest.raises(ValueError, match="holds a 't5' model, not CLIP \\(its config.json needs model_type 'clip'\\)"):
        load_clip(tiny_t5_dir)
    with pytest.raises(ValueError, match=f"{tmp_path} is not a CLIP model folder \\(no config.json\\)"):
        load_clip(tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_clip_dir / name, bare / name)
    with pytest.raises(ValueError, match="has no tokenizer \\(tokenizer.json or vocab.json\\)"):
        load_clip(bare)
    (bare / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        load_clip(bare)
    (bare / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json is not a model config"):
        load_clip(bare)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_scores_on_cuda_are_the_scores_on_the_cpu(scorer, tiny_clip_dir):
    images = random_images(len(PROMPTS))
    on_cuda = load_clip(tiny_clip_dir, device="cuda").scores(images, PROMPTS, batch_size=4)
    # cuDNN may run the patch convolution in TF32 (about 1e-3 relative): scores of 100 cos within 0.05
    np.testing.assert_allclose(on_cuda, scorer.scores(images, PROMPTS, batch_size=4), rtol=0, atol=0.05)
