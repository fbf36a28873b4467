"""vgen's web demo (``vgen app``): a thin Gradio page over the pipeline API, with no generation logic of its own.

The model list comes from :func:`vgen.available_models` (a pipeline folder path is accepted too, and LlamaGen
checkpoint paths), the sampler list from the sampler registry, and a sampler's parameters are passed only when
its config has them and the field is filled in (empty = the preset's own default). Streaming models get their own
tab, where frames play as each block completes, with Stop and a class switch that takes effect at the next block.
Bad input (an unknown model, a missing checkpoint, out-of-range settings, a sampler the model cannot use) is shown
in the page as a message; the app keeps serving. ``gradio`` is imported lazily: it is the ``app`` extra.
"""

from __future__ import annotations

import functools
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image

from vgen.apps.options import sampler_classes, sampling_options
from vgen.hub import ASSETS, CheckpointError
from vgen.images import image_grid
from vgen.pipelines import (
    ImagePipeline,
    StreamPipeline,
    VideoPipeline,
    available_models,
    default_sampler,
    load,
    load_llamagen,
    tile_clips,
)
from vgen.pipelines.stream import MODEL_FOLDER
from vgen.samplers import available_samplers, get_sampler
from vgen.samplers.options import DeclaredOption, declarations, declared_options, parse_option
from vgen.samplers.streaming import StreamConfig, StreamControl
from vgen.video_io import StreamingVideoWriter, write_video
from vgen.visualize import acceptance_figure

# the page's option fields, from the declarations: the settings every sampler shares, then every sampler's own
# (but compile: compiling takes longer than the page's generations)
SAMPLING_FIELDS = sampling_options()
SAMPLER_FIELDS = declared_options(sampler_classes(), exclude=("compile",))
STREAM_FIELDS = declarations(StreamConfig)
# the Generate tab's inputs, in the order the page (and its API, /generate) takes them
GENERATE_INPUTS = ["model", "sampler", "class_id", "num_images", "seed", "compare", "gpt_ckpt", "vq_ckpt", "gpt_model",
                   "image_size", *(o.name for o in SAMPLING_FIELDS), *(o.name for o in SAMPLER_FIELDS)]
MAX_IMAGES = 16
MAX_STREAM_FRAMES = 2000
_LOAD_LOCK = threading.Lock()
_CONTROLS: dict[str, StreamControl] = {}  # the running stream of each browser session


class InputError(ValueError):
    """A problem with what the user entered, shown in the page."""


@functools.lru_cache(maxsize=4)
def _pipeline(model: str, gpt_ckpt: str, vq_ckpt: str, gpt_model: str, image_size: int) -> ImagePipeline:
    if gpt_ckpt or vq_ckpt:
        if not (gpt_ckpt and vq_ckpt):
            raise InputError("LlamaGen checkpoints need both a GPT and a VQ checkpoint path")
        return load_llamagen(gpt_ckpt, vq_ckpt, gpt_model, image_size)
    return load(model)


def get_pipeline(model: str, gpt_ckpt: str = "", vq_ckpt: str = "", gpt_model: str = "GPT-B",
                 image_size: int = 256) -> ImagePipeline:
    """A loaded pipeline, kept for reuse (loading is the slow part); one load at a time."""
    with _LOAD_LOCK:
        return _pipeline(model.strip(), gpt_ckpt.strip(), vq_ckpt.strip(), gpt_model, int(image_size))


def samplers_for(model: str) -> list[str]:
    """The samplers that fit ``model``'s token order (``nar`` for a NAR model, the raster ones for AR); every
    registered sampler when the name does not load, so that the page can still show why on Generate."""
    try:
        pipe = get_pipeline(model)
    except (ValueError, CheckpointError, FileNotFoundError):
        return available_samplers()
    return available_samplers(getattr(pipe.model, "token_order", "raster"))


def parse_optional(option: DeclaredOption, value: Any) -> Any:
    """A field the page may leave empty: None when empty, else the value read as the option's type."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return parse_option(option.name, str(value), option.kind)
    except ValueError as e:
        raise InputError(str(e)) from None


def option_box(gr, option: DeclaredOption):
    """The text box of a declared option: its name, its help, empty = the model's (or the sampler's) value."""
    return gr.Textbox(value="", label=option.name, info=option.help, placeholder="empty: the default")


def sampler_options(sampler: str, values: dict[str, Any]) -> dict[str, Any]:
    """The filled-in ``values`` that ``sampler``'s config has (empty ones keep the preset's defaults)."""
    fields = declarations(type(get_sampler(sampler)))
    parsed = {o.name: parse_optional(o, values[o.name]) for o in SAMPLER_FIELDS if o.name in values}
    return {name: value for name, value in parsed.items() if name in fields and value is not None}


def stats_markdown(stats: dict[str, Any], compare: dict[str, float] | None) -> str:
    rows = [("sampler", stats["sampler"]), ("target forward passes", stats["forward_passes"]),
            ("tokens per forward", f"{stats['tokens_per_forward']:.2f}"),
            ("wall time", f"{stats['wall_time_s']:.2f} s")]
    if stats.get("draft_forward_passes"):
        rows.append(("draft forward passes", stats["draft_forward_passes"]))
    if stats.get("details", {}).get("drafter"):
        rows.append(("drafter", stats["details"]["drafter"]))
    if compare:
        rows += [("vanilla AR forward passes", compare["ar_forward_passes"]),
                 ("step compression vs AR", f"{compare['step_compression']:.2f}x"),
                 ("latency ratio vs AR", f"{compare['latency_ratio']:.2f}x")]
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def generate(model: str, sampler: str, class_id: float, num_images: float, seed: float, compare: bool = False,
             gpt_ckpt: str = "", vq_ckpt: str = "", gpt_model: str = "GPT-B", image_size: float = 256,
             **values: Any) -> tuple[Image.Image, Image.Image | None, str, Image.Image | None, str | None]:
    """Images (a grid), the acceptance map (speculative samplers), a stats table, with ``compare`` one token per
    pass (vanilla AR, or target-only sampling for a continuous model) on the same seed, and for a video model the
    mp4 of its clips (the grid then shows their first frames). ``values`` holds the option fields
    (:data:`SAMPLING_FIELDS`, :data:`SAMPLER_FIELDS`), empty = the model's or the sampler's default. Raises
    :class:`InputError` / ``ValueError`` / ``CheckpointError`` on bad input."""
    if not 1 <= int(num_images) <= MAX_IMAGES:
        raise InputError(f"number of images must be in 1..{MAX_IMAGES}, got {num_images}")
    if sampler not in available_samplers():
        raise InputError(f"unknown sampler {sampler!r}; available: {', '.join(available_samplers())}")
    pipe = get_pipeline(model, gpt_ckpt, vq_ckpt, gpt_model, int(image_size))
    if isinstance(pipe, StreamPipeline):
        raise InputError(f"{model} is a streaming video model: use the Streaming tab")
    if compare and getattr(pipe.model, "token_order", "raster") != "raster":
        raise InputError(f"{model} generates in {pipe.model.token_order} order: there is no vanilla AR run of it "
                         f"to compare with (`vgen bench --model {model} --reference-model shapes-c2i` compares it "
                         f"with a next-token model)")
    unknown = sorted(set(values) - set(GENERATE_INPUTS))
    if unknown:
        raise TypeError(f"generate() got unknown option fields {unknown}")
    count, cols = int(num_images), min(4, int(num_images))
    settings = {"seed": int(seed), **{o.name: parse_optional(o, values.get(o.name)) for o in SAMPLING_FIELDS}}
    sampler_values = {name: value for name, value in values.items() if name not in settings}
    chosen = get_sampler(sampler, **sampler_options(sampler, sampler_values))
    if isinstance(pipe, VideoPipeline):
        clips = pipe([int(class_id)], num_videos=count, sampler=chosen, **settings)
        path = Path(tempfile.mkdtemp(prefix="vgen-clip-")) / "clips.mp4"
        write_video(tile_clips(clips.videos, cols), path, fps=8)
        first_frames = image_grid([Image.fromarray(video[0]) for video in clips.videos], cols)
        return first_frames, None, stats_markdown(clips.stats.to_dict(), None), None, str(path)
    out = pipe([int(class_id)], num_images=count, sampler=chosen, **settings)
    amap = None
    if out.stats.accepted_lengths:
        amap = acceptance_figure(out.images, out.stats.accept_step, pipe.model.grid, cols=min(2, cols))
    figures, ar_grid = None, None
    if compare:
        ar = pipe([int(class_id)], num_images=count, sampler=default_sampler(pipe.model), **settings)
        ar_grid = image_grid(ar.images, cols)
        figures = {"ar_forward_passes": ar.stats.forward_passes,
                   "step_compression": ar.stats.forward_passes / out.stats.forward_passes,
                   "latency_ratio": ar.stats.wall_time_s / out.stats.wall_time_s}
    return image_grid(out.images, cols), amap, stats_markdown(out.stats.to_dict(), figures), ar_grid, None


def is_streaming(name: str) -> bool:
    """Whether an embedded model name or pipeline folder holds a streaming (block-diffusion) model."""
    folder = ASSETS / name if name in available_models() else Path(name)
    return (folder / MODEL_FOLDER).is_dir()


def stream_video(model: str, class_id: float, num_frames: float, seed: float, steps: float | str | None,
                 cfg_scale: float | str | None, session: str = "default",
                 fps: int = 8) -> Iterator[tuple[Image.Image, str, str | None]]:
    """Stream a video: after each block, its last frame (enlarged) and a progress line; at the end (or after
    :func:`stop_stream`), the mp4 of every frame done. Empty ``steps`` or ``cfg_scale`` keep the pipeline's
    defaults. Raises :class:`InputError` / ``ValueError`` on bad input."""
    if not 1 <= int(num_frames) <= MAX_STREAM_FRAMES:
        raise InputError(f"frames must be in 1..{MAX_STREAM_FRAMES}, got {num_frames}")
    pipe = get_pipeline(model)
    if not isinstance(pipe, StreamPipeline):
        raise InputError(f"{model} is not a streaming video model: use the Generate tab")
    options = {"steps": parse_optional(STREAM_FIELDS["steps"], steps),
               "cfg_scale": parse_optional(STREAM_FIELDS["cfg_scale"], cfg_scale)}
    pipe.stream_config(**options)  # bad settings fail before anything starts
    control = _CONTROLS[session] = StreamControl()
    path = Path(tempfile.mkdtemp(prefix="vgen-stream-")) / "stream.mp4"
    try:
        with StreamingVideoWriter(path, fps=fps) as writer:
            for block in pipe.stream_blocks([int(class_id)], int(num_frames), seed=int(seed), control=control,
                                            **options):
                writer.write(block.frames[0])
                frame = Image.fromarray(block.frames[0, -1]).resize((256, 256), Image.NEAREST)
                status = (f"frame {block.start_frame + block.frames.shape[1]} / {int(num_frames)}, class "
                          f"{pipe.class_name(block.class_ids[0])}, {block.latency_s * 1000:.0f} ms for this block")
                yield frame, status, None
        done = writer.frames_written
        yield frame, f"{'stopped' if control.stopped else 'done'}: {done} frames", str(path)
    finally:
        _CONTROLS.pop(session, None)


def stop_stream(session: str = "default") -> str:
    """Ask the session's stream to stop after the block in hand."""
    control = _CONTROLS.get(session)
    if control is None:
        return "no stream is running"
    control.stop()
    return "stopping after this block"


def switch_class(class_id: float, session: str = "default") -> str:
    """Change the session's stream to ``class_id`` from its next block on."""
    control = _CONTROLS.get(session)
    if control is None:
        return "no stream is running"
    control.set_class(int(class_id))
    return f"class {int(class_id)} from the next block"


def build_app(default_model: str = "shapes-c2i", max_concurrency: int = 2):
    """The Gradio Blocks page, queued with at most ``max_concurrency`` generations at once."""
    import gradio as gr

    stream_models = [m for m in available_models() if is_streaming(m)]
    with gr.Blocks(title="vgen") as app:
        gr.Markdown("# vgen: visual autoregressive generation with fast samplers")
        with gr.Tabs():
            add_generate_tab(gr, default_model, [m for m in available_models() if m not in stream_models])
            add_stream_tab(gr, stream_models[0] if stream_models else "")
    return app.queue(default_concurrency_limit=max_concurrency)


def add_generate_tab(gr, default_model: str, models: list[str]) -> None:
    """The Generate tab: images, the acceptance map and the stats of one sampler, optionally beside vanilla AR."""
    def run(*args):
        values = dict(zip(GENERATE_INPUTS, args))
        try:
            return generate(**values)
        except (ValueError, CheckpointError, FileNotFoundError) as e:  # InputError is a ValueError
            raise gr.Error(str(e)) from None

    with gr.Tab("Generate"):
        with gr.Row():
            with gr.Column():
                model = gr.Dropdown(models, value=default_model, allow_custom_value=True,
                                    label="model (embedded name or pipeline folder)")
                sampler = gr.Dropdown(available_samplers(), value="sjd", label="sampler")
                class_id = gr.Number(value=0, precision=0, label="class id")
                num_images = gr.Slider(1, MAX_IMAGES, value=4, step=1, label="number of images")
                seed = gr.Number(value=0, precision=0, label="seed")
                sampling = [option_box(gr, o) for o in SAMPLING_FIELDS]
                compare = gr.Checkbox(value=False, label="compare with vanilla AR on the same seed")
                with gr.Accordion("sampler parameters (empty: the preset's default)", open=False):
                    fields = [option_box(gr, o) for o in SAMPLER_FIELDS]
                with gr.Accordion("LlamaGen checkpoints (local paths; nothing is downloaded)", open=False):
                    gpt_ckpt = gr.Textbox(value="", label="GPT checkpoint (.pt)")
                    vq_ckpt = gr.Textbox(value="", label="VQ checkpoint (.pt)")
                    gpt_model = gr.Dropdown(["GPT-B", "GPT-L", "GPT-XL", "GPT-XXL", "GPT-3B"], value="GPT-B",
                                            label="GPT size")
                    image_size = gr.Dropdown([256, 384, 512], value=256, label="image size")
                button = gr.Button("Generate", variant="primary")
            with gr.Column():
                images = gr.Image(type="pil", label="images", format="png", height=192)
                amap = gr.Image(type="pil", label="acceptance map (pass that produced each token)", format="png")
                stats = gr.Markdown()
                ar_images = gr.Image(type="pil", label="vanilla AR, same seed", format="png")
                clip = gr.Video(label="clips (video models)")
        gr.Examples([[default_model, "ar", 0, 4, 0], [default_model, "mcsjd", 3, 4, 1],
                     [default_model, "lantern", 7, 8, 2]], [model, sampler, class_id, num_images, seed])
    inputs = [model, sampler, class_id, num_images, seed, compare, gpt_ckpt, vq_ckpt, gpt_model, image_size,
              *sampling, *fields]
    button.click(run, inputs, [images, amap, stats, ar_images, clip], api_name="generate")

    def model_changed(name: str, current: str):
        choices = samplers_for(name)
        return gr.update(choices=choices, value=current if current in choices else choices[0])

    model.change(model_changed, [model, sampler], sampler, api_name=False)


def add_stream_tab(gr, default_model: str) -> None:
    """The Streaming tab: frames play as blocks complete; Stop and a class switch reach the running stream."""
    def session_of(request: gr.Request | None) -> str:
        return getattr(request, "session_hash", None) or "default"

    def run(model, class_id, num_frames, seed, steps, cfg_scale, request: gr.Request):
        try:
            yield from stream_video(model, class_id, num_frames, seed, steps, cfg_scale, session_of(request))
        except (ValueError, CheckpointError, FileNotFoundError) as e:
            raise gr.Error(str(e)) from None

    with gr.Tab("Streaming"), gr.Row():
        with gr.Column():
            model = gr.Dropdown([m for m in available_models() if is_streaming(m)], value=default_model,
                                allow_custom_value=True, label="streaming model (embedded name or pipeline folder)")
            class_id = gr.Number(value=0, precision=0, label="class of the video")
            num_frames = gr.Number(value=160, precision=0, label="frames")
            seed = gr.Number(value=0, precision=0, label="seed")
            steps = option_box(gr, STREAM_FIELDS["steps"])
            cfg_scale = option_box(gr, STREAM_FIELDS["cfg_scale"])
            start = gr.Button("Stream", variant="primary")
            stop = gr.Button("Stop")
            new_class = gr.Number(value=1, precision=0, label="switch to class")
            switch = gr.Button("Switch class at the next block")
        with gr.Column():
            frame = gr.Image(type="pil", label="latest frame", format="png", height=256)
            status = gr.Markdown()
            video = gr.Video(label="the stream so far (mp4)")
    def stop_clicked(request: gr.Request) -> str:
        return stop_stream(session_of(request))

    def switch_clicked(c: float, request: gr.Request) -> str:
        return switch_class(c, session_of(request))

    # gradio passes the request to a parameter annotated gr.Request; with postponed annotations the string
    # "gr.Request" cannot be resolved (gr is a local here), so the type is set on the functions themselves
    for fn in (run, stop_clicked, switch_clicked):
        fn.__annotations__["request"] = gr.Request
    start.click(run, [model, class_id, num_frames, seed, steps, cfg_scale], [frame, status, video],
                api_name="stream")
    stop.click(stop_clicked, None, status, api_name="stop_stream", concurrency_limit=None)
    switch.click(switch_clicked, new_class, status, api_name="switch_class", concurrency_limit=None)
