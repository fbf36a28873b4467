"""Warm-starting the continuous-token target from a discrete AR model: the trunk carries over by name and the
token projection is fitted to the AR embeddings."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from vgen.hub import CheckpointError, save_pretrained
from vgen.models.llamagen import GPTConfig, LlamaGenGPT
from vgen.models.mar import ContinuousAR, MARConfig
from vgen.tokenizers.vq import VQConfig
from vgen.training.mar import MARRecipe, fit_token_projection, load_continuous, load_trunk, mar_probe, train_mar
from vgen.training.trainer import TrainConfig, latest_checkpoint

VOCAB = 64


def gpt(n_layer: int = 2, dim: int = 32, grid: int = 3) -> LlamaGenGPT:
    torch.manual_seed(1)
    model = LlamaGenGPT(GPTConfig(vocab_size=VOCAB, dim=dim, n_layer=n_layer, n_head=2, multiple_of=16,
                                  num_classes=4, block_size=grid * grid))
    nn.init.normal_(model.output.weight, std=0.02)
    return model.eval()


def mar(token_channels: int = VOCAB, token_hidden: int = 0, grid: int = 3, **kw) -> ContinuousAR:
    torch.manual_seed(2)
    return ContinuousAR(MARConfig(token_channels=token_channels, grid_size=grid, dim=32, n_layer=2, n_head=2,
                                  multiple_of=16, num_classes=4, head_width=16, head_depth=1, dropout_p=0.0,
                                  token_hidden=token_hidden, **kw)).eval()


def test_a_loaded_trunk_fed_the_ar_embeddings_reproduces_the_ar_hidden_states():
    ar, model = gpt(), mar()
    load_trunk(model, ar.state_dict())
    # one-hot tokens through a projection that holds the embedding table give exactly the AR model's inputs
    with torch.no_grad():
        model.token_proj.weight.copy_(ar.tok_embeddings.weight.T)
        model.token_proj.bias.zero_()
    classes, codes = torch.tensor([0, 3]), torch.randint(0, VOCAB, (2, 8))
    _, hidden = ar(classes, codes, return_hidden=True)
    conditions = model(classes, nn.functional.one_hot(codes, VOCAB).float())
    assert torch.allclose(conditions, hidden, atol=1e-5)


def test_a_trunk_of_another_depth_or_width_is_refused():
    model = mar()
    with pytest.raises(CheckpointError, match="deeper"):
        load_trunk(model, gpt(n_layer=3).state_dict())
    with pytest.raises(CheckpointError, match="2-layer"):
        load_trunk(model, gpt(n_layer=1).state_dict())
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_trunk(model, gpt(dim=64).state_dict())


def test_the_token_fit_explains_a_learnable_map_and_not_noise():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(4000, 4, generator=gen)
    teacher = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32))
    with torch.no_grad():
        targets = teacher(tokens)
    assert fit_token_projection(mar(4, token_hidden=64), tokens, targets, steps=400, batch_size=512, lr=3e-3) > 0.9
    noise = torch.randn(4000, 32, generator=gen)
    assert fit_token_projection(mar(4, token_hidden=64), tokens, noise, steps=100, batch_size=512) < 0.05


def test_a_new_run_starts_from_a_discrete_pipeline_and_a_resume_ignores_it(tmp_path):
    from vgen.tokenizers.kl import KLConfig
    from vgen.training.kl import KLRecipe, train_kl
    from vgen.training.tokenizer import TokenizerRecipe, train_tokenizer

    fast = TrainConfig(steps=1, warmup_steps=1, bf16=False)
    train_kl(tmp_path / "kl", tmp_path / "data", fast, KLRecipe(num_images=16, batch_size=8, scale_images=16),
             KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, latent_channels=2))
    vq = train_tokenizer(tmp_path / "vq", tmp_path / "data", fast, TokenizerRecipe(num_images=16, batch_size=8),
                         VQConfig(codebook_size=VOCAB, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8,
                                  norm_groups=4))
    ar = gpt(grid=16)
    save_pretrained(ar, tmp_path / "pipe" / "gpt")
    save_pretrained(vq, tmp_path / "pipe" / "vq")
    config = mar(token_channels=2, token_hidden=16, grid=16).config
    recipe = MARRecipe(num_images=16, batch_size=4, fit_images=8, fit_steps=5)
    run = tmp_path / "run"
    model = train_mar(run, tmp_path / "kl" / "export", tmp_path / "data", TrainConfig(steps=0, bf16=False), recipe,
                      config, init_from=tmp_path / "pipe")
    assert torch.equal(model.layers[1].attention.wqkv.weight, ar.layers[1].attention.wqkv.weight)
    assert torch.equal(model.cls_embedding.embedding_table.weight, ar.cls_embedding.embedding_table.weight)
    record = json.loads((run / "log.jsonl").read_text().splitlines()[0])
    assert record["warm_start"] == str(tmp_path / "pipe") and record["token_projection_r2"] <= 1.0
    assert (run / "train_codes_8.npy").exists()  # the VQ codes of the fitted images, cached in the run

    # a resumed run keeps its own weights: a different pipeline is not even read
    save_pretrained(gpt(grid=16, n_layer=1), tmp_path / "other" / "gpt")
    resumed = train_mar(run, tmp_path / "kl" / "export", tmp_path / "data", TrainConfig(steps=0, bf16=False), recipe,
                        config, init_from=tmp_path / "other")
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    # a continuous target (here the run's own export, inside a pipeline-like folder) loads as it is
    save_pretrained(model, tmp_path / "cont" / "gpt")
    again = train_mar(tmp_path / "again", tmp_path / "kl" / "export", tmp_path / "data",
                      TrainConfig(steps=0, bf16=False), recipe, config, init_from=tmp_path / "cont")
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(CheckpointError, match="KLTokenizer"):
        train_mar(tmp_path / "run2", tmp_path / "kl" / "export", tmp_path / "data", TrainConfig(steps=0, bf16=False),
                  recipe, config, init_from=tmp_path / "kl" / "export")
    with pytest.raises(CheckpointError, match="gpt/ and vq/"):
        train_mar(tmp_path / "run3", tmp_path / "kl" / "export", tmp_path / "data", TrainConfig(steps=0, bf16=False),
                  recipe, config, init_from=tmp_path / "pipe" / "gpt")


def test_a_target_loads_into_a_deeper_head_whose_added_blocks_start_as_identities():
    source = mar(2)
    with torch.no_grad():  # a trained-looking head: its own blocks' gates are open
        for p in source.head.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.manual_seed(5)
    grown = ContinuousAR(replace(source.config, head_depth=3)).eval()
    assert load_continuous(grown, source, "source") == {"head_blocks_added": 2}
    classes, tokens = torch.tensor([0, 3]), torch.randn(2, 9, 2)
    z = source(classes, tokens[:, :-1])
    assert torch.equal(grown(classes, tokens[:, :-1]), z)
    x, t = torch.randn(18, 2), torch.randint(0, 1000, (18,))
    assert torch.allclose(grown.head(x, t, z.reshape(18, -1)), source.head(x, t, z.reshape(18, -1)), atol=1e-6)
    assert grown.head.res_blocks[2].mlp[0].weight.abs().sum() > 0  # the added blocks can learn: only gates are 0
    # the same depth loads as it is; a shallower head, or any other difference, is refused by name
    assert load_continuous(mar(2), source, "source") == {}
    with pytest.raises(CheckpointError, match="unexpected.*head.res_blocks.1"):
        load_continuous(ContinuousAR(replace(source.config, head_depth=1)), grown, "grown")
    with pytest.raises(CheckpointError, match="source does not match"):
        load_continuous(ContinuousAR(replace(source.config, head_depth=3, head_width=32)), source, "source")


SHIPPED = Path(__file__).parents[2] / "vgen" / "assets"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_the_probe_samples_where_the_model_is_and_reads_the_classes_on_the_cpu(device):
    """An untrained target over the shipped KL latents (16 x 16 x 4), sampled with a 4-step head chain."""
    probe = mar_probe(SHIPPED / "shapes-c2i-continuous" / "kl", SHIPPED / "shapes-classifier", per_class=1)
    model = ContinuousAR(MARConfig(token_channels=4, grid_size=16, dim=32, n_layer=1, n_head=2, multiple_of=16,
                                   num_classes=8, head_width=16, head_depth=1, num_sampling_steps=4,
                                   clip_x0=5.0)).to(device).train()
    figures = probe(model)
    assert set(figures) == {"probe_class_accuracy"} and 0 <= figures["probe_class_accuracy"] <= 1
    assert model.training  # put back as it was
    assert mar_probe(SHIPPED / "shapes-c2i-continuous" / "kl", None)(model) == {}  # no classifier, no probe


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])])
def test_a_run_trains_where_it_is_told_and_exports_to_the_cpu(tmp_path, device):
    from vgen.hub import from_pretrained
    from vgen.tokenizers.kl import KLConfig
    from vgen.training.kl import KLRecipe, train_kl

    train_kl(tmp_path / "kl", tmp_path / "data", TrainConfig(steps=1, warmup_steps=1, bf16=False),
             KLRecipe(num_images=16, batch_size=8, scale_images=16),
             KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, latent_channels=2))
    train = TrainConfig(steps=10, lr=3e-3, warmup_steps=2, log_every=5, bf16=device == "cuda", device=device)
    train_mar(tmp_path / "run", tmp_path / "kl" / "export", tmp_path / "data", train,
              MARRecipe(num_images=16, batch_size=8),
              MARConfig(token_channels=2, grid_size=16, dim=32, n_layer=1, n_head=2, multiple_of=16, num_classes=8,
                        head_width=16, head_depth=1, dropout_p=0.0))
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    model = from_pretrained(tmp_path / "run" / "export")
    assert next(model.parameters()).device.type == "cpu"


def test_class_repeats_and_context_noise_reach_every_step_and_the_run_record(tmp_path, monkeypatch):
    from vgen.data.shapes import CLASS_NAMES, cached_split
    from vgen.tokenizers.kl import KLConfig
    from vgen.training.kl import KLRecipe, train_kl

    seen, noise = [], []
    loss = ContinuousAR.loss

    def recording_loss(self, class_ids, tokens, **options):
        seen.append(class_ids.clone())
        noise.append(options["context_noise"])
        return loss(self, class_ids, tokens, **options)

    monkeypatch.setattr(ContinuousAR, "loss", recording_loss)
    train_kl(tmp_path / "kl", tmp_path / "data", TrainConfig(steps=1, warmup_steps=1, bf16=False),
             KLRecipe(num_images=16, batch_size=8, scale_images=16),
             KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, latent_channels=2))
    recipe = MARRecipe(num_images=48, batch_size=8, class_repeats={"heart": 4}, context_noise=0.2)
    train_mar(tmp_path / "run", tmp_path / "kl" / "export", tmp_path / "data",
              TrainConfig(steps=30, lr=1e-3, warmup_steps=2, log_every=10, bf16=False), recipe,
              MARConfig(token_channels=2, grid_size=16, dim=16, n_layer=1, n_head=2, multiple_of=16, num_classes=8,
                        head_width=8, head_depth=1, dropout_p=0.0))
    labels = cached_split(tmp_path / "data", "train", 48)[1]
    heart = CLASS_NAMES.index("heart")
    expected = 4 * (labels == heart).sum() / (len(labels) + 3 * (labels == heart).sum())
    shown = float((torch.cat(seen) == heart).float().mean())
    assert (labels == heart).sum() > 0 and abs(shown - expected) < 0.05, (shown, expected)
    state = json.loads((latest_checkpoint(tmp_path / "run") / "state.json").read_text())
    assert state["recipe"]["class_repeats"] == {"heart": 4} and state["recipe"]["context_noise"] == 0.2
    assert noise == [0.2] * 30
    with pytest.raises(ValueError, match="class_repeats names an unknown class 'hexagon'"):
        MARRecipe(class_repeats={"hexagon": 2})
    with pytest.raises(ValueError, match="context_noise is a standard deviation in token units in"):
        MARRecipe(context_noise=-0.1)
