"""Dispatch: the torch reference on CPU and where Triton is off, the kernel on CUDA or when forced; forced Triton
runs the kernel (never quietly the reference), and seeded sampler runs draw the same tokens on both sides."""

import re

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")

from vgen.kernels import dispatch, probs, use_backend  # noqa: E402
from vgen.kernels.common import recording  # noqa: E402
from vgen.kernels.dispatch import choose  # noqa: E402
from vgen.models.llamagen import GPTConfig  # noqa: E402
from vgen.samplers import SamplingParams, get_sampler  # noqa: E402
from vgen.samplers.logits import target_probs  # noqa: E402
from vgen.samplers.speculative.exact import ExactRule  # noqa: E402
from vgen.samplers.speculative.rules import accept_drafts  # noqa: E402

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_picks_triton_only_for_cuda_tensors(monkeypatch) -> None:
    monkeypatch.delenv("VGEN_DISABLE_TRITON", raising=False)
    assert choose("probs", CPU) == "torch"
    assert choose("probs", CUDA) == "triton"


def test_without_triton_auto_runs_the_reference_and_forcing_it_raises(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    assert choose("probs", CUDA) == "torch"
    with use_backend("triton"), pytest.raises(RuntimeError, match=re.escape('pip install -e ".[triton]"')):
        choose("probs", CUDA)


def test_forcing_a_kernel_on_cpu_tensors_needs_the_interpreter(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "_INTERPRETED", False)
    monkeypatch.delenv("TRITON_INTERPRET")
    with use_backend("triton"):
        assert choose("probs", CUDA) == "triton"
        with pytest.raises(RuntimeError, match="needs Triton's interpreter"):
            choose("probs", CPU)


ALL = {"probs", "accept", "residual"}


@pytest.mark.parametrize(("value", "off"), [("1", ALL), ("all", ALL), ("accept, residual", {"accept", "residual"}),
                                            ("0", set()), ("", set())])
def test_vgen_disable_triton_switches_ops_off(value: str, off: set, monkeypatch) -> None:
    monkeypatch.setenv("VGEN_DISABLE_TRITON", value)
    for op in ALL:
        assert choose(op, CUDA) == ("torch" if op in off else "triton")


def test_use_backend_forces_a_side_and_restores_the_last() -> None:
    with use_backend("torch"):
        assert choose("probs", CUDA) == "torch"
        with use_backend("triton"):
            assert choose("probs", CPU) == "triton"  # the interpreter is loaded (conftest)
        assert choose("probs", CUDA) == "torch"
    assert choose("probs", CPU) == "torch"
    message = "backend must be one of ['auto', 'torch', 'triton'], got 'cuda'"
    with pytest.raises(ValueError, match=re.escape(message)), use_backend("cuda"):
        pass


def test_a_forced_call_launches_the_kernel() -> None:
    logits = torch.randn(2, 3, 10)
    with use_backend("triton"), recording() as launches:
        target_probs(logits, SamplingParams(top_k=3), torch.arange(3))
    assert [kernel for kernel, _, _ in launches] == [probs.probs_kernel]
    with recording() as launches:
        target_probs(logits, SamplingParams(top_k=3), torch.arange(3))  # auto on CPU: the reference
    assert launches == []


def test_a_forced_call_without_a_kernel_raises() -> None:
    class Custom(ExactRule):
        pass

    p = torch.full((1, 2, 4), 0.25)
    args = (Custom(), p, p, torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
    assert accept_drafts(*args).tolist() == [2]  # auto: the reference
    with use_backend("triton"), pytest.raises(NotImplementedError, match="op 'accept' has no kernel"):
        accept_drafts(*args)


class FakeTokenizer(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vectors = torch.randn(vocab, 4, generator=torch.Generator().manual_seed(0))

    def codebook(self) -> torch.Tensor:
        return self.vectors


SPECULATIVE = {"probs_kernel", "accept_kernel", "residual_kernel"}
RUNS = {
    "sjd-cfg": ("sjd", dict(window=4), SamplingParams(cfg_scale=2.0, temperature=0.8)),
    "lantern": ("lantern", dict(window=4, lantern_k=6, lantern_delta=0.3), SamplingParams()),
    "lantern++": ("lantern", dict(window=4, lantern_k=6, lantern_delta=3.0, lantern_mode="relative"),
                  SamplingParams(top_p=0.9)),
    "gsd": ("gsd", dict(window=4, gsd_rank_window=3, gsd_dist_threshold=50.0), SamplingParams(cfg_scale=2.0)),
    "match-greedy": ("speculative", dict(window=4, accept="match", draft_init="left"),
                     SamplingParams(temperature=0.0, cfg_scale=2.0)),
    "ar-top-k": ("ar", {}, SamplingParams(top_k=8, cfg_scale=2.0)),
}


@pytest.mark.parametrize(("name", "options", "params"), RUNS.values(), ids=RUNS.keys())
def test_seeded_sampler_runs_agree_on_both_sides(name: str, options: dict, params: SamplingParams,
                                                 tiny_gpt_factory, launched) -> None:
    config = GPTConfig(vocab_size=48, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=16)
    model, tokenizer = tiny_gpt_factory(config), FakeTokenizer(config.vocab_size)
    sampler = get_sampler(name, **options)

    def run():
        return sampler.sample(model, torch.tensor([0, 2]), params, generator=torch.Generator().manual_seed(3),
                              tokenizer=tokenizer)

    reference = run()
    assert launched == []  # auto on CPU: the references
    with use_backend("triton"):
        kernel = run()
    assert torch.equal(kernel.tokens, reference.tokens)
    assert kernel.stats.accepted_lengths == reference.stats.accepted_lengths
    assert set(launched) == ({"probs_kernel"} if name == "ar" else SPECULATIVE)  # the sampler calls every op
    if name != "ar":
        assert max(reference.stats.accepted_lengths) > 1  # drafts were kept and rejected
