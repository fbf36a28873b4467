"""``vgen quality`` and ``vgen sample`` on a text-to-image model: held-out prompts judged attribute by attribute,
and the model's example prompts when none is given."""

from __future__ import annotations

import json

import pytest
import torch

from vgen.apps.cli import main
from vgen.data.scenes import ATTRIBUTES, caption_vocabulary
from vgen.hub import save_pretrained
from vgen.models.classifier import AttributeClassifier
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.pipelines import ImagePipeline, PipelineInfo
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.training.scene_judge import SCENE_JUDGE

EXAMPLES = ["a red star", "a small blue ring at the top"]


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny random text-to-image pipeline folder (16-px images, 4 x 4 codes) with example prompts, and a random
    scene judge folder."""
    torch.manual_seed(0)
    gpt = LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, block_size=16,
                                model_type="t2i", caption_dim=16, cls_token_num=8))
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    words = WordTextEncoder(WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2,
                                                        max_length=8))
    info = PipelineInfo(name="toy-t2i", image_size=16, defaults={"cfg_scale": 3.0}, example_prompts=EXAMPLES)
    root = tmp_path_factory.mktemp("t2i")
    folder = ImagePipeline(gpt, vq, info, text_encoder=words).save_pretrained(root / "toy-t2i")
    judge = save_pretrained(AttributeClassifier(SCENE_JUDGE), root / "judge")
    return folder, judge


def test_quality_of_a_text_model_reads_every_attribute_of_held_out_prompts(text_model, tmp_path, capsys):
    folder, judge = text_model
    figures, grid = tmp_path / "q.json", tmp_path / "grid.png"
    with pytest.warns(UserWarning):  # held-out prompts are longer than the toy encoder's 8 positions
        code = main(["quality", "--model", str(folder), "--judge", str(judge), "--num-images", "4",
                     "--batch-size", "2", "--json", str(figures), "--grid", str(grid)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(figures.read_text())
    assert set(result["attribute_accuracy"]) == {*ATTRIBUTES, "joint"}
    assert all(0 <= v <= 1 for v in result["attribute_accuracy"].values())
    assert result["tokens_measured"] == 4 * 16 and result["sampling"]["cfg_scale"] == 3.0
    assert grid.is_file()
    assert "4 held-out prompts" in out and "attribute" in out and "joint" in out


def test_a_judge_is_for_text_models_only(tiny_pipeline_dir, text_model, capsys):
    _, judge = text_model
    assert main(["quality", "--model", str(tiny_pipeline_dir), "--judge", str(judge), "--num-images", "1"]) == 2
    assert "--judge reads text-to-image samples" in capsys.readouterr().err


def test_a_judge_folder_of_another_model_is_refused(text_model, tmp_path, capsys):
    folder, _ = text_model
    other = save_pretrained(VQModel(VQConfig(codebook_size=8, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=4,
                                             norm_groups=4)), tmp_path / "vq")
    assert main(["quality", "--model", str(folder), "--judge", str(other), "--num-images", "1"]) == 2
    assert "holds a VQModel, not a scene judge" in capsys.readouterr().err


def test_sample_without_a_prompt_draws_the_models_example_prompts(text_model, tmp_path, capsys):
    folder, _ = text_model
    stats = tmp_path / "stats.json"
    code = main(["sample", "--model", str(folder), "--out", str(tmp_path / "grid.png"), "--stats", str(stats),
                 "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(stats.read_text())["prompts"] == EXAMPLES
