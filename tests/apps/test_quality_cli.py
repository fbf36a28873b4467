"""``vgen quality`` and ``vgen sample`` on a text-to-image model: held-out prompts judged attribute by attribute,
beside the ceiling of their own scenes, the model's example prompts when none is given, and each prompt written
under its image."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from vgen.apps.cli import main
from vgen.data.scenes import ATTRIBUTES, EXAMPLE_PROMPTS, render_scenes
from vgen.data.shapes import SPLIT_SEEDS
from vgen.eval.quality import attribute_accuracy
from vgen.hub import from_pretrained, save_pretrained
from vgen.pipelines import load
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.training.classifier import reconstruct


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory, tiny_scene_judge):
    return save_pretrained(tiny_scene_judge, tmp_path_factory.mktemp("judge") / "judge")


def test_quality_of_a_text_model_reads_every_attribute_of_held_out_prompts(tiny_t2i_pipeline_dir, judge_dir,
                                                                            tmp_path, capsys):
    figures, grid = tmp_path / "q.json", tmp_path / "grid.png"
    code = main(["quality", "--model", str(tiny_t2i_pipeline_dir), "--judge", str(judge_dir), "--num-images", "4",
                 "--batch-size", "2", "--json", str(figures), "--grid", str(grid)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(figures.read_text())
    assert set(result["attribute_accuracy"]) == {*ATTRIBUTES, "position_row", "position_column", "joint"}
    assert all(0 <= v <= 1 for v in result["attribute_accuracy"].values())
    assert result["tokens_measured"] == 4 * 16 and result["sampling"]["cfg_scale"] == 2.0
    assert grid.is_file()
    assert "4 held-out prompts" in out and "attribute" in out and "joint" in out
    assert set(result["by_request"]["per_value"]) == set(ATTRIBUTES) and "shape by requested shape: " in out
    assert set(result["by_request"]["by_size"]) <= {"small", "large"} and "objects: shape " in out
    # the ceiling: the judge on the prompts' own scenes, drawn and through the pipeline's tokenizer
    pipe, judge = load(str(tiny_t2i_pipeline_dir)), from_pretrained(judge_dir)
    real, _, attributes = render_scenes(SPLIT_SEEDS["test"], 0, 4, 16)
    assert result["ceiling"] == {"real": attribute_accuracy(judge, real, attributes),
                                 "reconstructed": attribute_accuracy(judge, reconstruct(pipe.tokenizer, real),
                                                                     attributes)}
    assert "ceiling, the prompts' scenes through the tokenizer: shape " in out



def test_quality_of_a_text_model_skips_the_token_statistics_when_told(tiny_t2i_pipeline_dir, judge_dir, tmp_path,
                                                                     capsys):
    figures = tmp_path / "q.json"
    code = main(["quality", "--model", str(tiny_t2i_pipeline_dir), "--judge", str(judge_dir), "--num-images", "2",
                 "--no-token-stats", "--json", str(figures), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(figures.read_text())
    assert "tokens_measured" not in result and "attribute_accuracy" in result
    assert "mean_entropy_nats" not in out and "2 held-out prompts" in out


def test_a_judge_is_for_text_models_only(tiny_pipeline_dir, judge_dir, capsys):
    assert main(["quality", "--model", str(tiny_pipeline_dir), "--judge", str(judge_dir), "--num-images", "1"]) == 2
    assert "--judge reads text-to-image samples" in capsys.readouterr().err


def test_a_judge_folder_of_another_model_is_refused(tiny_t2i_pipeline_dir, tmp_path, capsys):
    other = save_pretrained(VQModel(VQConfig(codebook_size=8, ch=8, ch_mult=(1, 2), num_res_blocks=1, z_channels=4,
                                             norm_groups=4)), tmp_path / "vq")
    assert main(["quality", "--model", str(tiny_t2i_pipeline_dir), "--judge", str(other), "--num-images", "1"]) == 2
    assert "holds a VQModel, not a scene judge" in capsys.readouterr().err


def test_sample_without_a_prompt_draws_the_models_example_prompts(tiny_t2i_pipeline_dir, tmp_path, capsys):
    stats = tmp_path / "stats.json"
    code = main(["sample", "--model", str(tiny_t2i_pipeline_dir), "--out", str(tmp_path / "grid.png"),
                 "--stats", str(stats), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(stats.read_text())["prompts"] == list(EXAMPLE_PROMPTS[:3])


def test_a_text_models_grid_writes_each_prompt_under_its_image_unless_told_not_to(tiny_t2i_pipeline_dir, tmp_path):
    captioned, plain = tmp_path / "captioned.png", tmp_path / "plain.png"
    assert main(["sample", "--model", str(tiny_t2i_pipeline_dir), "--out", str(captioned), "--no-progress"]) == 0
    assert main(["sample", "--model", str(tiny_t2i_pipeline_dir), "--out", str(plain), "--no-captions",
                 "--no-progress"]) == 0
    assert Image.open(plain).size == (3 * 16, 16)  # three example prompts, 16-px images side by side
    width, height = Image.open(captioned).size
    assert width > 3 * 16 and height > width / 3  # each tile enlarged, its caption beneath


def test_a_class_models_grid_gets_class_names_when_asked(tiny_pipeline_dir, tmp_path):
    plain, named = tmp_path / "plain.png", tmp_path / "named.png"
    assert main(["sample", "--model", str(tiny_pipeline_dir), "--class-id", "1", "--out", str(plain),
                 "--no-progress"]) == 0
    assert main(["sample", "--model", str(tiny_pipeline_dir), "--class-id", "1", "--out", str(named), "--captions",
                 "--no-progress"]) == 0
    assert Image.open(named).size[1] > Image.open(plain).size[1]

