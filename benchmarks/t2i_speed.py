"""Wall-clock time of vanilla AR against the speculative samplers on random text-to-image models of the released
sizes, at each batch size: a LlamaGen-T2I GPT-XL (120 caption positions of 2048-d T5 features, 256 px = 16 x 16
tokens of 16,384 codes) and a Janus-Pro-1B built from a ``transformers`` ``JanusConfig`` (Llama of width 2048, 24
layers, 16 heads; 16,384 codes, 384 px = 24 x 24 tokens; the understanding encoder, unused by generation, shrunk).

Nothing is read or downloaded: the weights are random and the prompts are random caption features (LlamaGen-T2I,
no T5) or random token ids (Janus) of different lengths per row. Random weights give near-flat next-token
distributions, unlike a trained model's, so how many drafts a sampler accepts here says nothing about the released
models: the step compression below is an artefact of the random weights. What carries over is the cost of a pass
(ms per pass) and AR's time; a released model's latency ratio is about its step compression x AR's ms per pass /
the sampler's. Each model uses its release's sampling settings (LlamaGen-T2I: CFG 7.5, top-k 1000; Janus: CFG 5).

Every (model, batch, sampler) is warmed up once untimed, then ``--repeats`` timed runs are interleaved across the
samplers (same seed each); the table gives the median. Writes ``t2i_speed.json`` and ``t2i_speed.md`` to ``--out``
(after each model, so a run cut short keeps what it measured).

    python benchmarks/t2i_speed.py --device cuda --dtype bf16 --out t2i_speed     # on a GPU
    python benchmarks/t2i_speed.py --tiny --out /tmp/t2i_speed                    # a CPU dry run on tiny models
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vgen.models.conditioning import PrefixCondition
from vgen.models.janus import JanusVQ, janus_t2i_from_transformers
from vgen.models.llamagen import GPTConfig, LlamaGenGPT, llamagen_t2i_config_for
from vgen.pipelines import LLAMAGEN_T2I_DEFAULTS
from vgen.samplers import SamplingParams, get_sampler
from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("llamagen-t2i", "janus-pro-1b")
NOTE = ("random weights: near-flat next-token distributions make the acceptance, and so the step compression, "
        "unlike a trained model's; the ms per pass and AR's times are what carry over to the released weights")
# Janus-Pro's prompt token ids (any ids inside the text vocabulary time the same)
JANUS_BOS, JANUS_PAD, JANUS_BOI = 100000, 100015, 100016


def llamagen_t2i(tiny: bool, device: str, dtype: torch.dtype) -> tuple[LlamaGenGPT, VQModel, SamplingParams]:
    """A random LlamaGen-T2I GPT-XL at 256 px with the t2i VQ-16 (LANTERN's codebook), or a tiny one."""
    if tiny:
        config = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, block_size=16, model_type="t2i",
                           caption_dim=16, cls_token_num=10)
        vq_config = VQConfig(codebook_size=64, ch=8, ch_mult=(1, 1), num_res_blocks=1, z_channels=8, norm_groups=4)
    else:
        config = llamagen_t2i_config_for(256)
        vq_config = VQConfig.from_dict({**VQ_CONFIGS["VQ-16"].to_dict(), "codebook_embed_dim": 8})
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaGenGPT(config)
        torch.nn.init.normal_(model.output.weight, std=0.02)  # zero at init: every distribution exactly uniform
        tokenizer = VQModel(vq_config)
    return model.eval().to(dtype), tokenizer.eval(), SamplingParams(**LLAMAGEN_T2I_DEFAULTS)


def llamagen_t2i_prompts(model: LlamaGenGPT, lengths: list[int], device: str) -> PrefixCondition:
    """Left-padded random caption features with zero padding, as LlamaGen's sampler leaves T5's."""
    c = model.config
    mask = torch.arange(c.cls_token_num)[None] >= c.cls_token_num - torch.tensor(lengths)[:, None]
    values = torch.randn(len(lengths), c.cls_token_num, c.caption_dim) * mask[..., None]
    param = next(model.parameters())
    return PrefixCondition(values.to(device=device, dtype=param.dtype), mask.to(device))


def janus_pro(tiny: bool, device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, JanusVQ, SamplingParams]:
    """A random ``JanusForConditionalGeneration`` of Janus-Pro-1B's generation sizes (or a tiny one) as vgen's
    backbone and VQ tokenizer."""
    import transformers

    if tiny:
        text = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)
        vq = transformers.JanusVQVAEConfig(num_embeddings=64, base_channels=32, latent_channels=32,
                                           channel_multiplier=[1, 1], projection_dim=64, image_token_embed_dim=64)
        side = 4
    else:  # Janus-Pro-1B: Llama 2048 x 24 layers, 16 heads (no grouping), FFN 5632, 102,400 words; VQ of 16,384
        text = transformers.LlamaConfig(vocab_size=102400, hidden_size=2048, intermediate_size=5632,
                                        num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                                        rms_norm_eps=1e-6)
        vq = transformers.JanusVQVAEConfig(num_embeddings=16384, embed_dim=8, projection_dim=2048,
                                           image_token_embed_dim=2048)
        side = 24
    vision = transformers.JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                            image_size=16 * side, patch_size=16, projection_dim=text.hidden_size,
                                            num_image_tokens=side * side)
    config = transformers.JanusConfig(text_config=text, vision_config=vision, vq_config=vq)
    ids = (1, 0, 2) if tiny else (JANUS_BOS, JANUS_PAD, JANUS_BOI)
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.JanusForConditionalGeneration(config).eval()
    hf.generation_config = transformers.GenerationConfig(bos_token_id=ids[0], pad_token_id=ids[1], guidance_scale=5)
    hf.generation_config.generation_kwargs = {"boi_token_id": ids[2]}
    model = janus_t2i_from_transformers(hf).to(dtype)
    return model, JanusVQ(hf.model.vqmodel).eval(), SamplingParams(cfg_scale=model.config.cfg_scale)


def janus_prompts(model: torch.nn.Module, lengths: list[int], device: str) -> PrefixCondition:
    """Left-padded random prompt ids: BOS, random words, BOI, as ``janus_condition`` lays a prompt out."""
    c = model.config
    width = max(lengths)
    mask = torch.arange(width)[None] >= width - torch.tensor(lengths)[:, None]
    values = torch.randint(0, c.text_vocab_size, (len(lengths), width)).masked_fill(~mask, c.pad_token_id)
    rows = torch.arange(len(lengths))
    values[rows, width - torch.tensor(lengths)] = c.bos_token_id
    values[:, -1] = c.boi_token_id
    return PrefixCondition(values.to(device), mask.to(device))


BUILDERS: dict[str, tuple[Callable, Callable, list[int]]] = {
    # builder, prompts, the prompts' real lengths (cycled over a batch)
    "llamagen-t2i": (llamagen_t2i, llamagen_t2i_prompts, [12, 30, 21, 45, 8, 17, 38, 25]),
    "janus-pro-1b": (janus_pro, janus_prompts, [24, 40, 31, 55, 19, 28, 47, 35]),
}
TINY_LENGTHS = [3, 7, 5, 9]


def timed(run: Callable[[], object], device: str) -> tuple[object, float]:
    """``run()``'s result and its wall time, synchronised on a GPU."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    out = run()
    sync()
    return out, time.perf_counter() - start


def bench_model(name: str, args: argparse.Namespace) -> list[dict]:
    """One row per batch size and sampler: median wall time, passes, step compression and speed against AR."""
    build, prompts, lengths = BUILDERS[name]
    lengths = TINY_LENGTHS if args.tiny else lengths
    model, tokenizer, params = build(args.tiny, args.device, DTYPES[args.dtype])
    rows = []
    for batch in args.batch_sizes:
        cond = prompts(model, [lengths[i % len(lengths)] for i in range(batch)], args.device)

        def draw(sampler: str, cond: PrefixCondition = cond) -> tuple[object, float]:
            generator = torch.Generator(args.device).manual_seed(args.seed)
            return timed(lambda: get_sampler(sampler).sample(model, cond, params, generator=generator,
                                                             tokenizer=tokenizer), args.device)

        for s in args.samplers:  # warm-up: CUDA's libraries, kernels, LANTERN's neighbourhoods
            draw(s)
        times: dict[str, list[float]] = {s: [] for s in args.samplers}
        outs = {}
        for _ in range(args.repeats):
            for s in args.samplers:
                outs[s], t = draw(s)
                times[s].append(t)
        ar_passes = model.num_tokens  # vanilla AR: one pass per token, the prefill's included
        ar_time = statistics.median(times["ar"]) if "ar" in times else None
        for s in args.samplers:
            stats, wall = outs[s].stats, statistics.median(times[s])
            rows.append({"model": name, "batch": batch, "sampler": s, "forward_passes": stats.forward_passes,
                         "step_compression": ar_passes / stats.forward_passes, "wall_s": wall,
                         "ms_per_pass": 1000 * wall / stats.forward_passes,
                         "speed_vs_ar": ar_time / wall if ar_time else None,
                         "tokens_per_s": stats.tokens / wall, "tokens_per_forward": stats.tokens_per_forward})
            print(f"{name} batch {batch} {s}: {stats.forward_passes} passes, {wall:.2f} s", flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"# Text-to-image sampler speed ({result['device']}, {result['dtype']})", "", f"Note: {NOTE}.", "",
             "| model | batch | sampler | forward passes | step compression | wall time | ms per pass | "
             "speed vs ar | tokens/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        speed = f"{r['speed_vs_ar']:.2f}x" if r["speed_vs_ar"] is not None else "-"
        lines.append(f"| {r['model']} | {r['batch']} | {r['sampler']} | {r['forward_passes']} | "
                     f"{r['step_compression']:.2f}x | {r['wall_s']:.2f} s | {r['ms_per_pass']:.1f} | {speed} | "
                     f"{r['tokens_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--samplers", nargs="+", default=["ar", "mcsjd", "lantern"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per sampler after the warm-up (median)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny models of the same kinds (a dry run, e.g. on a CPU)")
    ap.add_argument("--out", default="t2i_speed", help="folder for t2i_speed.json and t2i_speed.md")
    args = ap.parse_args()
    if args.repeats < 1 or min(args.batch_sizes) < 1:
        ap.error("--repeats and --batch-sizes must be >= 1")
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"device": device_name, "torch": torch.__version__,
              "transformers": importlib.metadata.version("transformers"), "dtype": args.dtype, "tiny": args.tiny,
              "repeats": args.repeats, "note": NOTE, "rows": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.models:  # the files are rewritten after each model
        result["rows"] += bench_model(name, args)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # the model built in bench_model is gone
        (out / "t2i_speed.json").write_text(json.dumps(result, indent=1))
        (out / "t2i_speed.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
