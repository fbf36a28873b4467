"""NAR training: ln V on a fresh model (its heads start at zero), every head trained by the cells it predicts, a
loss that falls on a fixed toy batch, shapes-nar and shapes-video-nar configs of the shapes AR model's size, the
warm starts from an AR and an NBP model, and the image and video runs end to end at toy scale."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from vgen.data.clips import ClipsConfig
from vgen.hub import CheckpointError, from_pretrained, save_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.nar import NARConfig, NARTransformer
from vgen.models.nbp import NBPConfig, NBPTransformer
from vgen.training.ar import SHAPES_GPT
from vgen.training.clip_codes import ClipRecipe
from vgen.training.nar import (
    SHAPES_NAR,
    SHAPES_VIDEO_NAR,
    NARRecipe,
    from_image_nar,
    train_nar,
    train_video_nar,
    warm_start,
)
from vgen.training.tokenizer import SHAPES_FRAME_VQ
from vgen.training.trainer import TrainConfig, latest_checkpoint, token_grid_loss

TOY = dict(vocab_size=16, dim=32, n_layer=2, n_head=4, multiple_of=16, num_classes=4, class_dropout_prob=0.0,
           token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)


def toy_batch(model: NARTransformer, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, model.num_classes, (size,), generator=g),
            torch.randint(0, model.vocab_size, (size, model.num_tokens), generator=g))


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_a_fresh_model_scores_ln_v(grid: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY))
    loss, _ = token_grid_loss(model, *toy_batch(model))
    assert loss.item() == pytest.approx(math.log(16), abs=1e-6)


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_each_head_learns_only_from_cells_with_a_predecessor_on_its_axis(grid: tuple[int, ...]) -> None:
    """With the loss restricted to one cell, exactly the heads that predict that cell get a gradient."""
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY))
    classes, tokens = toy_batch(model)
    last = model.num_tokens - 1  # every axis has a predecessor: all heads
    for cell, heads in [(0, set(range(len(grid)))), (1, {0}), (grid[-1], {1}), (last, set(range(len(grid))))]:
        model.zero_grad()
        logits = model(classes, tokens)
        torch.nn.functional.cross_entropy(logits[:, cell], tokens[:, cell]).backward()
        got = {a for a, head in enumerate(model.heads) if head.output.weight.grad.abs().sum() > 0}
        assert got == heads, cell
    model.zero_grad()
    token_grid_loss(model, classes, tokens)[0].backward()
    assert all(head.output.weight.grad.abs().sum() > 0 for head in model.heads)


@pytest.mark.parametrize("grid", [(3, 3), (2, 2, 2)])
def test_loss_falls_on_a_fixed_batch(grid: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = NARTransformer(NARConfig(grid=grid, **TOY)).train()
    classes, tokens = toy_batch(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss, figures = token_grid_loss(model, classes, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(16), abs=1e-5)
    assert losses[-1] < 0.15 * losses[0]
    assert figures["acc"] > 0.9


def test_shapes_nar_matches_the_shapes_ar_model() -> None:
    """Same grid, vocabulary, width, heads and classes; trunk + extra block = the AR model's 8 blocks."""
    with torch.device("meta"):
        nar, ar = NARTransformer(SHAPES_NAR), LlamaGenGPT(SHAPES_GPT)
    assert SHAPES_NAR.grid == ar.grid == (16, 16) and nar.num_steps == 31
    assert len(nar.layers) == len(ar.layers) == 8
    assert (nar.vocab_size, nar.num_classes, SHAPES_NAR.dim) == (ar.vocab_size, ar.num_classes, SHAPES_GPT.dim)
    extra = sum(p.numel() for p in nar.parameters()) - sum(p.numel() for p in ar.parameters())
    assert extra == SHAPES_GPT.dim * (SHAPES_GPT.vocab_size + 1)  # the second head: norm + output layer


def test_shapes_video_nar_has_8_blocks_over_the_clips_1024_frame_codes() -> None:
    with torch.device("meta"):
        nar = NARTransformer(SHAPES_VIDEO_NAR)
    assert nar.grid == (16, 8, 8) and nar.num_tokens == 1024 and nar.num_steps == 16 + 8 + 8 - 2
    assert len(nar.layers) == 8 and len(nar.heads) == 3 and nar.vocab_size == SHAPES_FRAME_VQ.codebook_size


# 8 classes (the shapes data's labels) and 32 codes (the tiny tokenizer's)
TOY_AR = GPTConfig(vocab_size=32, dim=32, n_layer=3, n_head=4, multiple_of=16, num_classes=8, block_size=16,
                   class_dropout_prob=0.0, token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0)
TOY_NAR = NARConfig(grid=(4, 4), **{**TOY, "vocab_size": 32, "n_layer": 2, "num_classes": 8})


def test_the_warm_start_copies_blocks_and_embeddings_and_starts_every_head_at_the_ar_output() -> None:
    torch.manual_seed(0)
    ar, nar = LlamaGenGPT(TOY_AR), NARTransformer(TOY_NAR)
    warm_start(nar, ar.state_dict())
    state = nar.state_dict()
    for key, value in ar.state_dict().items():
        if key.startswith(("norm.", "output.")):
            for a in range(2):
                assert torch.equal(state[f"heads.{a}.{key}"], value), key
        else:
            assert torch.equal(state[key], value), key
    with pytest.raises(CheckpointError):
        warm_start(nar, LlamaGenGPT(GPTConfig(**{**TOY_AR.__dict__, "n_layer": 2})).state_dict())


def test_the_nbp_warm_start_drops_the_begin_of_video_slots_and_starts_every_head_at_the_nbp_output() -> None:
    torch.manual_seed(0)
    nbp = NBPTransformer(NBPConfig(grid=(2, 2, 2), block="frame", **{**TOY, "n_layer": 4}))
    nar = NARTransformer(NARConfig(grid=(2, 2, 2), **TOY))  # 2 trunk blocks + 2 extra = NBP's 4
    warm_start(nar, nbp.state_dict(), source="NBP")
    state = nar.state_dict()
    for key, value in nbp.state_dict().items():
        if key.startswith(("norm.", "output.")):
            for a in range(3):
                assert torch.equal(state[f"heads.{a}.{key}"], value), key
        elif key != "bov":
            assert torch.equal(state[key], value), key
    with pytest.raises(CheckpointError):
        warm_start(nar, NBPTransformer(NBPConfig(grid=(2, 2, 2), block="frame", **TOY)).state_dict())
    with pytest.raises(CheckpointError, match="not a next-token or next-block model"):
        warm_start(nar, {"encoder.conv_in.weight": torch.zeros(1)}, source="a VQ export")


def test_a_video_model_starts_from_an_image_nar_of_its_frame_grid_and_depth() -> None:
    """Image NAR (2 trunk blocks + the below head's) into a video NAR with rope="spatial" of the same trunk: the
    blocks, embeddings and right / below heads by name, the next-frame head and its block and the per-frame
    embedding as initialised; an image model of another depth is refused."""
    torch.manual_seed(0)
    image = NARTransformer(NARConfig(grid=(3, 3), **TOY))
    with torch.no_grad():
        for p in image.parameters():
            p.normal_()
    video = NARTransformer(NARConfig(grid=(2, 3, 3), rope="spatial", **TOY))
    fresh = {k: v.clone() for k, v in video.state_dict().items()}
    from_image_nar(video, image.state_dict())
    state = video.state_dict()
    assert all(torch.equal(state[k], v) for k, v in image.state_dict().items())
    kept = set(state) - set(image.state_dict())
    assert kept == {k for k in state if k.startswith(("layers.3.", "heads.2.", "frame_embedding."))}
    assert all(torch.equal(state[k], fresh[k]) for k in kept)
    with pytest.raises(CheckpointError, match="has 4 blocks; a video NAR model of 4 starts from an image NAR model "
                                              "of 3"):
        from_image_nar(video, NARTransformer(NARConfig(grid=(3, 3), **{**TOY, "n_layer": 3})).state_dict())
    with pytest.raises(CheckpointError):
        from_image_nar(video, NARTransformer(NARConfig(grid=(3, 3), **{**TOY, "n_layer": 1})).state_dict())


@torch.no_grad()
def test_an_image_first_video_model_started_from_an_image_nar_draws_frame_0_as_that_model_draws_an_image() -> None:
    """With frame 0 first, frame 0's cells see only frame 0 and take the right and below heads, so an image NAR's
    weights give frame 0 the image model's own logits whatever the later frames hold; the 3-D order's frame 0
    also sees cells of later frames and differs."""
    torch.manual_seed(0)
    image = NARTransformer(NARConfig(grid=(3, 3), **TOY))
    for p in image.parameters():
        p.normal_(std=0.3)
    g = torch.Generator().manual_seed(1)
    classes = torch.tensor([0, 3])
    tokens = torch.randint(0, 16, (2, 18), generator=g)
    frame_0 = image(classes, tokens[:, :9])
    for image_first in (True, False):
        video = NARTransformer(NARConfig(grid=(2, 3, 3), rope="spatial", image_first=image_first, **TOY))
        from_image_nar(video, image.state_dict())
        video.eval()
        if image_first:
            torch.testing.assert_close(video(classes, tokens)[:, :9], frame_0, atol=1e-5, rtol=0)
        else:
            assert not torch.allclose(video(classes, tokens)[:, :9], frame_0, atol=1e-3)


def test_the_64px_video_recipes_start_from_the_shipped_image_models() -> None:
    """SHAPES_VIDEO_NAR_64 is shapes-nar's trunk over 8 frames of its 16 x 16 grid, and SHAPES_VIDEO_NBP_64 the
    shapes AR model's size over the same grid with all of frame 0 token by token (368 passes)."""
    from vgen.data.clips import SHAPES_CLIPS, SHAPES_CLIPS_64, SHAPES_CLIPS_64_LONG
    from vgen.training.nar import SHAPES_VIDEO_NAR_64, VIDEO_NAR_RECIPES
    from vgen.training.nbp import SHAPES_VIDEO_NBP, SHAPES_VIDEO_NBP_64, VIDEO_NBP_RECIPES, video_nbp_config

    assert SHAPES_VIDEO_NAR_64.grid == (8, 16, 16) and SHAPES_VIDEO_NAR_64.n_layer == SHAPES_NAR.n_layer
    assert SHAPES_VIDEO_NAR_64.vocab_size == SHAPES_NAR.vocab_size and SHAPES_VIDEO_NAR_64.rope == "spatial"
    assert NARConfig(**{**SHAPES_VIDEO_NAR_64.to_dict(), "grid": (16, 16), "rope": "grid"}) == SHAPES_NAR
    assert VIDEO_NAR_RECIPES[SHAPES_CLIPS] == SHAPES_VIDEO_NAR
    assert VIDEO_NAR_RECIPES[SHAPES_CLIPS_64] == SHAPES_VIDEO_NAR_64
    assert VIDEO_NAR_RECIPES[SHAPES_CLIPS_64_LONG] == replace(SHAPES_VIDEO_NAR_64, grid=(16, 16, 16))
    nbp = SHAPES_VIDEO_NBP_64
    assert (nbp.grid, nbp.block, nbp.hybrid, nbp.rope, nbp.vocab_size) == ((8, 16, 16), "row", True, "spatial", 4096)
    assert nbp.first_tokens == 256 and nbp.num_steps == 256 + 7 * 16
    assert (nbp.dim, nbp.n_layer, nbp.n_head) == (SHAPES_GPT.dim, SHAPES_GPT.n_layer, SHAPES_GPT.n_head)
    assert VIDEO_NBP_RECIPES[SHAPES_CLIPS] == SHAPES_VIDEO_NBP and VIDEO_NBP_RECIPES[SHAPES_CLIPS_64] == nbp
    long = video_nbp_config(SHAPES_CLIPS_64_LONG)  # the 16-frame clips: the same model over twice the frames
    assert long == replace(nbp, grid=(16, 16, 16)) and long.num_steps == 256 + 15 * 16
    # what vgen train nbp builds: the recipe, and in frame blocks the 64-px recipe's frame 0 is one block
    assert video_nbp_config(SHAPES_CLIPS_64) == nbp and video_nbp_config(SHAPES_CLIPS) == SHAPES_VIDEO_NBP
    frames = video_nbp_config(SHAPES_CLIPS_64, block="frame")
    assert (frames.hybrid_blocks, frames.first_tokens, frames.num_steps) == (1, 256, 263)
    assert video_nbp_config(SHAPES_CLIPS_64, hybrid_blocks=2).first_tokens == 32
    assert video_nbp_config(SHAPES_CLIPS, block="frame").hybrid_blocks == 1


def test_an_image_run_starts_from_an_ar_export_and_trains(tiny_vq_dir, tmp_path) -> None:
    from vgen.data.shapes import ShapesConfig, set_data_config

    data = tmp_path / "data"
    set_data_config(data, ShapesConfig(image_size=16))  # 4 x 4 codes under a downsample-4 tokenizer
    torch.manual_seed(0)
    ar_dir = save_pretrained(LlamaGenGPT(TOY_AR), tmp_path / "ar")
    start = train_nar(tmp_path / "start", tiny_vq_dir, data, TrainConfig(steps=0, bf16=False),
                      NARRecipe(num_items=8, batch_size=4), TOY_NAR, init_from=ar_dir)
    assert torch.equal(start.tok_embeddings.weight, from_pretrained(ar_dir).tok_embeddings.weight)
    train = TrainConfig(steps=6, lr=3e-3, warmup_steps=1, log_every=3, bf16=False)
    model = train_nar(tmp_path / "run", tiny_vq_dir, data, train, NARRecipe(num_items=8, batch_size=4), TOY_NAR,
                      init_from=ar_dir)
    assert isinstance(from_pretrained(tmp_path / "run" / "export"), NARTransformer) and model.grid == (4, 4)
    assert json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())["step"] == 6


def test_a_video_run_takes_its_grid_from_the_frame_tokenizer_and_its_loss_falls(tiny_vq_dir, tmp_path) -> None:
    clips = ClipsConfig(num_frames=2, frame_size=16, supersample=1)
    config = NARConfig(grid=(1, 1, 1), **{**TOY, "n_layer": 1, "num_classes": 8})
    train = TrainConfig(steps=30, lr=3e-3, warmup_steps=3, log_every=5, bf16=False, ema_decay=0.9)
    probed = []
    model = train_video_nar(tmp_path / "run", tiny_vq_dir, tmp_path / "clips", train,
                            ClipRecipe(num_clips=8, batch_size=4, eval_every=10), config, clips,
                            evaluate=lambda m: probed.append(m.training) or {"probe_calls": len(probed)})
    assert model.grid == (2, 4, 4) and model.vocab_size == 32
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["probe_calls"] for r in records if "probe_calls" in r] == [1, 2, 3]  # steps 10, 20 and 30
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < losses[0] - 0.3, losses
    assert isinstance(from_pretrained(tmp_path / "run" / "export"), NARTransformer)


def test_an_image_first_video_run_also_learns_frame_0_from_other_frames(tiny_vq_dir, tmp_path) -> None:
    """With frame 0 first, ``first_frames`` other frames of each clip are scored as frame 0 alone: the run logs
    their loss beside the clip's; a model that draws frame 0 beside the others is refused the term."""
    clips = ClipsConfig(num_frames=3, frame_size=16, supersample=1)
    config = NARConfig(grid=(1, 1, 1), image_first=True, **{**TOY, "n_layer": 1, "num_classes": 8})
    train = TrainConfig(steps=4, lr=3e-3, warmup_steps=1, log_every=2, bf16=False)
    model = train_video_nar(tmp_path / "run", tiny_vq_dir, tmp_path / "clips", train,
                            ClipRecipe(num_clips=8, batch_size=4), config, clips, first_frames=2)
    assert model.grid == (3, 4, 4) and model.config.image_first and model.num_steps == 3 + 2 * 8 - 4
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(0 < r["first_loss"] < 2 * math.log(32) for r in records if "loss" in r)
    with pytest.raises(ValueError, match="needs a model that draws frame 0 first"):
        train_video_nar(tmp_path / "other", tiny_vq_dir, tmp_path / "clips", train, ClipRecipe(num_clips=8),
                        replace(config, image_first=False), clips, first_frames=2)
    assert not (tmp_path / "other").exists()
