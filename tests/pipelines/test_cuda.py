"""The embedded image pipeline on a CUDA device (``shapes-c2i``: a LlamaGen GPT and a VQ decoder; no diffusers):
the fp32 model computes the CPU's logits and bf16 stays close to them, sampling is deterministic per seed in fp32
and bf16, the images show the classes asked for, and greedy speculative decoding draws vanilla AR's tokens.

Run them alone, ``pytest -m gpu``: a run that also selects the CPU kernel tests loads Triton's interpreter (see
tests/kernels/conftest.py), and these skip."""

import numpy as np
import pytest
import torch

import vgen
from vgen.kernels import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CLASSES = list(range(8))


@pytest.fixture(autouse=True)
def compiled_kernels() -> None:
    if dispatch.interpreted():
        pytest.skip("Triton's interpreter is loaded in this run (CPU kernel tests selected too): run pytest -m gpu")


@pytest.fixture(scope="module")
def pipes() -> dict:
    return {name: vgen.load("shapes-c2i", device=CUDA, dtype=dtype) for name, dtype in DTYPES.items()}


@torch.no_grad()
def test_the_cuda_model_computes_the_cpu_logits(pipes) -> None:
    """Teacher-forced on tokens the model drew: fp32 on CUDA equals the CPU within float32 rounding; bf16 mostly
    ranks the same token first and moves little probability."""
    cpu = vgen.load("shapes-c2i")
    classes = torch.tensor([0, 3, 5, 7])
    tokens = pipes["fp32"](classes.tolist(), seed=0).tokens[:, :-1]  # position p predicts token p
    reference = cpu.model(classes, tokens)
    fp32 = pipes["fp32"].model(classes.to(CUDA), tokens.to(CUDA)).cpu()
    torch.testing.assert_close(fp32, reference, rtol=1e-3, atol=1e-3)
    bf16 = pipes["bf16"].model(classes.to(CUDA), tokens.to(CUDA)).float().cpu()
    assert (bf16.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9
    assert (bf16.softmax(-1) - reference.softmax(-1)).abs().sum(-1).mean() / 2 < 0.05  # mean total variation


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sampler", ["ar", "lantern"])
def test_sampling_is_deterministic_per_seed_on_cuda(sampler: str, dtype: str, pipes) -> None:
    pipe = pipes[dtype]
    first, again, other = (pipe(CLASSES, sampler=sampler, seed=seed) for seed in (0, 0, 1))
    assert first.tokens.shape == (len(CLASSES), 256)
    assert torch.equal(first.tokens, again.tokens) and not torch.equal(first.tokens, other.tokens)
    images = np.stack([np.asarray(im) for im in first.images])
    assert images.shape == (len(CLASSES), 64, 64, 3) and images.std(axis=(1, 2, 3)).min() > 5  # not blank
    repeat = np.stack([np.asarray(im) for im in again.images]).astype(int)
    assert np.abs(repeat - images).max() <= 1  # the VQ decoder too (a cuDNN algorithm may round differently)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_images_show_the_classes_asked_for_on_cuda(dtype: str, pipes) -> None:
    """32 samples (4 per class, default CFG): the shipped classifier finds the requested shape in most of them
    (78% over 512 samples on the CPU, README), and in few against the next class."""
    from vgen.eval.bench import domain_class_accuracy

    pipe = pipes[dtype]
    classes = np.repeat(np.arange(len(CLASSES)), 4)
    images = np.stack([np.asarray(im) for im in pipe(classes.tolist(), seed=0).images])
    assert domain_class_accuracy(pipe, images, classes) >= 0.5
    assert domain_class_accuracy(pipe, images, (classes + 1) % len(CLASSES)) <= 0.25


@pytest.mark.parametrize("sampler", ["sjd", "lantern", "gsd"])
def test_greedy_speculative_draws_the_ar_image_on_cuda(sampler: str, pipes) -> None:
    """fp32, CFG 4, greedy: every rule keeps only the target's argmax, so the images are vanilla AR's, in fewer
    forward passes on the trained model."""
    pipe = pipes["fp32"]
    ar = pipe(CLASSES, sampler="ar", temperature=0.0)
    out = pipe(CLASSES, sampler=sampler, temperature=0.0)
    assert torch.equal(out.tokens, ar.tokens), f"{int((out.tokens != ar.tokens).sum())} tokens differ"
    assert out.stats.forward_passes < ar.stats.forward_passes
