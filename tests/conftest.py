"""Shared pytest fixtures. Each block belongs to one area; add new blocks rather than editing others."""

from __future__ import annotations

import pytest
import torch

# ---- samplers: a tiny LlamaGen GPT with informative (non-flat) logits --------------------------------------
from vgen.models.llamagen import GPTConfig, LlamaGenGPT

TINY_GPT = GPTConfig(vocab_size=64, dim=64, n_layer=2, n_head=4, num_classes=5, block_size=16)


def make_tiny_gpt(config: GPTConfig = TINY_GPT, seed: int = 0) -> LlamaGenGPT:
    """An fp32 eval-mode LlamaGen GPT whose weight matrices are N(0, 0.2) noise (the output layer is zero at
    init, which would make every distribution uniform)."""
    torch.manual_seed(seed)
    model = LlamaGenGPT(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    return model.eval()


@pytest.fixture
def tiny_gpt() -> LlamaGenGPT:
    return make_tiny_gpt()


@pytest.fixture
def tiny_gpt_factory():
    """``make_tiny_gpt`` for tests that need another config or seed."""
    return make_tiny_gpt
# ---- end samplers ------------------------------------------------------------------------------------------


# ---- apps: a tiny pipeline folder for the command line and the web demo --------------------------------------
@pytest.fixture(scope="session")
def tiny_pipeline_dir(tmp_path_factory):
    """A saved 3-class pipeline with 16x16-pixel images (4x4 tokens) whose outputs are not uniform."""
    from vgen.pipelines import ImagePipeline, PipelineInfo
    from vgen.tokenizers.vq import VQConfig, VQModel

    torch.manual_seed(0)
    gpt = LlamaGenGPT(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, num_classes=3, block_size=16))
    with torch.no_grad():
        gpt.output.weight.normal_(std=0.5)
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    info = PipelineInfo(name="tiny", image_size=16, class_names=["a", "b", "c"], defaults={"cfg_scale": 2.0})
    return ImagePipeline(gpt, vq, info).save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny")


@pytest.fixture(scope="session")
def tiny_continuous_pipeline_dir(tmp_path_factory):
    """A saved 3-class continuous-token pipeline (16-px images, 4x4 tokens of 2 channels) with a draft model."""
    from vgen.models.mar import ContinuousAR, MARConfig
    from vgen.pipelines import ImagePipeline, PipelineInfo
    from vgen.tokenizers.kl import KLConfig, KLTokenizer

    def model(seed: int, dim: int) -> ContinuousAR:
        torch.manual_seed(seed)
        return ContinuousAR(MARConfig(token_channels=2, grid_size=4, dim=dim, n_layer=1, n_head=2, num_classes=3,
                                      multiple_of=16, head_width=16, head_depth=1, num_sampling_steps=5,
                                      clip_x0=3.0))

    kl = KLTokenizer(KLConfig(block_out_channels=(8, 8, 8), norm_num_groups=4, image_size=16, latent_channels=2))
    info = PipelineInfo(name="tiny-continuous", image_size=16, class_names=["a", "b", "c"],
                        defaults={"cfg_scale": 2.0})
    pipe = ImagePipeline(model(0, 32), kl, info, model(1, 16))
    return pipe.save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny-continuous")


@pytest.fixture(scope="session")
def tiny_t2i_pipeline_dir(tmp_path_factory):
    """A saved text-to-image pipeline with 16x16-pixel images (4x4 tokens): a LlamaGen-T2I GPT, its word-level text
    encoder over the scene captions' words, and three example prompts; weights N(0, 0.2), so that the images
    depend on the prompt. The embedded ``shapes-t2i`` has this layout."""
    from vgen.data.scenes import EXAMPLE_PROMPTS, caption_vocabulary
    from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder
    from vgen.pipelines import ImagePipeline, PipelineInfo
    from vgen.tokenizers.vq import VQConfig, VQModel

    gpt = make_tiny_gpt(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, block_size=16,
                                  model_type="t2i", caption_dim=16, cls_token_num=24))
    torch.manual_seed(0)
    words = WordTextEncoder(WordEncoderConfig.for_words(caption_vocabulary(), dim=16, n_layer=1, n_head=2,
                                                        max_length=24))
    with torch.no_grad():
        for p in words.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    info = PipelineInfo(name="tiny-t2i", image_size=16, defaults={"cfg_scale": 2.0},
                        example_prompts=list(EXAMPLE_PROMPTS[:3]))
    pipe = ImagePipeline(gpt, vq, info, text_encoder=words.eval())
    return pipe.save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny-t2i")


@pytest.fixture(scope="session")
def tiny_scene_judge():
    """A random scene judge for 16-px images (the shipped one is trained on 64-px scenes): it reads every
    attribute of ``vgen.data.scenes.ATTRIBUTES``, wrongly, but deterministically."""
    from vgen.data.scenes import BACKGROUND_NAMES, COLOUR_NAMES, POSITIONS, SIZES
    from vgen.data.shapes import NUM_CLASSES
    from vgen.models.classifier import AttributeClassifier, AttributeClassifierConfig

    torch.manual_seed(0)
    attributes = (("shape", NUM_CLASSES), ("colour", len(COLOUR_NAMES)), ("size", len(SIZES)),
                  ("position", len(POSITIONS)), ("background", len(BACKGROUND_NAMES)))
    return AttributeClassifier(AttributeClassifierConfig(attributes, widths=(4, 4, 4, 4), image_size=16)).eval()
# ---- end apps ----------------------------------------------------------------------------------------------


# ---- NAR: tiny next-neighbour models (image and video) with informative logits ------------------------------
@pytest.fixture
def tiny_nar_factory():
    """``make(grid, seed=0, **config)``: an fp32 eval-mode NAR model whose weight matrices are N(0, 0.2) noise
    (its output heads start at zero, which would make every distribution uniform)."""
    from vgen.models.nar import NARConfig, NARTransformer

    def make(grid: tuple[int, ...] = (3, 3), seed: int = 0, **overrides) -> NARTransformer:
        config = {"vocab_size": 48, "dim": 32, "n_layer": 2, "n_head": 4, "multiple_of": 16, "num_classes": 5,
                  **overrides}
        torch.manual_seed(seed)
        model = NARTransformer(NARConfig(grid=grid, **config))
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim > 1:
                    p.normal_(std=0.2)
        return model.eval()

    return make
# ---- end NAR -----------------------------------------------------------------------------------------------


# ---- NBP: tiny next-block models (image and video) with informative logits ----------------------------------
@pytest.fixture
def tiny_nbp_factory():
    """``make(grid, block="row", seed=0, **config)``: an fp32 eval-mode NBP model whose parameters are N(0, 0.2)
    noise (its zero-initialised output would be uniform)."""
    from vgen.models.nbp import NBPConfig, NBPTransformer

    def make(grid: tuple[int, ...], block: str = "row", seed: int = 0, **overrides) -> NBPTransformer:
        config = {"vocab_size": 40, "dim": 48, "n_layer": 2, "n_head": 4, "multiple_of": 16, "num_classes": 5,
                  **overrides}
        torch.manual_seed(seed)
        model = NBPTransformer(NBPConfig(grid=grid, block=block, **config))
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(std=0.2)
        return model.eval()

    return make
# ---- end NBP -----------------------------------------------------------------------------------------------


# ---- eval: the tiny pipeline as a model of the shapes domain (records its vgen.data set) ---------------------
@pytest.fixture(scope="session")
def tiny_shapes_pipeline_dir(tiny_pipeline_dir, tmp_path_factory):
    """``tiny_pipeline_dir`` whose pipeline.json names the first three shapes classes and records 16-px smooth
    shapes data, so ``vgen bench`` renders real images and judges class accuracy for it."""
    import json
    import shutil

    from vgen.data.shapes import CLASS_NAMES

    path = shutil.copytree(tiny_pipeline_dir, tmp_path_factory.mktemp("pipe") / "tiny-shapes")
    info = json.loads((path / "pipeline.json").read_text())
    info.update(class_names=list(CLASS_NAMES[:3]), data={"image_size": 16, "background": "smooth"})
    (path / "pipeline.json").write_text(json.dumps(info))
    return path
# ---- end eval ----------------------------------------------------------------------------------------------


# ---- block diffusion: a tiny streaming model with informative (non-zero) weights -----------------------------
from vgen.models.blockdiff import BlockDiffConfig, BlockDiffusionTransformer  # noqa: E402

TINY_BLOCKDIFF = BlockDiffConfig(frame_size=16, patch_size=4, frames_per_block=2, train_frames=8, dim=48,
                                 n_layer=2, n_head=4, num_classes=3)


def make_tiny_blockdiff(config: BlockDiffConfig = TINY_BLOCKDIFF, seed: int = 0) -> BlockDiffusionTransformer:
    """An eval-mode block-diffusion model whose weights are N(0, 0.1) noise (adaLN-Zero starts every branch
    closed, which would make the output independent of its input)."""
    torch.manual_seed(seed)
    model = BlockDiffusionTransformer(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.1)
    return model.eval()


@pytest.fixture
def tiny_blockdiff() -> BlockDiffusionTransformer:
    return make_tiny_blockdiff()


@pytest.fixture
def tiny_blockdiff_factory():
    """``make_tiny_blockdiff`` for tests that need another config or seed."""
    return make_tiny_blockdiff


@pytest.fixture(scope="session")
def tiny_stream_pipeline_dir(tmp_path_factory):
    """A saved 3-class streaming pipeline (16-px frames, 2-frame blocks, 8 trained frames)."""
    from vgen.pipelines import PipelineInfo, StreamPipeline

    info = PipelineInfo(name="tiny-stream", image_size=16, class_names=["a", "b", "c"],
                        defaults={"steps": 2, "first_steps": 2, "sink_frames": 2, "window_frames": 4})
    return StreamPipeline(make_tiny_blockdiff(), info).save_pretrained(tmp_path_factory.mktemp("pipe") / "stream")
# ---- end block diffusion ------------------------------------------------------------------------------------


# ---- video: a tiny NBP video pipeline saved as a folder ------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_video_pipeline_dir(tmp_path_factory):
    """A saved 3-class NBP video pipeline: 3 frames of 16 px (4x4 tokens each), outputs not uniform."""
    from vgen.models.nbp import NBPConfig, NBPTransformer
    from vgen.pipelines import PipelineInfo, VideoPipeline
    from vgen.tokenizers.vq import VQConfig, VQModel

    torch.manual_seed(0)
    model = NBPTransformer(NBPConfig(grid=(3, 4, 4), block="frame", vocab_size=32, dim=32, n_layer=1, n_head=2,
                                     multiple_of=16, num_classes=3))
    with torch.no_grad():
        model.output.weight.normal_(std=0.5)
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    info = PipelineInfo(name="tiny-video", image_size=16, class_names=["a", "b", "c"], defaults={"cfg_scale": 2.0})
    return VideoPipeline(model, vq, info).save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny-video")


@pytest.fixture(scope="session")
def tiny_video_ar_pipeline_dir(tmp_path_factory):
    """A saved 3-class next-token video AR pipeline (a LlamaGen GPT over 3 frames of 4x4 tokens, 16 px frames),
    outputs not uniform."""
    from vgen.pipelines import PipelineInfo, VideoPipeline
    from vgen.tokenizers.vq import VQConfig, VQModel

    model = make_tiny_gpt(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, num_classes=3,
                                    block_size=48, frames=3))
    vq = VQModel(VQConfig(codebook_size=32, ch=8, ch_mult=(1, 2, 2), num_res_blocks=1, z_channels=8, norm_groups=4))
    info = PipelineInfo(name="tiny-video-ar", image_size=16, class_names=["a", "b", "c"], defaults={"cfg_scale": 2.0})
    return VideoPipeline(model, vq, info).save_pretrained(tmp_path_factory.mktemp("pipe") / "tiny-video-ar")
# ---- end video ---------------------------------------------------------------------------------------------


# ---- kernels: which Triton kernels ran, and whether they run compiled ------------------------------------------
@pytest.fixture
def launched(monkeypatch) -> list[str]:
    """The names of the Triton kernels launched from here on (each launch still runs), with VGEN_DISABLE_TRITON
    unset."""
    pytest.importorskip("triton", reason="the kernel tests need triton (pip install -e '.[triton]')")
    # imported here, not at collection: on a CPU run triton must first be set up for the interpreter
    from vgen.kernels import accept, common, probs, residual

    names: list[str] = []

    def spy(kernel, grid, *args, **options):
        names.append(kernel.__name__)
        common.launch(kernel, grid, *args, **options)

    for module in (probs, accept, residual):
        monkeypatch.setattr(module, "launch", spy)
    monkeypatch.delenv("VGEN_DISABLE_TRITON", raising=False)
    return names


@pytest.fixture
def compiled_kernels() -> None:
    """Skip a GPU test where Triton's interpreter is loaded (a run that selected the CPU kernel tests too)."""
    from vgen.kernels import dispatch

    if dispatch.interpreted():
        pytest.skip("Triton's interpreter is loaded in this run (CPU kernel tests selected too): run pytest -m gpu")

# ---- end kernels ------------------------------------------------------------------------------------------


# ---- text-to-image: a tiny T5 folder laid out as a FLAN-T5 download -----------------------------------------
TINY_T5_WORDS = ["a", "red", "blue", "green", "yellow", "square", "circle", "triangle", "on", "the", "of", "in",
                 "front", "background", "photo", "cat", "dog", "sat", "mat", "astronaut", "riding", "horse", "forest",
                 "river", "map", "made", "sushi", "glass", "wine", "next", "to"]
TINY_T5_DIM = 32


def make_tiny_t5_folder(folder):
    """Saves a random T5 (d_model 32, 2 encoder layers, 4 heads, FLAN-T5's gated-GELU) with its decoder, as a full
    FLAN-T5 checkpoint has it, and a word-level Unigram T5 tokenizer (one piece per word of ``TINY_T5_WORDS``,
    single letters for the rest) into ``folder`` with ``save_pretrained``."""
    transformers = pytest.importorskip("transformers", reason="the text-to-image tests need transformers "
                                                              "(pip install -e '.[t2i]')")
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    pieces += [(f"▁{word}", -2.0) for word in TINY_T5_WORDS]
    pieces += [(letter, -6.0) for letter in "abcdefghijklmnopqrstuvwxyz"]
    tokenizer = transformers.T5Tokenizer(vocab=pieces, extra_ids=0)
    config = transformers.T5Config(vocab_size=len(pieces), d_model=TINY_T5_DIM, d_kv=8, d_ff=64, num_layers=2,
                                   num_decoder_layers=1, num_heads=4, feed_forward_proj="gated-gelu",
                                   dropout_rate=0.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory):
    """A tiny random T5 folder (config.json, model.safetensors, tokenizer files); treat it as read-only."""
    return make_tiny_t5_folder(tmp_path_factory.mktemp("tiny-t5"))


# ---- text-to-image: a tiny random Janus checkpoint with its processor, in transformers' layout --------------
TINY_JANUS_WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", "<image_placeholder>", "<begin_of_image>", "<end_of_image>",
                    "<|User|>:", "<|Assistant|>:", "a", "red", "blue", "cat", "dog", "on", "the", "moon", "under",
                    "rain", "house", "big", "small"]
# the shape of Janus-Pro's template for one user turn and the generation prompt
TINY_JANUS_CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|User|>: ' if m['role'] == 'user' else '<|Assistant|>: ' }}"
                            "{% for c in m['content'] %}{{ c['text'] }}{% endfor %}{{ ' ' }}{% endfor %}"
                            "{% if add_generation_prompt %}{{ '<|Assistant|>:' }}{% endif %}")


def make_tiny_janus_dir(folder, seed: int = 0, num_embeddings: int = 64, side: int = 4):
    """Save a random ``JanusForConditionalGeneration`` (Llama of hidden 64, 2 layers, 4 heads, 2 KV heads; a
    ``side x side`` image of ``num_embeddings`` codes) with its generation config and a ``JanusProcessor`` (a
    word-level tokenizer that adds BOS, the template above) into ``folder``. The language model and generation
    weights are N(0, 0.1) noise so that the image-token distributions are far from flat."""
    transformers = pytest.importorskip("transformers", reason="Janus needs transformers (pip install -e '.[t2i]')")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate(TINY_JANUS_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                              "eoi_token": "<end_of_image>"})
    image_processor = transformers.JanusImageProcessorPil(size={"height": 16 * side, "width": 16 * side})
    processor = transformers.JanusProcessor(image_processor, fast, chat_template=TINY_JANUS_CHAT_TEMPLATE,
                                            num_image_tokens=side * side)
    config = transformers.JanusConfig(
        text_config=transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
        vision_config=transformers.JanusVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                     image_size=16 * side, patch_size=16, projection_dim=64,
                                                     num_image_tokens=side * side),
        vq_config=transformers.JanusVQVAEConfig(num_embeddings=num_embeddings, base_channels=32, latent_channels=32,
                                                channel_multiplier=[1, 1], projection_dim=64,
                                                image_token_embed_dim=64),
        image_token_id=vocab["<image_placeholder>"])
    torch.manual_seed(seed)
    model = transformers.JanusForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("model.language_model.", "model.generation_")) and p.ndim > 1:
                p.normal_(std=0.1)
    model.generation_config = transformers.GenerationConfig(bos_token_id=vocab["<bos>"], pad_token_id=vocab["<pad>"],
                                                            guidance_scale=5)
    model.generation_config.generation_kwargs = {"boi_token_id": vocab["<begin_of_image>"]}
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_janus_dir(tmp_path_factory):
    """A saved tiny random Janus checkpoint and processor (:func:`make_tiny_janus_dir`): 4x4 tokens of 64 codes."""
    return make_tiny_janus_dir(tmp_path_factory.mktemp("janus") / "tiny")


@pytest.fixture(scope="session")
def tiny_janus_factory():
    """:func:`make_tiny_janus_dir`, for tests that need another grid, codebook or seed."""
    return make_tiny_janus_dir
# ---- end text-to-image -------------------------------------------------------------------------------------


# ---- text-to-image: LlamaGen-T2I's released files, shrunk --------------------------------------------------
@pytest.fixture
def llamagen_t2i_release(tmp_path, monkeypatch):
    """Writes files named and laid out as LlamaGen's t2i release (GPT under ``model``, VQ under ``model``), with
    GPT-XL and VQ-16 shrunk to tiny sizes (for the whole test); returns a function of the caption dim (and the
    folder, ``tmp_path`` by default) giving the GPT and the two paths."""
    from vgen.models import llamagen
    from vgen.tokenizers.vq import VQ_CONFIGS, VQConfig, VQModel

    monkeypatch.setitem(llamagen.GPT_SIZES, "GPT-XL", dict(n_layer=1, n_head=2, dim=32))
    tiny_vq = VQConfig(codebook_size=16384, ch=8, ch_mult=(1, 1, 1, 1, 1), num_res_blocks=1, z_channels=8,
                       norm_groups=4)
    monkeypatch.setitem(VQ_CONFIGS, "VQ-16", tiny_vq)

    def write(caption_dim: int, folder=tmp_path):
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        gpt = llamagen.LlamaGenGPT(llamagen.llamagen_t2i_config_for(256, caption_dim=caption_dim))
        torch.save({"model": gpt.state_dict()}, folder / "t2i_XL_stage1_256.pt")
        torch.save({"model": VQModel(tiny_vq).state_dict()}, folder / "vq_ds16_t2i.pt")
        return gpt, folder / "t2i_XL_stage1_256.pt", folder / "vq_ds16_t2i.pt"

    return write


@pytest.fixture
def llamagen_t2i_folder(llamagen_t2i_release, tiny_t5_dir, tmp_path):
    """A LlamaGen-T2I folder (``vgen t2i-config``) of 64-px images (4 x 4 tokens) over the tiny T5, its GPT's
    weights N(0, 0.2) so that its next-token distributions are far from LlamaGen's zero-initialised flat ones."""
    from vgen.models.llamagen import LlamaGenGPT, llamagen_t2i_config_for
    from vgen.pipelines import write_llamagen_t2i_config

    _, _, vq = llamagen_t2i_release(TINY_T5_DIM)
    torch.manual_seed(1)
    gpt = LlamaGenGPT(llamagen_t2i_config_for(64, caption_dim=TINY_T5_DIM))
    with torch.no_grad():
        for p in gpt.parameters():
            p.normal_(std=0.2)
    torch.save({"model": gpt.state_dict()}, tmp_path / "t2i_tiny_64.pt")
    return write_llamagen_t2i_config(tmp_path / "llamagen-t2i", tmp_path / "t2i_tiny_64.pt", vq, t5_path=tiny_t5_dir,
                                     image_size=64, caption_dim=TINY_T5_DIM)
# ---- end text-to-image -------------------------------------------------------------------------------------


# ---- text-to-image: a tiny random CLIP with its processor, in transformers' layout -------------------------
TINY_CLIP_IMAGE_SIZE = 32


def make_tiny_clip_dir(folder, seed: int = 0):
    """Save a random ``CLIPModel`` (text and vision width 32, 2 layers, projection dim 16, 32-px images in 8-px
    patches, 77 text positions) and a ``CLIPProcessor`` into ``folder``, laid out as openai/clip-vit-large-patch14:
    OpenAI's image mean and std, shortest edge resized to 32 then center-cropped; a byte-level BPE tokenizer over
    single letters (a letter ending a word is ``x</w>``), the start and end tokens last and the config's
    ``eos_token_id`` 2, so that the text is pooled at its highest token id as OpenAI's checkpoints are."""
    transformers = pytest.importorskip("transformers", reason="the CLIP score needs transformers "
                                                              "(pip install -e '.[t2i]')")
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = [*letters, *(c + "</w>" for c in letters), "<|startoftext|>", "<|endoftext|>"]
    tokenizer = transformers.CLIPTokenizer(vocab={w: i for i, w in enumerate(words)}, merges=[])
    size = TINY_CLIP_IMAGE_SIZE
    image_processor = transformers.CLIPImageProcessorPil(size={"shortest_edge": size},
                                                         crop_size={"height": size, "width": size})
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=0, pad_token_id=1,
                         eos_token_id=2),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=size, patch_size=8),
        projection_dim=16)
    torch.manual_seed(seed)
    transformers.CLIPModel(config).save_pretrained(folder)
    transformers.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory):
    """A saved tiny random CLIP folder (:func:`make_tiny_clip_dir`); treat it as read-only."""
    return make_tiny_clip_dir(tmp_path_factory.mktemp("clip") / "tiny")
# ---- end text-to-image -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def benchmark_module():
    """``benchmark_module("name")``: ``benchmarks/name.py`` imported as a module, to test its functions."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def unpack_device_result():
    """``unpack_device_result(out_dir, dest)``: a one-call GPU script's ``result.tar.part-*`` in ``out_dir``, each
    small enough to come back from a device and together matching ``result.tar.sha256``, extracted into ``dest``."""
    import hashlib
    import io
    import tarfile

    def unpack(out_dir, dest):
        parts = sorted(out_dir.glob("result.tar.part-*"))
        assert parts and all(p.stat().st_size <= 15 * 2**20 for p in parts)
        whole = b"".join(p.read_bytes() for p in parts)
        assert hashlib.sha256(whole).hexdigest() == (out_dir / "result.tar.sha256").read_text().strip()
        with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
            tar.extractall(dest, filter="data")
        return dest

    return unpack
