"""Compile every kernel variant the samplers launch for a GPU, on a machine that may have none.

Triton's interpreter runs a kernel's Python on CPU, but it is not the compiler: typing rules, compile-time
constants and register allocation are only checked by compiling. This records the launches the three ops make
at LlamaGen sizes (vocabulary 16384, window 16, 8 samples with CFG; every rule and mode, greedy and sampled) and
compiles each to a cubin for sm_90 with the ptxas that ships in the triton wheel, reporting its registers and
spills. Run it without ``TRITON_INTERPRET``:

    python -m vgen.kernels.aot
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

from vgen.kernels import accept, probs, residual
from vgen.kernels.common import recording
from vgen.kernels.spec import RuleSpec, SamplingSpec

SM90 = GPUTarget("cuda", 90, 32)


@dataclass(frozen=True)
class Compiled:
    """One compiled variant: its kernel, compile-time constants, warps, and what ptxas reported."""

    kernel: str
    constants: dict[str, Any]
    num_warps: int
    registers: int
    spill_bytes: int


def sampler_launches(vocab: int = 16384, window: int = 16, batch: int = 8, lantern_k: int = 1000,
                     embedding_dim: int = 768) -> list[tuple[Any, tuple, dict]]:
    """The launches the ops make for one verify step of every rule (inputs are uninitialised: nothing runs)."""
    drafted = window - 1
    logits = torch.empty(2 * batch, window, vocab)
    p, q = torch.empty(batch, window, vocab), torch.empty(batch, drafted, vocab)
    drafts, uniforms = torch.zeros(batch, drafted, dtype=torch.long), torch.empty(batch, drafted)
    valid, at = torch.ones(batch, drafted, dtype=torch.bool), torch.zeros(batch, dtype=torch.long)
    neighbours = torch.zeros(vocab, lantern_k, dtype=torch.long)
    # every built-in rule; GSD with the sampler's default rank window of 7, a compile-time constant
    rules = [RuleSpec("exact"), RuleSpec("match"), RuleSpec("lantern", neighbours=neighbours, delta=0.1),
             RuleSpec("lantern", neighbours=neighbours, delta=2.0, relative=True),
             RuleSpec("gsd", embeddings=torch.empty(vocab, embedding_dim), rank_window=7, p_threshold=0.15,
                      dist_threshold=0.5)]
    guide = torch.ones(window, dtype=torch.bool)
    with recording() as launches:
        for settings in (SamplingSpec(temperature=0.9, top_k=2000, top_p=0.95, cfg_scale=4.0, guided=True),
                         SamplingSpec(), SamplingSpec(temperature=0.0, cfg_scale=4.0, guided=True, greedy=True)):
            probs.target_probs(logits if settings.guided else logits[:batch], settings, guide)
        for rule in rules:
            accept.accept_drafts(rule, p[:, :-1], q, drafts, drafts, uniforms, valid)
            for draws in (uniforms[:, 0], None):
                residual.recover(rule, p, q, drafts, drafts, at, draws)
    return launches


def ptxas_report(ptx: str, arch: int = 90) -> tuple[int, int]:
    """Registers per thread and spill-store bytes that ``ptxas -v`` reports for ``ptx``."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}a", str(source), "-o",
                              str(Path(tmp) / "kernel.cubin")], check=True, capture_output=True, text=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return int(registers.group(1)) if registers else 0, int(spills.group(1)) if spills else 0


def compile_launch(kernel: Any, args: tuple, options: dict, target: GPUTarget = SM90) -> Compiled:
    """Compile one recorded launch for ``target``."""
    names = kernel.arg_names
    constant_names = [names[i] for i in kernel.constexprs]
    bound = {**dict(zip(names, args)), **{k: v for k, v in options.items() if k in names}}
    signature = {n: "constexpr" if n in constant_names else mangle_type(bound[n]) for n in names}
    constants = {n: bound[n] for n in constant_names}
    compile_options = {k: v for k, v in options.items() if k not in names}
    out = triton.compile(ASTSource(kernel, signature, constexprs=constants), target=target, options=compile_options)
    registers, spills = ptxas_report(out.asm["ptx"], target.arch)
    return Compiled(kernel.__name__, constants, compile_options["num_warps"], registers, spills)


def main() -> None:
    for kernel, args, options in sampler_launches():
        c = compile_launch(kernel, args, options)
        print(f"{c.kernel:16s} warps {c.num_warps:2d}  registers {c.registers:3d}  spill bytes {c.spill_bytes:4d}  "
              f"{c.constants}")


if __name__ == "__main__":
    main()
