"""``vgen train <recipe>`` through the command: every recipe trains two steps, checkpoints and exports a loadable
model; a rerun with other settings is refused in one line unless overridden; the checkpoint interval flags reach
the run.

The recipes' models are swapped for tiny ones of the same kinds (the command's wiring, data, caches, checkpoints
and exports are the real ones), and the data is 16-px images and 4-frame clips of 16 px (32 px and 16 frames for
the frame tokenizer and the video classifier, which take the default clips).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from functools import partial

import pytest
import torch

from vgen.apps import train_cli
from vgen.apps.cli import build_parser, main
from vgen.data.clips import ClipsConfig, cached_clips
from vgen.data.moving_scenes import MovingScenesConfig
from vgen.data.scenes import caption_vocabulary
from vgen.data.shapes import ShapesConfig, set_data_config
from vgen.hub import from_pretrained, save_pretrained
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer
from vgen.models.classifier import (
    AttributeClassifier,
    ShapesClassifier,
    ShapesVideoClassifier,
    VideoClassifierConfig,
)
from vgen.models.draft_head import DraftHead
from vgen.models.llamagen import LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.models.nar import NARTransformer
from vgen.models.nbp import NBPTransformer
from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
from vgen.tokenizers.kl import KLConfig, KLTokenizer
from vgen.tokenizers.vq import VQConfig, VQModel
from vgen.training import nbp
from vgen.training.ar import SHAPES_GPT
from vgen.training.nar import SHAPES_NAR, SHAPES_VIDEO_NAR
from vgen.training.trainer import TrainConfig, latest_checkpoint
from vgen.training.video_ar import SHAPES_VIDEO_AR

TINY = dict(dim=32, n_layer=2, n_head=2, multiple_of=16)
TINY_VQ = VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4)
TINY_KL = KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, image_size=16, latent_channels=2)  # 4 x 4 x 2
TINY_GPT = replace(SHAPES_GPT, vocab_size=32, block_size=16, **TINY)  # 4 x 4 codes of 16-px images
TINY_MAR = MARConfig(token_channels=2, grid_size=4, num_classes=8, head_width=16, head_depth=1, **TINY)
TINY_PIXEL_DIFF = BlockDiffConfig(frame_size=16, patch_size=4, frames_per_block=2, train_frames=4, dim=32, n_layer=1,
                                  n_head=2)
TINY_LATENT_DIFF = replace(TINY_PIXEL_DIFF, frame_size=4, channels=2, patch_size=2)
# captioned scenes are 64 px: 16 x 16 codes of the tiny downsample-4 VQ
TINY_T2I = replace(TINY_GPT, block_size=256, model_type="t2i", caption_dim=16, cls_token_num=24)
TINY_WORDS = WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2, max_length=24)
CLIPS = ClipsConfig(num_frames=4, frame_size=16, supersample=1)
SCENES = MovingScenesConfig(num_frames=4, frame_size=16, supersample=1)  # moving scenes through the tiny KL
FAST = ["--steps", "2", "--warmup-steps", "1", "--batch-size", "2", "--num-images", "4", "--precision", "fp32"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Folders the recipes read: data, tokenizers, a draft target and a distillation teacher (random weights)."""
    root = tmp_path_factory.mktemp("inputs")
    set_data_config(root / "images", ShapesConfig(image_size=16))
    cached_clips(root / "clips", "train", 4, CLIPS)
    torch.manual_seed(0)
    models = {"vq": VQModel(TINY_VQ), "kl": KLTokenizer(TINY_KL), "gpt": LlamaGenGPT(TINY_GPT),
              "teacher": BlockDiffusionTransformer(TINY_PIXEL_DIFF),
              "latent_teacher": BlockDiffusionTransformer(TINY_LATENT_DIFF), "words": WordTextEncoder(TINY_WORDS)}
    return {"images": str(root / "images"), "clips": str(root / "clips"),
            **{name: str(save_pretrained(model, root / name)) for name, model in models.items()}}


@pytest.fixture(autouse=True)
def tiny_models(monkeypatch) -> None:
    """Each recipe's model is a tiny one of its kind; the classifiers evaluate on a few held-out images or clips."""
    patches = {
        "train_tokenizer": partial(train_cli.train_tokenizer, vq_config=TINY_VQ),
        "SHAPES_FRAME_VQ": replace(TINY_VQ, encoder="patch"),
        "ClassifierRecipe": partial(train_cli.ClassifierRecipe, num_val=4),
        "VideoClassifierRecipe": partial(train_cli.VideoClassifierRecipe, num_val=2),
        "train_video_classifier": partial(train_cli.train_video_classifier,
                                          config=VideoClassifierConfig(stages=((8,), (16,)))),
        "train_ar": partial(train_cli.train_ar, gpt_config=TINY_GPT),
        "train_video_ar": partial(train_cli.train_video_ar, config=replace(SHAPES_VIDEO_AR, **TINY)),
        "train_kl": partial(train_cli.train_kl, config=TINY_KL),
        "SIZES": {"target": TINY_MAR, "draft": replace(TINY_MAR, n_layer=1)},
        "train_nar": partial(train_cli.train_nar, config=replace(SHAPES_NAR, grid=(4, 4), vocab_size=32, **TINY)),
        "SHAPES_VIDEO_NAR": replace(SHAPES_VIDEO_NAR, **TINY),
        "SHAPES_BLOCKDIFF": TINY_PIXEL_DIFF,
        "SHAPES_LATENT_BLOCKDIFF": TINY_LATENT_DIFF,
        "SHAPES_LATENT_IMAGE_DIFF": replace(TINY_LATENT_DIFF, frames_per_block=1, train_frames=1),
        "train_t2i": partial(train_cli.train_t2i, gpt_config=TINY_T2I, encoder_config=TINY_WORDS),
        "train_stream_kl": partial(train_cli.train_stream_kl, scenes=SCENES),
        "train_t2v_stream": partial(train_cli.train_t2v_stream, scenes=SCENES),
    }
    for name, value in patches.items():
        monkeypatch.setattr(train_cli, name, value)
    monkeypatch.setattr(nbp, "SHAPES_VIDEO_NBP", replace(nbp.SHAPES_VIDEO_NBP, **TINY))


# recipe flags ({name} is a folder of ``inputs``; {tmp} the test's own folder) and the class of the export
RECIPES = {
    "tokenizer": (["tokenizer", "--data-dir", "{images}"], VQModel),
    "frame-tokenizer": (["frame-tokenizer", "--data-dir", "{tmp}/clips32", "--num-images", "1"], VQModel),
    "classifier": (["classifier", "--tokenizer", "{vq}", "--data-dir", "{images}"], ShapesClassifier),
    "video-classifier": (["video-classifier", "--data-dir", "{tmp}/clips32", "--num-images", "2"],
                         ShapesVideoClassifier),
    "ar": (["ar", "--tokenizer", "{vq}", "--data-dir", "{images}", "--eval-every", "1", "--classifier", "{tmp}/none"],
           LlamaGenGPT),
    "ar --video": (["ar", "--video", "--tokenizer", "{vq}", "--data-dir", "{clips}"], LlamaGenGPT),
    "drafter": (["drafter", "--target", "{gpt}", "--tokenizer", "{vq}", "--codes-dir", "{tmp}/codes",
                 "--data-dir", "{images}"], DraftHead),
    "kl": (["kl", "--data-dir", "{images}"], KLTokenizer),
    "mar": (["mar", "--tokenizer", "{kl}", "--data-dir", "{images}"], ContinuousAR),
    "mar --size draft": (["mar", "--size", "draft", "--tokenizer", "{kl}", "--data-dir", "{images}"], ContinuousAR),
    "nbp": (["nbp", "--tokenizer", "{vq}", "--data-dir", "{clips}"], NBPTransformer),
    "nar": (["nar", "--tokenizer", "{vq}", "--data-dir", "{images}"], NARTransformer),
    "nar --video --image-first": (["nar", "--video", "--image-first", "--first-frames", "1", "--tokenizer", "{vq}",
                                   "--data-dir", "{clips}"], NARTransformer),
    "blockdiff": (["blockdiff", "--data-dir", "{clips}"], BlockDiffusionTransformer),
    "blockdiff --tokenizer": (["blockdiff", "--tokenizer", "{kl}", "--data-dir", "{clips}"],
                              BlockDiffusionTransformer),
    "blockdiff --image": (["blockdiff", "--image", "--tokenizer", "{kl}", "--data-dir", "{clips}"],
                          BlockDiffusionTransformer),
    "blockdiff --distill-from": (["blockdiff", "--distill-from", "{teacher}", "--data-dir", "{clips}"],
                                 BlockDiffusionTransformer),
    "t2i": (["t2i", "--tokenizer", "{vq}", "--init-from", "{gpt}", "--data-dir", "{tmp}/scenes"], LlamaGenGPT),
    "scene-judge": (["scene-judge", "--tokenizer", "{vq}", "--data-dir", "{tmp}/scenes", "--num-val", "4"],
                    AttributeClassifier),
    "t2v-kl": (["t2v-kl", "--tokenizer", "{kl}", "--data-dir", "{tmp}/moving"], KLTokenizer),
    "t2v-stream": (["t2v-stream", "--tokenizer", "{kl}", "--init-from", "{latent_teacher}", "--text-encoder-from",
                    "{words}", "--data-dir", "{tmp}/moving"], BlockDiffusionTransformer),
}
# a run that exports two models: the folder of the one checked
EXPORTS = {"t2i": "export/gpt", "t2v-stream": "export/blockdiff"}


def _train(flags: list[str], inputs: dict[str, str], tmp_path, *extra: str) -> int:
    args = [flag.format(tmp=tmp_path, **inputs) for flag in flags]
    return main(["train", args[0], *FAST, *args[1:], "--run-dir", str(tmp_path / "run"), *extra])


def _state(run_dir) -> dict:
    return json.loads((latest_checkpoint(run_dir) / "state.json").read_text())


def test_every_recipe_of_the_command_is_exercised():
    assert {case.split()[0] for case in RECIPES} == set(train_cli.RECIPES)


@pytest.mark.parametrize("case", RECIPES)
def test_each_recipe_trains_checkpoints_and_exports_through_the_command(case, inputs, tmp_path, capsys):
    flags, model_class = RECIPES[case]
    code = _train(flags, inputs, tmp_path)
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert f"exported to {tmp_path / 'run' / 'export'}" in out
    assert type(from_pretrained(tmp_path / "run" / EXPORTS.get(case, "export"))) is model_class
    state = _state(tmp_path / "run")
    assert state["step"] == 2 and state["recipe"]["batch_size"] == 2 and state["train_config"]["lr"] > 0


@pytest.mark.parametrize("case", ["blockdiff", "blockdiff --tokenizer"])
def test_a_video_blockdiff_model_trains_on_whole_clips(case, inputs, tmp_path):
    """Longer clips (the 64px-16f preset) give a model of more trained frames, hence longer stream contexts."""
    cached_clips(tmp_path / "clips6", "train", 4, replace(CLIPS, num_frames=6))
    flags = [flag.replace("{clips}", "{tmp}/clips6") for flag in RECIPES[case][0]]
    assert _train(flags, inputs, tmp_path) == 0
    assert from_pretrained(tmp_path / "run" / "export").config.train_frames == 6


def test_a_rerun_with_other_settings_is_refused_in_one_line_unless_overridden(inputs, tmp_path, capsys):
    flags = RECIPES["blockdiff"][0]
    assert _train(flags, inputs, tmp_path) == 0
    capsys.readouterr()
    assert _train(flags, inputs, tmp_path, "--lr", "0.5", "--batch-size", "4", "--steps", "3") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vgen: error: {tmp_path / 'run'} was trained with other settings")
    assert "steps 2 -> 3, lr 0.0006 -> 0.5, batch_size 2 -> 4" in err and "--override-config" in err
    assert _state(tmp_path / "run")["step"] == 2

    assert _train(flags, inputs, tmp_path, "--lr", "0.5", "--batch-size", "4", "--steps", "3",
                  "--override-config") == 0
    state = _state(tmp_path / "run")
    assert state["step"] == 3 and state["train_config"]["lr"] == 0.5 and state["recipe"]["batch_size"] == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(steps) == len(set(steps))


def test_a_resume_on_other_data_is_refused_in_one_line_unless_overridden(inputs, tmp_path, capsys):
    """The run records its data (rendering settings and fingerprint): another background is refused, a folder
    holding the same data is not, and --override-config goes on with the new data and records it."""
    flags = ["tokenizer", "--data-dir", "{tmp}/data"]
    set_data_config(tmp_path / "data", ShapesConfig(image_size=16))
    assert _train(flags, inputs, tmp_path) == 0
    recorded = _state(tmp_path / "run")
    assert recorded["data"]["background"] == "textured" and recorded["data_dir"] == str(tmp_path / "data")
    capsys.readouterr()

    other = ["tokenizer", "--data-dir", "{tmp}/smooth", "--background", "smooth"]
    assert _train(other, inputs, tmp_path) == 2
    err = capsys.readouterr().err  # the new folder's rendering progress, then the refusal
    line = err.splitlines()[-1]
    assert "Traceback" not in err
    assert line.startswith(f"vgen: error: {tmp_path / 'run'} was trained with other settings")
    assert "data.background textured -> smooth, data.fingerprint " in line and "--override-config" in line
    assert "data.image_size 16 -> 64" in line  # --background renders the folder at the default size
    assert _state(tmp_path / "run")["step"] == 2

    shutil.copytree(tmp_path / "data", tmp_path / "copy")
    assert _train(["tokenizer", "--data-dir", "{tmp}/copy"], inputs, tmp_path) == 0

    assert _train(other, inputs, tmp_path, "--steps", "4", "--override-config") == 0
    state = _state(tmp_path / "run")
    assert state["step"] == 4 and state["data"]["background"] == "smooth"
    assert state["data"]["fingerprint"] != recorded["data"]["fingerprint"]


def test_the_checkpoint_interval_flags_default_to_the_train_config_and_reach_the_run(inputs, tmp_path):
    args = build_parser().parse_args(["train", "blockdiff"])
    assert args.checkpoint_every_steps == TrainConfig.checkpoint_every_steps
    assert args.checkpoint_every_minutes == TrainConfig.checkpoint_every_minutes
    assert not args.override_config
    assert _train(RECIPES["blockdiff"][0], inputs, tmp_path, "--checkpoint-every-steps", "1",
                  "--checkpoint-every-minutes", "0.5") == 0
    recorded = _state(tmp_path / "run")["train_config"]
    assert (recorded["checkpoint_every_steps"], recorded["checkpoint_every_minutes"]) == (1, 0.5)


def test_the_head_depth_flag_sets_the_diffusion_head_of_a_mar_run(inputs, tmp_path, capsys):
    assert _train(RECIPES["mar"][0], inputs, tmp_path, "--head-depth", "3") == 0
    assert from_pretrained(tmp_path / "run" / "export").config.head_depth == 3
    capsys.readouterr()
    assert _train(RECIPES["mar"][0], inputs, tmp_path / "other", "--head-depth", "0") == 2
    assert capsys.readouterr().err.strip() == "vgen: error: --head-depth must be >= 1, got 0"
    assert not (tmp_path / "other" / "run").exists()


def test_a_negative_checkpoint_interval_is_refused_in_one_line(inputs, tmp_path, capsys):
    assert _train(RECIPES["blockdiff"][0], inputs, tmp_path, "--checkpoint-every-steps", "-1") == 2
    assert capsys.readouterr().err.strip() == ("vgen: error: checkpoint_every_steps must be an integer >= 0 (0 = "
                                               "none by steps), got -1")
    assert not (tmp_path / "run").exists()
