"""The judge of prompt faithfulness: mirrored places stay right, and the recipe trains and exports a judge."""

from __future__ import annotations

import torch

from vgen.data.scenes import POSITIONS, Scene, render_scene
from vgen.data.shapes import image_rng, to_tensor
from vgen.hub import from_pretrained
from vgen.models.classifier import AttributeClassifier
from vgen.training.scene_judge import SceneJudgeRecipe, mirror, train_scene_judge
from vgen.training.trainer import TrainConfig


def test_mirroring_an_image_mirrors_its_place_label():
    images = torch.arange(4.0).reshape(1, 1, 2, 2).expand(9, 3, 2, 2)
    attributes = torch.zeros(9, 5, dtype=torch.long)
    attributes[:, 3] = torch.arange(9)
    flipped, labels = mirror(images, attributes, horizontal=True, vertical=False)
    assert [POSITIONS[i] for i in labels[:3, 3]] == ["top right", "top", "top left"]
    assert torch.equal(flipped[0, 0], torch.tensor([[1.0, 0.0], [3.0, 2.0]]))
    _, labels = mirror(images, attributes, horizontal=False, vertical=True)
    assert POSITIONS[int(labels[0, 3])] == "bottom left" and POSITIONS[int(labels[4, 3])] == "centre"
    assert torch.equal(labels[:, :3], attributes[:, :3])


def test_a_mirrored_scene_is_the_scene_with_the_mirrored_place():
    scene = Scene(0, 0, 0, POSITIONS.index("top left"), 0)
    image = to_tensor(render_scene(scene, image_rng(0, 0)))[None]
    attrs = torch.tensor([[0, 0, 0, POSITIONS.index("top left"), 0]])
    flipped, labels = mirror(image, attrs, horizontal=True, vertical=True)
    assert POSITIONS[int(labels[0, 3])] == "bottom right"
    red = flipped[0, 0] - flipped[0, 1:].amax(0) > 0.5  # the red shape's pixels on white
    ys, xs = torch.nonzero(red, as_tuple=True)
    assert xs.float().mean() > 40 and ys.float().mean() > 40


def test_recipe_trains_and_exports_a_judge_with_held_out_figures(tmp_path, tiny_vq_dir):
    cfg = TrainConfig(steps=2, lr=1e-3, warmup_steps=1, bf16=False)
    recipe = SceneJudgeRecipe(num_images=16, num_reconstructions=8, num_val=8, batch_size=8)
    figures = train_scene_judge(tmp_path / "judge", tiny_vq_dir, tmp_path / "data", cfg, recipe)
    assert figures["steps"] == 2
    assert set(figures["val_real"]) == {"shape", "colour", "size", "position", "background", "position_row",
                                        "position_column", "joint"}
    assert isinstance(from_pretrained(tmp_path / "judge/export"), AttributeClassifier)
