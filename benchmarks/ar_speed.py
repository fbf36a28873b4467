"""Tokens/s of vgen's ARSampler against a naive no-cache loop and, optionally, LlamaGen's own generate().

All methods run in one process on the same weights, dtype, token count, batch, guidance and filters, each
warmed up once (the warm-up call of a compiled method includes its compilation and is reported apart); repeats
are interleaved so background load hits them alike. LlamaGen's GPT is built from a local clone
(``--llamagen-repo``; its code is imported, never copied) and loaded strictly with vgen's state dict. Every
method draws from a generator seeded alike, so the last column shows how many tokens equal vgen's (eager).

``--compile [MODE]`` adds ``ARSampler(compile=MODE)`` and, with ``--llamagen-repo``, LlamaGen's generate() on
its model compiled the way its ``sample_c2i.py --compile`` does (``torch.compile(gpt_model,
mode="reduce-overhead", fullgraph=True)``), so eager is compared with eager and compiled with compiled.

    python benchmarks/ar_speed.py --gpt-model default --tokens 256 --batch 8 --cfg-scale 2.0 --no-naive \
        --compile --threads 1 --llamagen-repo /tmp/llamagen
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vgen.models.llamagen import GPT_SIZES, GPTConfig, LlamaGenGPT, gpt_config
from vgen.samplers import ARSampler, SamplingParams, apply_cfg, build_processors, sample_logits
from vgen.samplers.compiling import COMPILE_MODES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TINY = dict(dim=128, n_layer=2, n_head=4, vocab_size=1024, num_classes=10, multiple_of=64)
# the architecture of vgen's embedded default model (random weights here)
DEFAULT = dict(dim=256, n_layer=8, n_head=8, vocab_size=4096, num_classes=8, multiple_of=64)
VGEN, VGEN_COMPILED = "vgen ARSampler (KV cache)", "vgen ARSampler, compiled"
LLAMAGEN, LLAMAGEN_COMPILED = "LlamaGen generate()", "LlamaGen generate(), compiled"

Method = Callable[[int], torch.Tensor]  # seed -> tokens [B, N]


def build_config(args: argparse.Namespace) -> GPTConfig:
    if args.gpt_model in ("tiny", "default"):
        return GPTConfig(**(TINY if args.gpt_model == "tiny" else DEFAULT), block_size=args.tokens)
    return gpt_config(args.gpt_model, block_size=args.tokens)


def random_model(config: GPTConfig, dtype: torch.dtype, device: str) -> LlamaGenGPT:
    """Random weights with a non-zero output layer (zero at init would make every distribution uniform)."""
    torch.manual_seed(0)
    model = LlamaGenGPT(config)
    torch.nn.init.normal_(model.output.weight, std=0.02)
    return model.eval().to(device=device, dtype=dtype)


def naive_loop(model: LlamaGenGPT, class_ids: torch.Tensor, params: SamplingParams,
               generator: torch.Generator) -> torch.Tensor:
    """LlamaGen's sampling without a cache: every step reruns ``model.forward`` over the whole prefix."""
    cond = torch.cat([class_ids, model.null_condition(class_ids)]) if params.guided else class_ids
    processors = build_processors(params)
    seq = class_ids.new_zeros(len(class_ids), 0)
    for t in range(model.num_tokens):
        logits = model(cond, torch.cat([seq, seq]) if params.guided else seq)[:, -1]
        token = sample_logits(processors(apply_cfg(logits, params, t)), params.greedy, generator)[0]
        seq = torch.cat([seq, token[:, None]], dim=1)
    return seq


def llamagen_method(repo: Path, model: LlamaGenGPT, class_ids: torch.Tensor, params: SamplingParams,
                    args: argparse.Namespace, compile: bool = False) -> Method:
    """LlamaGen's generate() on its own GPT class, loaded with ``model``'s weights; ``compile`` wraps that model
    as LlamaGen's sample_c2i.py does with --compile."""
    sys.path.insert(0, str(repo))
    from autoregressive.models.generate import generate
    from autoregressive.models.gpt import ModelArgs, Transformer

    c = model.config
    theirs = Transformer(ModelArgs(
        dim=c.dim, n_layer=c.n_layer, n_head=c.n_head, n_kv_head=c.n_kv_head, multiple_of=c.multiple_of,
        ffn_dim_multiplier=c.ffn_dim_multiplier, rope_base=c.rope_base, norm_eps=c.norm_eps,
        vocab_size=c.vocab_size, num_classes=c.num_classes, block_size=c.block_size, cls_token_num=1,
        model_type="c2i", token_dropout_p=0.0, resid_dropout_p=0.0, ffn_dropout_p=0.0))
    theirs.load_state_dict(model.state_dict(), strict=True)
    theirs = theirs.eval().to(device=args.device, dtype=model.output.weight.dtype)
    if compile:
        theirs = torch.compile(theirs, mode="reduce-overhead", fullgraph=True)

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)  # generate() draws from the global generator
        return generate(theirs, class_ids, model.num_tokens, cfg_scale=params.cfg_scale,
                        cfg_interval=params.cfg_interval, temperature=params.temperature, top_k=params.top_k,
                        top_p=params.top_p, sample_logits=not params.greedy).long()

    return run


def timed(method: Method, seed: int, device: str) -> tuple[float, float, torch.Tensor]:
    """Wall seconds, this process's CPU seconds (less sensitive to other jobs on a shared CPU) and the tokens."""
    if device == "cuda":
        torch.cuda.synchronize()
    start, cpu = time.perf_counter(), time.process_time()
    tokens = method(seed)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, time.process_time() - cpu, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpt-model", default="tiny", choices=["tiny", "default", *GPT_SIZES],
                   help="tiny: 2 layers, dim 128; default: vgen's embedded model (8 layers, dim 256, vocab 4096)")
    p.add_argument("--tokens", type=int, default=64, help="image tokens (a square: 64, 256, 576, ...)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch CPU threads (1 avoids stalls on a shared machine)")
    p.add_argument("--no-naive", action="store_true", help="skip the (quadratic) no-cache loop")
    p.add_argument("--llamagen-repo", type=Path, help="local clone of FoundationVision/LlamaGen")
    p.add_argument("--compile", nargs="?", const="default", choices=COMPILE_MODES,
                   help="also time compiled methods: ARSampler(compile=MODE) and LlamaGen as its sample script")
    p.add_argument("--no-llamagen-eager", action="store_true", help="skip LlamaGen's eager generate()")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            cfg_scale=args.cfg_scale)
    model = random_model(build_config(args), DTYPES[args.dtype], args.device)
    class_ids = torch.arange(args.batch, device=args.device) % model.num_classes

    def generator(seed: int) -> torch.Generator:
        return torch.Generator(device=args.device).manual_seed(seed)

    def vgen_ar(sampler: ARSampler) -> Method:
        return lambda seed: sampler.sample(model, class_ids, params, generator=generator(seed)).tokens

    @torch.no_grad()
    def naive(seed: int) -> torch.Tensor:
        return naive_loop(model, class_ids, params, generator(seed))

    methods: dict[str, Method] = {VGEN: vgen_ar(ARSampler())}
    if args.compile:
        methods[VGEN_COMPILED] = vgen_ar(ARSampler(compile=args.compile))
    if not args.no_naive:
        methods["naive loop (no cache)"] = naive
    if args.llamagen_repo:
        if not args.no_llamagen_eager:
            methods[LLAMAGEN] = llamagen_method(args.llamagen_repo, model, class_ids, params, args)
        if args.compile:
            methods[LLAMAGEN_COMPILED] = llamagen_method(args.llamagen_repo, model, class_ids, params, args, True)

    first: dict[str, float] = {}
    for name, method in methods.items():  # warm-up (and compilation)
        first[name] = timed(method, 0, args.device)[0]
    times: dict[str, list[float]] = {name: [] for name in methods}
    cpu_times: dict[str, list[float]] = {name: [] for name in methods}
    outputs: dict[str, torch.Tensor] = {}
    for r in range(args.repeats):
        for name, method in methods.items():
            seconds, cpu_seconds, outputs[name] = timed(method, r + 1, args.device)
            times[name].append(seconds)
            cpu_times[name].append(cpu_seconds)

    n = args.batch * model.num_tokens
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    cpu = {name: statistics.median(seconds) for name, seconds in cpu_times.items()}
    reference = outputs[VGEN]
    threads = f"{torch.get_num_threads()} thread(s), " if args.device == "cpu" else ""
    print(f"{args.gpt_model}, {model.num_tokens} tokens, batch {args.batch}, cfg {args.cfg_scale}, "
          f"{args.dtype}, {args.device}, {threads}torch {torch.__version__}, median of {args.repeats} "
          f"(after one warm-up){', vgen compile=' + repr(args.compile) if args.compile else ''}\n")
    print("| method | first call s | median s | tokens/s | median CPU s | tokens equal to vgen eager's |")
    print("|---|---|---|---|---|---|")
    for name in methods:
        agree = (outputs[name].to(reference.device) == reference).float().mean().item()
        print(f"| {name} | {first[name]:.1f} | {median[name]:.3f} | {n / median[name]:.1f} | {cpu[name]:.3f} "
              f"| {agree:.1%} |")
    pairs = [(VGEN, LLAMAGEN, "eager vs eager"), (VGEN_COMPILED, LLAMAGEN_COMPILED, "compiled vs compiled"),
             (VGEN_COMPILED, LLAMAGEN, "vgen compiled vs LlamaGen eager"),
             (VGEN_COMPILED, VGEN, "vgen compiled vs vgen eager"), (VGEN, "naive loop (no cache)", "cache vs none")]
    rows = [(label, median[b] / median[a], cpu[b] / cpu[a]) for a, b, label in pairs if a in median and b in median]
    if rows:
        print("\n| comparison | tokens/s ratio (wall) | ratio of CPU time |\n|---|---|---|")
        for label, ratio, cpu_ratio in rows:
            print(f"| {label} | {ratio:.2f}x | {cpu_ratio:.2f}x |")


if __name__ == "__main__":
    main()
