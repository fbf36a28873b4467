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


from vgen.models.word_encoder import WordEncoderConfig, WordTextEncoder  # noqa: E402


def make_tiny_word_encoder(words: tuple[str, ...], seed: int = 0) -> WordTextEncoder:
    """An eval-mode word-level text encoder over ``words`` (16 features, 24 positions) whose matrices are N(0, 0.2),
    so that its caption features depend on the prompt."""
    torch.manual_seed(seed)
    encoder = WordTextEncoder(WordEncoderConfig.for_words(words, dim=16, n_layer=1, n_head=2, max_length=24))
    with torch.no_grad():
        for p in encoder.parameters():
            if p.ndim > 1:
                p.normal_(std=0.2)
    return encoder.eval()


@pytest.fixture(scope="session")
def tiny_t2i_pipeline_dir(tmp_path_factory):
    """A saved text-to-image pipeline with 16x16-pixel images (4x4 tokens): a LlamaGen-T2I GPT, its word-level text
    encoder over the scene captions' words, and three example prompts; weights N(0, 0.2), so that the images
    depend on the prompt. The embedded ``shapes-t2i`` has this layout."""
    from vgen.data.scenes import EXAMPLE_PROMPTS, caption_vocabulary
    from vgen.pipelines import ImagePipeline, PipelineInfo
    from vgen.tokenizers.vq import VQConfig, VQModel

    gpt = make_tiny_gpt(GPTConfig(vocab_size=32, dim=32, n_layer=1, n_head=2, multiple_of=16, block_size=16,
                                  model_type="t2i", caption_dim=16, cls_token_num=24))
    words = make_tiny_word_encoder(caption_vocabulary())
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


import dataclasses  # noqa: E402

# a text model: the tiny geometry, captions of a make_tiny_word_encoder (16 features, 24 positions)
TINY_TEXT_BLOCKDIFF = dataclasses.replace(TINY_BLOCKDIFF, text_dim=16, text_tokens=24)


def make_tiny_text_blockdiff(seed: int = 0) -> tuple[BlockDiffusionTransformer, WordTextEncoder]:
    """An eval-mode text block-diffusion model (``TINY_TEXT_BLOCKDIFF``, N(0, 0.1) weights, cross-attention open)
    and a tiny word encoder over the moving scenes' caption words."""
    from vgen.data.moving_scenes import caption_vocabulary

    return make_tiny_blockdiff(TINY_TEXT_BLOCKDIFF, seed), make_tiny_word_encoder(caption_vocabulary(), seed)


@pytest.fixture
def tiny_text_blockdiff() -> tuple[BlockDiffusionTransformer, WordTextEncoder]:
    return make_tiny_text_blockdiff()


TINY_TEXT_STREAM_PROMPTS = ["a red star on a white background", "a blue ring moving right", "a green square"]


@pytest.fixture(scope="session")
def tiny_text_stream_pipeline_dir(tmp_path_factory):
    """A saved prompt-conditioned streaming pipeline (``make_tiny_text_blockdiff``'s model and word encoder, the
    tiny stream's geometry and defaults) with ``TINY_TEXT_STREAM_PROMPTS`` as its example prompts."""
    from vgen.pipelines import PipelineInfo, StreamPipeline

    model, words = make_tiny_text_blockdiff()
    info = PipelineInfo(name="tiny-text-stream", image_size=16, example_prompts=TINY_TEXT_STREAM_PROMPTS,
                        defaults={"steps": 2, "first_steps": 2, "sink_frames": 2, "window_frames": 4})
    return StreamPipeline(model, info, text_encoder=words).save_pretrained(tmp_path_factory.mktemp("pipe") / "t2v")
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


# ---- layout LM: a tiny random language model writing codes between fixed tokens (row ends, a head) -----------
def make_tiny_layout_lm(grid: tuple[int, int] = (2, 3), vocab_size: int = 8, qk_norm: bool = False, seed: int = 0,
                        row_end: tuple[int, ...] = (30,), head: tuple[int, ...] = (28, 29)):
    """An fp32 eval-mode :class:`~vgen.models.mllm.LayoutLM` over 32 text ids with N(0, 0.5) weights (informative
    logits): ``vocab_size`` codes at scattered text ids, ``row_end`` after each row of ``grid``, ``head`` ending
    every prompt (ids 28-31 are reserved for fixed tokens)."""
    from vgen.models.mllm import LayoutLM, MLLMConfig

    config = MLLMConfig(vocab_size=vocab_size, text_vocab_size=32, dim=32, n_layer=2, n_head=4, n_kv_head=2,
                        intermediate_size=48, qk_norm=qk_norm, image_rows=grid[0], image_cols=grid[1],
                        row_end=row_end, head_tokens=head, tail=(31,), max_positions=64, max_prompt_tokens=8,
                        pad_token_id=0, rope_base=100.0)
    generator = torch.Generator().manual_seed(seed)
    model = LayoutLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5 + (1.0 if p.ndim == 1 else 0.0))
        model.code_ids.copy_(torch.randperm(28, generator=generator)[:vocab_size])
        model.head.weight.copy_(torch.randn(vocab_size, config.dim, generator=generator) * 0.5)
    return model.eval()


def layout_prompt(model, lengths: tuple[int, ...], seed: int = 0):
    """Random prompts of ``lengths`` text ids (below 28), each ending in the model's head, left-padded to one
    length."""
    from vgen.models.conditioning import PrefixCondition

    generator = torch.Generator().manual_seed(seed)
    head = torch.tensor(model.config.head_tokens, dtype=torch.long)
    width = max(lengths) + len(head)
    values = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        values[row, width - n - len(head):] = torch.cat([torch.randint(28, (n,), generator=generator), head])
        mask[row, width - n - len(head):] = True
    return PrefixCondition(values, mask)


@torch.no_grad()
def layout_reference_logits(model, prompt: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The law a layout model's samplers must follow, computed without its cache: logits [B, N, V] of code i given
    the unpadded ``prompt`` ids [L] (ending in the head) and ``codes[:, :i]``, from one causal forward over the
    prompt and ``layout.sequence`` of each row (row ends written in), read at the position before each code."""
    layout = model.token_layout
    body = layout.sequence(model.code_ids[codes])[:, len(layout.head):]
    ids = torch.cat([prompt.expand(len(codes), -1), body], dim=1)
    h = model.text_embeddings(ids)
    rope = model.rope[:ids.shape[1]]
    for i, layer in enumerate(model.layers):
        h = layer(h, rope, None, i)
    slots = len(prompt) + layout.offset(torch.arange(codes.shape[1])) - 1
    return model.head(model.norm(h)[:, slots]).float()


@pytest.fixture(scope="session")
def layout_reference():
    """:func:`layout_reference_logits`."""
    return layout_reference_logits


@pytest.fixture(scope="session")
def tiny_layout_lm():
    """:func:`make_tiny_layout_lm`, for any grid, codebook, qk-norm or seed."""
    return make_tiny_layout_lm


@pytest.fixture(scope="session")
def layout_prompts():
    """:func:`layout_prompt`."""
    return layout_prompt
# ---- end layout LM -----------------------------------------------------------------------------------------


# ---- text-to-image: a tiny random Emu3 checkpoint with its processor, in transformers' layout ---------------
TINY_EMU3_WORDS = ["<unk>", *"0123456789", "*", ",", ".", "a", "red", "star", "big", "blue", "dog", "on", "the",
                   "moon", "under", "rain", "lowres", "bad", "anatomy", "blurry"]
# Emu3's control tokens (its tokenizer's names); BOS and EOS are <|extra_203|> and <|extra_204|>, as in Emu3-Gen-hf
TINY_EMU3_SPECIAL = ["<|endoftext|>", "<|extra_0|>", "<|extra_200|>", "<|extra_201|>", "<|extra_203|>",
                     "<|extra_204|>", "<|image start|>", "<|image end|>", "<|image token|>"]


def make_tiny_emu3_dir(folder, seed: int = 0, codebook_size: int = 64):
    """Save a random ``Emu3ForConditionalGeneration`` (Llama of hidden 64, 2 layers, 4 heads, 2 KV heads, 512
    positions; a VQ model of ``codebook_size`` codes, 8 pixels a code) with an ``Emu3Processor`` (a word-level
    tokenizer that splits digits and "*", adds no BOS itself; the visual tokens in a scrambled order so that code
    ``c``'s text id is not ``c`` plus a constant) into ``folder``. The language model's weights are N(0, 0.1)
    noise so that the code distributions are far from flat; the generation config sets no guidance."""
    transformers = pytest.importorskip("transformers", reason="Emu3 needs transformers (pip install -e '.[t2i]')")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(TINY_EMU3_WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation()])
    tok.add_special_tokens(TINY_EMU3_SPECIAL)
    tok.add_tokens([f"<|visual token {(c * 5 + 3) % codebook_size:06d}|>" for c in range(codebook_size)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        unk_token="<unk>", padding_side="left",
        extra_special_tokens={"image_token": "<|extra_0|>", "boi_token": "<|image start|>",
                              "eoi_token": "<|image end|>", "image_wrapper_token": "<|image token|>",
                              "eof_token": "<|extra_201|>"})
    processor = transformers.Emu3Processor(transformers.Emu3ImageProcessor(min_pixels=64, max_pixels=256 * 256), fast)
    vocab = fast.get_vocab()
    config = transformers.Emu3Config(
        text_config=dict(vocab_size=len(vocab), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=vocab["<|endoftext|>"], bos_token_id=vocab["<|extra_203|>"],
                         eos_token_id=vocab["<|extra_204|>"]),
        vq_config=dict(codebook_size=codebook_size, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32),
        vocabulary_map=vocab)
    torch.manual_seed(seed)
    model = transformers.Emu3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("model.text_model.", "lm_head.")) and p.ndim > 1:
                p.normal_(std=0.1)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_emu3_dir(tmp_path_factory):
    """A saved tiny random Emu3 checkpoint and processor (:func:`make_tiny_emu3_dir`): 64 codes, any small grid
    (``image_area`` 576 gives 3 x 3 codes); treat it as read-only."""
    return make_tiny_emu3_dir(tmp_path_factory.mktemp("emu3") / "tiny")


@pytest.fixture(scope="session")
def tiny_emu3_factory():
    """:func:`make_tiny_emu3_dir`, for tests that need another codebook or seed."""
    return make_tiny_emu3_dir
# ---- end text-to-image -------------------------------------------------------------------------------------


# ---- text-to-image: a tiny random Lumina-mGPT folder (Chameleon) with Chameleon's tokenizer files -------------
TINY_LUMINA_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
TINY_LUMINA_FIXED = ["<racm3:break>", "<eoss>", "<reserved08706>", "<reserved08799>", "<reserved08801>",
                     "<reserved08802>", "<reserved08803>"]
TINY_LUMINA_WORDS = ["Generate", "an", "image", "of", "x", "according", "to", "the", "following", "prompt", ":",
                     *"0123456789", "a", "red", "blue", "star", "cat", "big", "on", "moon"]
TINY_VQGAN = dict(ch=32, ch_mult=[1, 1, 1, 1, 2], num_res_blocks=1, z_channels=32, embed_dim=4)


def image_token_name(code: int) -> str:
    """Chameleon's name of image code ``code``: ``IMGIMG``, its digits spelled A-J, and a final ``Z``."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def taming_vqgan_shapes(ch: int, ch_mult: list[int], num_res_blocks: int, z_channels: int, embed_dim: int,
                        n_embed: int) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of taming-transformers' ``VQModel`` (Chameleon's ``vqgan.ckpt``) with
    ``attn_resolutions: []`` (attention in the middle blocks only): names as taming writes them."""
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name, cin, cout, k):
        shapes[name + ".weight"], shapes[name + ".bias"] = (cout, cin, k, k), (cout,)

    def norm(name, c):
        shapes[name + ".weight"], shapes[name + ".bias"] = (c,), (c,)

    def res(name, cin, cout):
        norm(name + ".norm1", cin), conv(name + ".conv1", cin, cout, 3)
        norm(name + ".norm2", cout), conv(name + ".conv2", cout, cout, 3)
        if cin != cout:
            conv(name + ".nin_shortcut", cin, cout, 1)

    def mid(side, c):
        res(f"{side}.mid.block_1", c, c), res(f"{side}.mid.block_2", c, c)
        norm(f"{side}.mid.attn_1.norm", c)
        for p in ("q", "k", "v", "proj_out"):
            conv(f"{side}.mid.attn_1.{p}", c, c, 1)

    n, block_in = len(ch_mult), ch
    conv("encoder.conv_in", 3, ch, 3)
    for i in range(n):
        for j in range(num_res_blocks):
            res(f"encoder.down.{i}.block.{j}", block_in, ch * ch_mult[i])
            block_in = ch * ch_mult[i]
        if i != n - 1:
            conv(f"encoder.down.{i}.downsample.conv", block_in, block_in, 3)
    mid("encoder", block_in), norm("encoder.norm_out", block_in), conv("encoder.conv_out", block_in, z_channels, 3)
    conv("decoder.conv_in", z_channels, block_in, 3), mid("decoder", block_in)
    for i in reversed(range(n)):
        for j in range(num_res_blocks + 1):
            res(f"decoder.up.{i}.block.{j}", block_in, ch * ch_mult[i])
            block_in = ch * ch_mult[i]
        if i != 0:
            conv(f"decoder.up.{i}.upsample.conv", block_in, block_in, 3)
    norm("decoder.norm_out", block_in), conv("decoder.conv_out", block_in, 3, 3)
    shapes["quantize.embedding.weight"] = (n_embed, embed_dim)
    conv("quant_conv", z_channels, embed_dim, 1), conv("post_quant_conv", embed_dim, z_channels, 1)
    return shapes


def random_tensors(shapes: dict[str, tuple[int, ...]], generator: torch.Generator,
                   std: float = 0.1) -> dict[str, torch.Tensor]:
    """N(0, std) weights; 1-D norm weights around 1 (a name ending in ``norm*.weight`` or ``layernorm.weight``)."""
    out = {}
    for name, shape in shapes.items():
        t = torch.randn(shape, generator=generator) * std
        if len(shape) == 1 and name.endswith("weight") and "norm" in name.split(".")[-2]:
            t += 1.0
        out[name] = t
    return out


def write_tiny_chameleon_tokenizer(folder, codes: int, generator: torch.Generator, n_embed: int | None = None):
    """``folder/{vqgan.yaml, vqgan.ckpt, text_tokenizer.json}`` as Chameleon's release lays them out (a random
    taming VQGAN of ``n_embed`` codes, :data:`TINY_VQGAN`, 16 px a code); returns the text tokenizer's vocabulary
    (its ``IMGIMG`` names at ids 4.. in a shuffled code order, as Chameleon keeps them in one block)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    order = torch.randperm(codes, generator=generator).tolist()
    names = TINY_LUMINA_SPECIALS + [image_token_name(c) for c in order] + TINY_LUMINA_FIXED + TINY_LUMINA_WORDS
    vocab = {w: i for i, w in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.Punctuation()])
    tok.add_special_tokens(TINY_LUMINA_SPECIALS + TINY_LUMINA_FIXED)
    tok.save(str(folder / "text_tokenizer.json"))
    vq = TINY_VQGAN
    (folder / "vqgan.yaml").write_text(
        "model:\n  target: taming.models.vqgan.VQModel\n  params:\n"
        f"    embed_dim: {vq['embed_dim']}\n    n_embed: {n_embed or codes}\n    ddconfig:\n      double_z: false\n"
        f"      z_channels: {vq['z_channels']}\n      resolution: 512\n      in_channels: 3\n      out_ch: 3\n"
        f"      ch: {vq['ch']}\n      ch_mult: {vq['ch_mult']}\n      num_res_blocks: {vq['num_res_blocks']}\n"
        "      attn_resolutions: []\n      dropout: 0.0\n"
        "    lossconfig:\n      target: taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator\n")
    taming = random_tensors(taming_vqgan_shapes(**vq, n_embed=n_embed or codes), generator)
    taming["quantize.embedding.weight"] = torch.randn(n_embed or codes, vq["embed_dim"], generator=generator)
    torch.save({"state_dict": taming, "global_step": 1}, folder / "vqgan.ckpt")
    return vocab, tok


def lumina_hf_config(vocab: dict[str, int], model_parallel_size: int = 2) -> dict:
    """A Lumina-mGPT ``config.json`` (``ChameleonXLLMXConfig``): hidden 64, 2 layers, 4 query and 2 key heads."""
    return {"architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
            "vocab_size": len(vocab), "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "model_parallel_size": model_parallel_size,
            "swin_norm": False, "mask_image_logits": False, "z_loss_weight": 0.0, "attention_bias": False,
            "bos_token_id": vocab["<s>"], "eos_token_id": vocab["</s>"], "pad_token_id": vocab["<pad>"],
            "vocabulary_map": vocab, "vq_config": {"embed_dim": TINY_VQGAN["embed_dim"]}}


def lumina_weight_shapes(hf: dict, qk_rows: int | None = None) -> dict[str, tuple[int, ...]]:
    """``transformers``' Chameleon names and shapes of a Lumina-mGPT language model, the q/k norms with
    ``qk_rows`` rows (Lumina: ``model_parallel_size``)."""
    d, nh, nkv, inter = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"], hf["intermediate_size"]
    hd, rows = d // nh, qk_rows or hf["model_parallel_size"]
    shapes = {"model.embed_tokens.weight": (hf["vocab_size"], d), "model.norm.weight": (d,),
              "lm_head.weight": (hf["vocab_size"], d)}
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (nh * hd, d), p + "self_attn.k_proj.weight": (nkv * hd, d),
                       p + "self_attn.v_proj.weight": (nkv * hd, d), p + "self_attn.o_proj.weight": (d, d),
                       p + "self_attn.q_norm.weight": (rows, hd), p + "self_attn.q_norm.bias": (rows, hd),
                       p + "self_attn.k_norm.weight": (rows, hd), p + "self_attn.k_norm.bias": (rows, hd),
                       p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
                       p + "mlp.down_proj.weight": (d, inter), p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,)})
    return shapes


def make_tiny_lumina_dir(folder, seed: int = 0, codes: int = 4):
    """A Lumina-mGPT folder as ``save_pretrained`` writes it plus Chameleon's files in ``ckpts/chameleon/
    tokenizer/``: :func:`lumina_hf_config`, ``model.safetensors`` (N(0, 0.3) weights in Lumina's layout, q/k norms
    ``[model_parallel_size, head_dim]``, and a ``model.vqmodel`` tensor the reader must skip), ``tokenizer.json``
    (word level, digits and punctuation split, the ``<...>`` tokens special) and a VQGAN of ``codes`` codes."""
    transformers = pytest.importorskip("transformers", reason="Lumina-mGPT needs transformers (pip install -e .[t2i])")
    import json

    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    vocab, tok = write_tiny_chameleon_tokenizer(folder / "ckpts" / "chameleon" / "tokenizer", codes, generator)
    hf = lumina_hf_config(vocab)
    weights = random_tensors(lumina_weight_shapes(hf), generator, std=0.3)
    weights["model.vqmodel.quantize.embedding.weight"] = torch.randn(codes, TINY_VQGAN["embed_dim"])
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf, indent=1))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                         unk_token="<unk>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_lumina_dir(tmp_path_factory):
    """A saved tiny random Lumina-mGPT folder (:func:`make_tiny_lumina_dir`): 4 codes."""
    return make_tiny_lumina_dir(tmp_path_factory.mktemp("lumina") / "tiny")


@pytest.fixture(scope="session")
def tiny_lumina_factory():
    """:func:`make_tiny_lumina_dir`, for tests that need another seed or codebook."""
    return make_tiny_lumina_dir


def lumina_reference_logits(w: dict[str, torch.Tensor], hf: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, text vocab] of unpadded sequences ``ids`` [B, T] (positions 0..T-1), computed as Lumina's
    ``lumina_mgpt/model/chameleon/modeling_chameleon.py`` does (``mask_image_logits`` off) from the weights ``w`` of
    its safetensors and its ``config.json`` ``hf``: RMSNorm pre-norm blocks; queries and keys layer-normalised over
    ``head_dim`` (eps 1e-5) with the ``[model_parallel_size, head_dim]`` weight and bias repeated over each shard's
    heads (``transformers``' ``[heads, head_dim]`` as it is), then Llama's ``rotate_half`` rotary embedding; repeated
    KV heads; SwiGLU; ``lm_head``."""
    import math

    import torch.nn.functional as F

    d, nh, nkv = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    (b, t), hd, eps = ids.shape, d // nh, hf["rms_norm_eps"]
    theta = hf["rope_theta"] if "rope_theta" in hf else hf["rope_parameters"]["rope_theta"]  # transformers 5
    freqs = torch.outer(torch.arange(t).float(), 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd))
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)

    def head_norm(x, name, heads):  # ChameleonLayerNorm: statistics over head_dim, shard weights repeated per head
        rows = w[name + ".weight"].shape[0]  # model_parallel_size (Lumina's layout) or heads (transformers')
        weight, bias = (w[f"{name}.{p}"].repeat_interleave(heads // rows, 0) for p in ("weight", "bias"))
        return F.layer_norm(x, (hd,), eps=1e-5) * weight + bias

    h = w["model.embed_tokens.weight"][ids]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = head_norm((x @ w[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd), p + "self_attn.q_norm", nh)
        k = head_norm((x @ w[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd), p + "self_attn.k_norm", nkv)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // nkv, 2), v.repeat_interleave(nh // nkv, 2)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + torch.einsum("bhts,bshd->bthd", attn, v).reshape(b, t, d) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(h, w["model.norm.weight"]) @ w["lm_head.weight"].T


def make_tiny_anole_dir(folder, seed: int = 0, codes: int = 4):
    """``transformers``' ``ChameleonForConditionalGeneration`` saved as it saves it (the language model of
    :func:`lumina_hf_config` with N(0, 0.3) weights, q/k norms per head; its VQ encoder) with the word-level
    tokenizer, and Chameleon's files (a VQGAN of ``codes`` codes) in ``ckpts/chameleon/tokenizer/``: an Anole-style
    folder."""
    transformers = pytest.importorskip("transformers", reason="Anole needs transformers (pip install -e .[t2i])")

    generator = torch.Generator().manual_seed(seed)
    vocab, tok = write_tiny_chameleon_tokenizer(folder / "ckpts" / "chameleon" / "tokenizer", codes, generator)
    hf = lumina_hf_config(vocab)
    config = transformers.ChameleonConfig(
        **{k: hf[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps",
                              "bos_token_id", "eos_token_id", "pad_token_id", "vocabulary_map")},
        vq_config={"embed_dim": TINY_VQGAN["embed_dim"], "num_embeddings": codes, "base_channels": 32,
                   "channel_multiplier": [1, 2]})
    model = transformers.ChameleonForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("model.vqmodel."):
                shift = 1.0 if name.endswith("norm.weight") else 0.0
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3 + shift)
    model.save_pretrained(folder)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                         unk_token="<unk>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_anole_dir(tmp_path_factory):
    """A saved tiny random ``transformers`` Chameleon folder with Chameleon's files (:func:`make_tiny_anole_dir`)."""
    return make_tiny_anole_dir(tmp_path_factory.mktemp("anole") / "tiny")


@pytest.fixture(scope="session")
def lumina_reference():
    """:func:`lumina_reference_logits`."""
    return lumina_reference_logits
# ---- end Lumina-mGPT ---------------------------------------------------------------------------------------


# ---- markers: a test marked gpu is skipped where there is no CUDA device --------------------------------------
NO_CUDA = "needs a CUDA device (on a GPU machine: pytest -m gpu)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test marked ``gpu`` where CUDA is not available, so that a run on a CPU machine passes with any
    ``-m`` expression (``-m "not slow"``) or none, and says why each was skipped."""
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))
# ---- end markers -------------------------------------------------------------------------------------------
