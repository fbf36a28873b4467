"""Wall-clock time of vanilla AR against the speculative samplers on random text-to-image models of the released
sizes, at each batch size: a LlamaGen-T2I GPT-XL (120 caption positions of 2048-d T5 features, 256 px = 16 x 16
tokens of 16,384 codes), a Janus-Pro-1B built from a ``transformers`` ``JanusConfig`` (Llama of width 2048, 24
layers, 16 heads; 16,384 codes, 384 px = 24 x 24 tokens; the understanding encoder, unused by generation, shrunk),
and the two models with fixed tokens among their codes (vgen's ``LayoutLM``): Emu3-Gen (``transformers``' Emu3Config
defaults: Llama of width 4096, 32 layers, 8 KV heads, 184,622 words; 32,768 codes, 720 px = 90 x 90 codes, an
end-of-line token after each row) and Lumina-mGPT-7B (Chameleon-7B: width 4096, 32 layers of 32 heads with q/k
LayerNorm, 65,536 words; 8,192 codes, 768 px = 48 x 48 codes, a new-line token after each row, three header tokens).
Those two are built on the meta device, moved with ``to_empty`` and filled with N(0, 0.02): no random init of 7-8B
values on the CPU. Their speculative samplers see codes only; every count below (passes, tokens, compression) is of
image codes. ``--rows R`` keeps their first R rows of codes (the width and the layout stay): later rows cost more
than these, since their attention reads a longer cache. For them LANTERN's neighbourhoods come from a random codebook
of the VQ's shape (nothing is decoded).

Nothing is read or downloaded: the weights are random and the prompts are random caption features (LlamaGen-T2I,
no T5) or random token ids (Janus) of different lengths per row. Random weights give near-flat next-token
distributions, unlike a trained model's, so how many drafts a sampler accepts here says nothing about the released
models: the step compression below is an artefact of the random weights. What carries over is the cost of a pass
(ms per pass) and AR's time; a released model's latency ratio is about its step compression x AR's ms per pass /
the sampler's. Each model uses its release's sampling settings (LlamaGen-T2I: CFG 7.5, top-k 1000; Janus: CFG 5;
Emu3: CFG 3 against a 45-token negative prompt, top-k 2048; Lumina-mGPT: CFG 3 against its header, top-k 2000).

Every (model, batch, sampler) is warmed up once untimed, then ``--repeats`` timed runs are interleaved across the
samplers (same seed each); the table gives the median, and on a GPU the peak memory allocated while drawing each
batch (weights included). Writes ``t2i_speed.json`` and ``t2i_speed.md`` to ``--out`` (after each model, so a run
cut short keeps what it measured).

    python benchmarks/t2i_speed.py --device cuda --dtype bf16 --out t2i_speed     # on a GPU
    python benchmarks/t2i_speed.py --models emu3-gen lumina-mgpt-7b --batch-sizes 1 4 --rows 8 --out t2i_mllm
    python benchmarks/t2i_speed.py --tiny --out /tmp/t2i_speed                    # a CPU dry run on tiny models
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vgen.models.chameleon import lumina_config, size_token
from vgen.models.conditioning import PrefixCondition
from vgen.models.emu3 import emu3_code_ids, emu3_config
from vgen.models.janus import JanusVQ, janus_t2i_from_transformers
from vgen.models.llamagen import GPTConfig, LlamaGenGPT, llamagen_t2i_config_for
from vgen.models.mllm import LayoutLM, MLLMConfig
from vgen.pipelines import LLAMAGEN_T2I_DEFAULTS
from vgen.samplers import SamplingParams, get_sampler
from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODELS = ("llamagen-t2i", "janus-pro-1b", "emu3-gen", "lumina-mgpt-7b")
NOTE = ("random weights: near-flat next-token distributions make the acceptance, and so the step compression, "
        "unlike a trained model's; the ms per pass and AR's times are what carry over to the released weights")
# Janus-Pro's prompt token ids (any ids inside the text vocabulary time the same)
JANUS_BOS, JANUS_PAD, JANUS_BOI = 100000, 100015, 100016
# Emu3-Gen's vocabulary: Qwen's words, <|extra_k|> = 151646 + k (end of line 200, end of frame 201), the image tokens,
# then its 32,768 visual tokens from 151854 on (any ids inside the vocabulary time the same)
EMU3_EOL, EMU3_EOF, EMU3_EOI, EMU3_VISUAL = 151846, 151847, 151852, 151854
EMU3_NEGATIVE_TOKENS = 45  # about the docs' negative prompt (emu3.NEGATIVE_PROMPT) with BOS
# Chameleon's vocabulary: image codes at ids 4.., <eoss> 8196, <racm3:break> 8197, <reserved{n:05d}> = 8804 + n - 8800
CHAMELEON_SPECIALS = {"<eoss>": 8196, "<racm3:break>": 8197, "<reserved08799>": 8803}


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


class Codebook(torch.nn.Module):
    """A VQ model's codebook alone (random, of the released shape): all a sampler asks of a tokenizer (LANTERN's
    neighbourhoods)."""

    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size, dim))

    @property
    def codebook_size(self) -> int:
        return self.weight.shape[0]

    def codebook(self) -> torch.Tensor:
        return self.weight


def emu3_gen_config(tiny: bool, rows: int | None = None) -> tuple[MLLMConfig, torch.Tensor]:
    """Emu3-Gen's backbone config through :func:`~vgen.models.emu3.emu3_config` (``transformers``' Emu3Config defaults,
    no generation config: the original's CFG 3 and top-k 2048) at 720 px, or a tiny one of 4 x 4 codes; ``rows``
    caps the rows of codes; with the text id of each code."""
    import transformers

    codes, vocab_size = (64, 256) if tiny else (32768, 184622)
    visual = vocab_size - codes
    specials = (100, 101, 102) if tiny else (EMU3_EOL, EMU3_EOF, EMU3_EOI)
    vocab = {"<|extra_200|>": specials[0], "<|extra_201|>": specials[1], "<|image end|>": specials[2],
             **{f"<|visual token {c:06d}|>": visual + c for c in range(codes)}}
    text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
                eos_token_id=2) if tiny else {}
    hf = transformers.Emu3Config(text_config=text or None, vq_config=dict(codebook_size=codes), vocabulary_map=vocab)
    config = emu3_config(hf, transformers.GenerationConfig(), image_area=(32 if tiny else 720) ** 2)
    return _capped(config, rows), emu3_code_ids(vocab, codes)


def lumina_7b_config(tiny: bool, rows: int | None = None) -> tuple[MLLMConfig, torch.Tensor]:
    """Lumina-mGPT-7B's backbone config through :func:`~vgen.models.chameleon.lumina_config` (Chameleon-7B's sizes,
    Lumina's CFG 3 and top-k 2000) at 768 px, or a tiny one at 64 px (4 x 4 codes); ``rows`` caps the rows of codes;
    with the text id of each code."""
    size = 64 if tiny else 768
    codes = 64 if tiny else 8192
    hf = dict(vocab_size=65536, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rope_theta=10000.0,
              rms_norm_eps=1e-5, model_parallel_size=1, swin_norm=False, mask_image_logits=False)
    if tiny:
        hf.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=512)
    vocab = {**CHAMELEON_SPECIALS, size_token(size): 8804 + size // 32}
    code_ids = torch.arange(4, 4 + codes)
    return _capped(lumina_config(hf, vocab, code_ids.tolist(), size), rows), code_ids


def _capped(config: MLLMConfig, rows: int | None) -> MLLMConfig:
    """``config`` with at most ``rows`` rows of codes."""
    return config if rows is None else dataclasses.replace(config, image_rows=min(rows, config.image_rows))


def layout_lm(config: MLLMConfig, code_ids: torch.Tensor, device: str, dtype: torch.dtype) -> LayoutLM:
    """A :class:`LayoutLM` of ``config`` with N(0, 0.02) weights in ``dtype`` (norms at 1), built on the meta device
    and moved with ``to_empty``."""
    with torch.device("meta"):
        model = LayoutLM(config).to(dtype)
    model = model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 or "norm" in name:
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            else:
                p.normal_(std=0.02)
        model.code_ids.copy_(code_ids)
    return model.eval()


def emu3_gen(tiny: bool, device: str, dtype: torch.dtype,
             rows: int | None = None) -> tuple[LayoutLM, Codebook, SamplingParams]:
    """A random Emu3-Gen backbone (:func:`emu3_gen_config`) and a codebook of its VQ's shape (32,768 x 4)."""
    config, code_ids = emu3_gen_config(tiny, rows)
    with torch.device(device):
        codebook = Codebook(config.vocab_size, 4)
    return (layout_lm(config, code_ids, device, dtype), codebook,
            SamplingParams(cfg_scale=config.cfg_scale, top_k=config.top_k))


def lumina_mgpt(tiny: bool, device: str, dtype: torch.dtype,
                rows: int | None = None) -> tuple[LayoutLM, Codebook, SamplingParams]:
    """A random Lumina-mGPT-7B backbone (:func:`lumina_7b_config`) and a codebook of its VQGAN's shape (8,192 x
    256)."""
    config, code_ids = lumina_7b_config(tiny, rows)
    with torch.device(device):
        codebook = Codebook(config.vocab_size, 8 if tiny else 256)
    return (layout_lm(config, code_ids, device, dtype), codebook,
            SamplingParams(cfg_scale=config.cfg_scale, top_k=config.top_k))


def layout_prompts(model: LayoutLM, lengths: list[int], device: str) -> PrefixCondition:
    """Left-padded random prompt ids ending in the model's header (Lumina-mGPT's; Emu3 has none), and for a model
    without a header (Emu3) a negative prompt of :data:`EMU3_NEGATIVE_TOKENS` random ids as every row's null."""
    c = model.config
    width = max(lengths)
    mask = torch.arange(width)[None] >= width - torch.tensor(lengths)[:, None]
    values = torch.randint(0, c.text_vocab_size, (len(lengths), width)).masked_fill(~mask, c.pad_token_id)
    if c.head_tokens:
        values[:, -len(c.head_tokens):] = torch.tensor(c.head_tokens)
        null = None
    else:
        negative = torch.randint(0, c.text_vocab_size, (len(lengths), EMU3_NEGATIVE_TOKENS))
        null = PrefixCondition(negative.to(device), torch.ones_like(negative, dtype=torch.bool, device=device))
    return PrefixCondition(values.to(device), mask.to(device), null)


BUILDERS: dict[str, tuple[Callable, Callable, list[int]]] = {
    # builder, prompts, the prompts' real lengths (cycled over a batch)
    "llamagen-t2i": (llamagen_t2i, llamagen_t2i_prompts, [12, 30, 21, 45, 8, 17, 38, 25]),
    "janus-pro-1b": (janus_pro, janus_prompts, [24, 40, 31, 55, 19, 28, 47, 35]),
    "emu3-gen": (emu3_gen, layout_prompts, [18, 34, 25, 49, 13, 22, 41, 29]),
    "lumina-mgpt-7b": (lumina_mgpt, layout_prompts, [30, 46, 37, 61, 25, 34, 53, 41]),
}
LAYOUT_MODELS = ("emu3-gen", "lumina-mgpt-7b")  # --rows applies to these
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
    capped = {"rows": args.rows} if name in LAYOUT_MODELS else {}
    model, tokenizer, params = build(args.tiny, args.device, DTYPES[args.dtype], **capped)
    cuda = args.device.startswith("cuda")
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
        outs, peaks = {}, {}
        for _ in range(args.repeats):
            for s in args.samplers:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                outs[s], t = draw(s)
                times[s].append(t)
                peaks[s] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        ar_passes = model.num_tokens  # vanilla AR: one pass per token, the prefill's included
        ar_time = statistics.median(times["ar"]) if "ar" in times else None
        for s in args.samplers:
            stats, wall = outs[s].stats, statistics.median(times[s])
            rows.append({"model": name, "grid": list(model.grid), "batch": batch, "sampler": s,
                         "forward_passes": stats.forward_passes, "peak_memory_gib": peaks[s],
                         "step_compression": ar_passes / stats.forward_passes, "wall_s": wall,
                         "ms_per_pass": 1000 * wall / stats.forward_passes,
                         "speed_vs_ar": ar_time / wall if ar_time else None,
                         "tokens_per_s": stats.tokens / wall, "tokens_per_forward": stats.tokens_per_forward})
            print(f"{name} batch {batch} {s}: {stats.forward_passes} passes, {wall:.2f} s", flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"# Text-to-image sampler speed ({result['device']}, {result['dtype']})", "", f"Note: {NOTE}.", "",
             "| model | codes (rows x columns) | batch | sampler | forward passes | step compression | wall time | "
             "ms per pass | speed vs ar | tokens/s | peak memory |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        speed = f"{r['speed_vs_ar']:.2f}x" if r["speed_vs_ar"] is not None else "-"
        peak = f"{r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] is not None else "-"
        lines.append(f"| {r['model']} | {r['grid'][0]} x {r['grid'][1]} | {r['batch']} | {r['sampler']} | "
                     f"{r['forward_passes']} | {r['step_compression']:.2f}x | {r['wall_s']:.2f} s | "
                     f"{r['ms_per_pass']:.1f} | {speed} | {r['tokens_per_s']:.0f} | {peak} |")
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
    ap.add_argument("--rows", type=int, default=None, metavar="R",
                    help=f"draw only the first R rows of codes of {' and '.join(LAYOUT_MODELS)} (default: all)")
    ap.add_argument("--tiny", action="store_true", help="tiny models of the same kinds (a dry run, e.g. on a CPU)")
    ap.add_argument("--out", default="t2i_speed", help="folder for t2i_speed.json and t2i_speed.md")
    args = ap.parse_args()
    if args.repeats < 1 or min(args.batch_sizes) < 1 or (args.rows is not None and args.rows < 1):
        ap.error("--repeats, --batch-sizes and --rows must be >= 1")
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"device": device_name, "torch": torch.__version__,
              "transformers": importlib.metadata.version("transformers"), "dtype": args.dtype, "tiny": args.tiny,
              "repeats": args.repeats, "rows_cap": args.rows, "note": NOTE, "rows": []}
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
