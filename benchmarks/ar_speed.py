"""Tokens/s of vgen's ARSampler against a naive no-cache loop and, optionally, LlamaGen's own generate().

All methods run in one process on the same weights, dtype, token count, batch, guidance and filters, each
warmed up once; repeats are interleaved so background load hits them alike. LlamaGen's GPT is built from a
local clone (``--llamagen-repo``; its code is imported, never copied) and loaded strictly with vgen's state
dict. Every method draws from a generator seeded alike, so the last column shows how many tokens equal vgen's.

    python benchmarks/ar_speed.py --gpt-model GPT-B --tokens 64 --cfg-scale 4.0 --llamagen-repo /tmp/LlamaGen
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

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TINY = dict(dim=128, n_layer=2, n_head=4, vocab_size=1024, num_classes=10, multiple_of=64)

Method = Callable[[int], torch.Tensor]  # seed -> tokens [B, N]


def build_config(args: argparse.Namespace) -> GPTConfig:
    if args.gpt_model == "tiny":
        return GPTConfig(**TINY, block_size=args.tokens)
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
                    args: argparse.Namespace) -> Method:
    """LlamaGen's generate() on its own GPT class, loaded with ``model``'s weights."""
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

    def run(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)  # generate() draws from the global generator
        return generate(theirs, class_ids, model.num_tokens, cfg_scale=params.cfg_scale,
                        cfg_interval=params.cfg_interval, temperature=params.temperature, top_k=params.top_k,
                        top_p=params.top_p, sample_logits=not params.greedy).long()

    return run


def timed(method: Method, seed: int, device: str) -> tuple[float, torch.Tensor]:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = method(seed)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpt-model", default="tiny", choices=["tiny", *GPT_SIZES])
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
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            cfg_scale=args.cfg_scale)
    model = random_model(build_config(args), DTYPES[args.dtype], args.device)
    class_ids = torch.arange(args.batch, device=args.device) % model.num_classes

    def generator(seed: int) -> torch.Generator:
        return torch.Generator(device=args.device).manual_seed(seed)

    def vgen_ar(seed: int) -> torch.Tensor:
        return ARSampler().sample(model, class_ids, params, generator=generator(seed)).tokens

    @torch.no_grad()
    def naive(seed: int) -> torch.Tensor:
        return naive_loop(model, class_ids, params, generator(seed))

    methods: dict[str, Method] = {"vgen ARSampler (KV cache)": vgen_ar}
    if not args.no_naive:
        methods["naive loop (no cache)"] = naive
    if args.llamagen_repo:
        methods["LlamaGen generate()"] = llamagen_method(args.llamagen_repo, model, class_ids, params, args)

    for method in methods.values():  # warm-up
        method(0)
    times: dict[str, list[float]] = {name: [] for name in methods}
    outputs: dict[str, torch.Tensor] = {}
    for r in range(args.repeats):
        for name, method in methods.items():
            seconds, outputs[name] = timed(method, r + 1, args.device)
            times[name].append(seconds)

    n = args.batch * model.num_tokens
    ours = statistics.median(times["vgen ARSampler (KV cache)"])
    reference = outputs["vgen ARSampler (KV cache)"]
    print(f"{args.gpt_model}, {model.num_tokens} tokens, batch {args.batch}, cfg {args.cfg_scale}, "
          f"{args.dtype}, {args.device}, median of {args.repeats} (after one warm-up)\n")
    print("| method | median s | tokens/s | vgen speed-up | tokens equal to vgen's |")
    print("|---|---|---|---|---|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        agree = (outputs[name].to(reference.device) == reference).float().mean().item()
        print(f"| {name} | {median:.3f} | {n / median:.1f} | {median / ours:.2f}x | {agree:.1%} |")


if __name__ == "__main__":
    main()
