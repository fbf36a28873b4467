"""vgen's web demo (``vgen app``): a thin Gradio page over the pipeline API, with no generation logic of its own.

The model list comes from :func:`vgen.available_models` and the folders its operator names (:class:`ModelAccess`;
any server path, and LlamaGen checkpoint paths, only when the operator allows local models), the sampler list
from the sampler registry, and a sampler's parameters are passed only when its config has them and the field is
filled in (empty = the preset's own default; a number field shows the model's or the sampler's value and its
declared bounds, as a browser sends an empty one as 0). The Generate tab shows the class box (a name or an id)
for a class-conditional model and a prompt box with the model's example prompts and its words for a
text-to-image one, switching with the model (:func:`model_controls`); a prompt's unknown words are noted under
the stats, with what to say instead. Streaming models get their own tab, where
frames play as each block completes, with Stop (at the next denoising step) and a switch that takes effect at the
next block: the class box and a class switch for a class model, a prompt box with the model's example prompts and a
prompt switch for a text model (:func:`stream_controls`).

Every field is checked before any work: numbers against the same option declarations the command line uses
(:class:`PageFields` for the page's own), text against a length cap (a prompt also against the words its model
reads), models against the access rules. Bad input is shown in the page as one message that never echoes a long
value or tells whether a server path exists, and logged as one line; the app keeps serving. Generations and streams
share one concurrency limit; each request's files live in a temporary folder that is removed once Gradio has its
copy. The server (:func:`serve`) takes no upload, runs only the handlers the page calls itself
(:class:`PageGate`) and sends Gradio no analytics; SIGTERM stops it as Ctrl-C does, removing Gradio's cache.
``/generate`` names its parameters as :data:`GENERATE_INPUTS` does. ``gradio`` is imported lazily: it is the
``app`` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import io
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from vgen.apps.models_cli import pipeline_info, vocabulary_lines
from vgen.apps.options import class_label, cut_values, one_line, sampler_classes, sampling_options
from vgen.data.scenes import caption_words
from vgen.hub import ASSETS, CheckpointError
from vgen.images import image_grid
from vgen.models.llamagen import GPT_SIZES
from vgen.models.word_encoder import WordTextEncoder, unknown_word_notes
from vgen.pipelines import (
    DEFAULT_TEXT_MODEL,
    ImagePipeline,
    StreamPipeline,
    VideoPipeline,
    available_models,
    default_sampler,
    load,
    load_llamagen,
    pipeline_folder,
    tile_clips,
)
from vgen.pipelines.image import TEXT_ENCODER_FOLDER
from vgen.pipelines.inputs import check_prompts
from vgen.pipelines.stream import MODEL_FOLDER
from vgen.samplers import SamplingParams, available_samplers, get_sampler
from vgen.samplers.options import (
    DeclaredOption,
    Option,
    declarations,
    declared_options,
    merge_settings,
    option,
    parse_option,
)
from vgen.samplers.streaming import StreamConfig, StreamControl
from vgen.video_io import StreamingVideoWriter, write_video
from vgen.visualize import acceptance_figure


@dataclass(frozen=True)
class PageFields:
    """The page's own numbers, declared as the samplers' options are: the bounds a request must meet."""

    class_id: int = option(0, "class id", at_least=0)
    num_images: int = option(4, "number of images (clips for a video model)", at_least=1, at_most=16)
    seed: int = option(0, "random seed", at_least=0, at_most=2**63 - 1)
    num_frames: int = option(160, "frames to stream", at_least=1, at_most=2000)
    clip_frames: int = option(0, "frames a clip (longer than the model's window: window by window)", at_least=0,
                              at_most=64, note="0 = the model's window")


# the page's option fields, from the declarations: its own, the settings every sampler shares, then every
# sampler's own (but compile: compiling takes longer than the page's generations)
PAGE_FIELDS = declarations(PageFields)
SAMPLING_FIELDS = sampling_options()
SAMPLER_FIELDS = declared_options(sampler_classes(), exclude=("compile",))
STREAM_FIELDS = declarations(StreamConfig)
# the Generate tab's inputs, in the order the page (and its API, /generate) takes them
GENERATE_INPUTS = ["model", "sampler", "class_id", "prompt", "num_images", "seed", "clip_frames", "compare",
                   "gpt_ckpt", "vq_ckpt", "gpt_model", "image_size", *(o.name for o in SAMPLING_FIELDS),
                   *(o.name for o in SAMPLER_FIELDS)]
MAX_STREAM_FRAMES = int(PAGE_FIELDS["num_frames"].spec.at_most)
MAX_TEXT = 256  # characters of a text field: names, paths and numbers are far shorter
LLAMAGEN_IMAGE_SIZES = (256, 384, 512)
CONCURRENCY_ID = "vgen"  # generations, streams and model loads share one limit
TEMP_PREFIX = "vgen-app-"
API_PREFIX = "/gradio_api"
UPLOAD_ROUTES = ("upload", "process_recording")  # the last part of the paths where Gradio stores what is sent
SHARE_HINTS = ("set `share=True` in `launch()`", "run `vgen app --share`")  # Gradio's launch hint, and the CLI's
_LOAD_LOCK = threading.Lock()
log = logging.getLogger(__name__)


class InputError(ValueError):
    """A problem with what the user entered, shown in the page."""


def page_message(error: Exception) -> str:
    """What the page shows for a refused request: the error's message on one line, every value it echoes cut
    (:func:`~vgen.apps.options.cut_values`)."""
    return one_line(cut_values(str(error)))


def refusal(gr, error: Exception):
    """The page's answer to a refused request (:func:`page_message`), logged as one line: a refusal is expected,
    so it leaves no traceback in the server's log (an error that is not a refusal still does)."""
    message = page_message(error)
    log.warning("vgen app: refused: %s", message)
    return gr.Error(message, print_exception=False)


def text_field(name: str, value: Any) -> str:
    """A field's value as text, stripped; refused without echoing it when over :data:`MAX_TEXT` characters."""
    text = "" if value is None else str(value)
    if len(text) > MAX_TEXT:
        raise InputError(f"{name} is {len(text)} characters long; at most {MAX_TEXT} are accepted")
    return text.strip()


@dataclass(frozen=True)
class ModelAccess:
    """What a visitor may load: the embedded models, the pipeline ``folders`` the operator lists, and, only with
    ``local_paths``, any server path and LlamaGen checkpoints. Refusals are decided on the name alone, before the
    file system is looked at, so that they do not tell whether a path exists."""

    folders: tuple[str, ...] = ()
    local_paths: bool = False

    def models(self) -> list[str]:
        """The models the page lists: the embedded ones, then the operator's folders."""
        return [*available_models(), *self.folders]

    def check(self, model: str) -> str:
        """``model`` (stripped) when it may be loaded, else an :class:`InputError` that lists what may."""
        model = text_field("model", model)
        if model in self.models() or self.local_paths:
            return model
        raise InputError(f"unknown model {model!r}; this server offers: {', '.join(self.models())}")

    def check_checkpoints(self) -> None:
        if not self.local_paths:
            raise InputError("checkpoint paths are off on this server (its operator can turn them on with "
                             "--allow-local-models); choose one of its models")


def is_streaming(name: str) -> bool:
    """Whether an embedded model name or pipeline folder holds a streaming (block-diffusion) model."""
    folder = ASSETS / name if name in available_models() else Path(name)
    return (folder / MODEL_FOLDER).is_dir()


@functools.lru_cache(maxsize=4)
def _pipeline(model: str, gpt_ckpt: str, vq_ckpt: str, gpt_model: str,
              image_size: int) -> ImagePipeline | StreamPipeline:
    if gpt_ckpt or vq_ckpt:
        return load_llamagen(gpt_ckpt, vq_ckpt, gpt_model=gpt_model, image_size=image_size)
    return load(model)


def get_pipeline(model: str, gpt_ckpt: str = "", vq_ckpt: str = "", gpt_model: str = "GPT-B",
                 image_size: Any = 256, access: ModelAccess = ModelAccess()) -> ImagePipeline | StreamPipeline:
    """The pipeline of ``model`` (or of LlamaGen checkpoints) if ``access`` allows it, kept for reuse (loading is
    the slow part); one load at a time."""
    gpt_ckpt, vq_ckpt = text_field("GPT checkpoint", gpt_ckpt), text_field("VQ checkpoint", vq_ckpt)
    if gpt_ckpt or vq_ckpt:
        access.check_checkpoints()
        if not (gpt_ckpt and vq_ckpt):
            raise InputError("LlamaGen checkpoints need both a GPT and a VQ checkpoint path")
        gpt_model, size = text_field("GPT size", gpt_model), text_field("image size", image_size)
        if size not in map(str, LLAMAGEN_IMAGE_SIZES):
            raise InputError(f"image size must be one of {LLAMAGEN_IMAGE_SIZES}, got {size!r}")
        model, image_size = "", int(size)
    else:
        model, gpt_model, image_size = access.check(model), "", 0
    with _LOAD_LOCK:
        return _pipeline(model, gpt_ckpt, vq_ckpt, gpt_model, image_size)


@dataclass(frozen=True)
class ModelControls:
    """What the Generate tab offers for a model: the samplers that fit its token order, and a prompt box with its
    example prompts (a text-to-image model) or the class picker."""

    samplers: list[str]
    text_to_image: bool = False
    example_prompts: tuple[str, ...] = ()
    video: bool = False
    class_names: tuple[str, ...] = ()
    vocabulary: tuple[str, ...] = ()  # a word-level text encoder's words, a line per attribute
    # the model's recommended sampling settings, which its number fields show
    settings: dict[str, Any] = dataclasses.field(default_factory=lambda: SamplingParams().to_dict())

    def class_help(self) -> str:
        """The class box's help: the model's class names, when it records them."""
        names = f": {', '.join(self.class_names)}" if self.class_names else ""
        return f"a class name{names}, or its id (0 = the first)"

    def vocabulary_markdown(self) -> str:
        """The words a text model knows, by attribute, to show beside the prompt box; empty for any other."""
        if not self.vocabulary:
            return ""
        return "**The words this model knows** (a single shape):\n\n" + "\n".join(
            f"- {line}" for line in self.vocabulary)


def model_controls(model: str, access: ModelAccess = ModelAccess()) -> ModelControls:
    """The controls for ``model``: ``nar`` for a NAR model, the raster samplers for AR, and a prompt box for a
    text-to-image model; every registered sampler and the class picker when the name does not load, so that the
    page can still show why on Generate."""
    try:
        pipe = get_pipeline(model, access=access)
    except (ValueError, CheckpointError, OSError):
        return ModelControls(available_samplers())
    samplers = available_samplers(getattr(pipe.model, "token_order", "raster"))
    settings = SamplingParams(**merge_settings(pipe.info.defaults, {})).to_dict()
    if not getattr(pipe, "text_conditional", False):
        return ModelControls(samplers, video=isinstance(pipe, VideoPipeline),
                             class_names=tuple(pipe.info.class_names or ()), settings=settings)
    encoder = getattr(pipe, "text_encoder", None)
    words = vocabulary_lines(encoder.config.vocabulary) if isinstance(encoder, WordTextEncoder) else []
    return ModelControls(samplers, True, tuple(pipe.info.example_prompts or ()), vocabulary=tuple(words),
                         settings=settings)


@dataclass(frozen=True)
class StreamControls:
    """What the Streaming tab offers for a model: a prompt box with its example prompts (a text model) or the
    class box, the switch box to match, and the recommended settings its number fields show."""

    text: bool = False
    example_prompts: tuple[str, ...] = ()
    settings: dict[str, Any] = dataclasses.field(default_factory=lambda: dataclasses.asdict(StreamConfig()))

    def switch_help(self) -> str:
        return f"{'a prompt' if self.text else 'a class name or its id'}, streamed from the next block on"

    def switch_value(self) -> str:
        """What the switch box shows first: the second example prompt of a text model, class 1 of a class model."""
        return (self.example_prompts[1:2] or ("",))[0] if self.text else "1"


def stream_controls(model: str, access: ModelAccess = ModelAccess()) -> StreamControls:
    """The Streaming tab's controls for ``model``, read from its folder without loading it (a text model is one
    with a text encoder beside it); a class model's with the stream's own defaults when the name does not load."""
    try:
        folder = pipeline_folder(access.check(model))
        info = pipeline_info(folder)
    except (ValueError, CheckpointError, OSError):
        return StreamControls()
    text = (folder / TEXT_ENCODER_FOLDER).is_dir()
    return StreamControls(text, tuple(info.example_prompts or ()) if text else (),
                          dataclasses.asdict(StreamConfig(**merge_settings(info.defaults, {}))))


def page_condition(pipe: ImagePipeline, class_id: Any, prompt: Any) -> dict[str, Any]:
    """The pipeline's condition from the page: the prompt for a text-to-image model (checked against the length
    cap and the words its text encoder reads), the class id otherwise; the other field is not read."""
    if not pipe.text_conditional:
        return {"class_ids": [page_class(class_id)]}
    return {"prompt": page_prompt(pipe, prompt)}


def page_prompt(pipe: ImagePipeline | StreamPipeline, prompt: Any) -> str:
    """A text model's prompt from the page, checked against the length cap and the words its text encoder
    reads."""
    if prompt is not None and not isinstance(prompt, str):
        check_prompts(prompt, many=False)  # refuses it by the pipelines' rule: a prompt is text, never str(value)
    text = text_field("prompt", prompt)
    if not text:
        example = f", e.g. {pipe.info.example_prompts[0]!r}" if pipe.info.example_prompts else ""
        raise InputError(f"the prompt is empty: {pipe.info.name} draws what a prompt describes{example}")
    encoder = pipe.text_encoder
    if isinstance(encoder, WordTextEncoder):
        words, kept = len(caption_words(text)), encoder.max_length - 1
        if words > kept:
            raise InputError(f"the prompt has {words} words; {pipe.info.name} reads at most {kept}: shorten it")
    return text


def parse_optional(option: DeclaredOption, value: Any) -> Any:
    """A field the page may leave empty: None when empty, else the value read as the option's type (a finite
    number for a number)."""
    text = text_field(option.name, value)
    if not text:
        return None
    try:
        return parse_option(option.name, text, option.kind)
    except ValueError as e:
        raise InputError(str(e)) from None


def page_number(name: str, value: Any, optional: bool = False) -> int | None:
    """One of the page's own numbers (:class:`PageFields`), read and checked against its declaration; an empty
    ``optional`` one is None."""
    declared = PAGE_FIELDS[name]
    number = parse_optional(declared, value)
    if number is None:
        if optional:
            return None
        raise InputError(f"{name} is empty: {declared.help}")
    try:
        declared.spec.check(name, number, declared.kind)
    except ValueError as e:
        raise InputError(str(e)) from None
    return number


def page_class(value: Any) -> int | str:
    """A class field: a class name (text that is not a number; the pipeline checks it and lists the names) or a
    class id, read and checked as :func:`page_number` does."""
    if isinstance(value, str):
        text = text_field("class", value)
        try:
            float(text)
        except ValueError:
            if text:
                return text
    return page_number("class_id", value)


def unchecked(number):
    """A number field that passes every value it is sent on as is, to vgen's checks (:func:`page_number`,
    :func:`parse_optional`), which say what is wrong with it: Gradio's own check of its bounds would round a number
    first, and fail on infinity or on text sent to the API. The browser still shows the bounds. (On the instance:
    a subclass of a Gradio component would make Gradio write a type stub beside this module.)"""
    number.preprocess = lambda payload: payload
    return number


def bounds(spec: Option) -> dict[str, float]:
    """The ``minimum`` and ``maximum`` of a number field for a declaration (an open bound as its limit)."""
    low = spec.at_least if spec.at_least is not None else spec.above
    high = spec.at_most if spec.at_most is not None else spec.below
    return {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}


def option_box(gr, option: DeclaredOption, value: Any = None):
    """The field of a declared option: a number field with its bounds showing ``value`` (default: the option's
    own; a browser sends an empty number field as 0, so a number field is never empty), a list of its choices or
    a text box, empty = the model's (or the sampler's) value; with its name and help."""
    shown = dict(label=option.name, info=option.help)
    if option.kind in (int, float):
        return unchecked(gr.Number(value=option.default if value is None else value,
                                   step=1 if option.kind is int else 0.01, **bounds(option.spec), **shown))
    if option.spec.allowed() is not None:
        return gr.Dropdown(["", *option.spec.allowed()], value="", allow_custom_value=True, **shown)
    return gr.Textbox(value="", placeholder="empty: the default", **shown)


def number_box(gr, name: str, label: str, value: int | None, visible: bool = True):
    """The number field of one of the page's own numbers, with its declared bounds; any value reaches
    :func:`page_number`, which says what is wrong with it."""
    declared = PAGE_FIELDS[name]
    return unchecked(gr.Number(value=value, label=label, info=declared.help, step=1, visible=visible,
                               **bounds(declared.spec)))


def class_box(gr, label: str, value: str, info: str, visible: bool = True):
    """The class field: a class name or an id (:func:`page_class`)."""
    return gr.Textbox(value=value, label=label, info=info, visible=visible, placeholder="a class name or id")


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


def generate(model: str, sampler: str, class_id: Any, num_images: Any, seed: Any, compare: bool = False,
             gpt_ckpt: str = "", vq_ckpt: str = "", gpt_model: str = "GPT-B", image_size: Any = 256, prompt: Any = "",
             clip_frames: Any = "", *, folder: str | Path, access: ModelAccess = ModelAccess(),
             **values: Any) -> tuple[Image.Image, Image.Image | None, str, Image.Image | None, str | None]:
    """Images (a grid) of ``class_id``, or of ``prompt`` for a text-to-image model, the acceptance map
    (speculative samplers), a stats table, with ``compare`` one token per pass (vanilla AR, or target-only
    sampling for a continuous model) on the same seed, and for a video model the mp4 of its clips of
    ``clip_frames`` (empty: the model's window), written in ``folder`` (the grid then shows their first frames).
    ``values`` holds the option fields (:data:`SAMPLING_FIELDS`, :data:`SAMPLER_FIELDS`), empty = the model's or
    the sampler's default.
    Raises :class:`InputError` / ``ValueError`` / ``CheckpointError`` on bad input."""
    unknown = sorted(set(values) - set(GENERATE_INPUTS))
    if unknown:
        raise TypeError(f"generate() got unknown option fields {unknown}")
    count, seed = (page_number(n, v) for n, v in [("num_images", num_images), ("seed", seed)])
    frames = page_number("clip_frames", clip_frames, optional=True) or None  # 0, empty: the model's window
    sampler = text_field("sampler", sampler)
    if sampler not in available_samplers():
        raise InputError(f"unknown sampler {sampler!r}; available: {', '.join(available_samplers())}")
    pipe = get_pipeline(model, gpt_ckpt, vq_ckpt, gpt_model, image_size, access)
    if isinstance(pipe, StreamPipeline):
        raise InputError(f"{pipe.info.name} is a streaming video model: use the Streaming tab")
    if compare and getattr(pipe.model, "token_order", "raster") != "raster":
        raise InputError(f"{pipe.info.name} generates in {pipe.model.token_order} order: there is no vanilla AR run "
                         f"of it to compare with (`vgen bench --model {pipe.info.name} --reference-model shapes-c2i` "
                         f"compares it with a next-token model)")
    condition = page_condition(pipe, class_id, prompt)
    cols = min(4, count)
    settings = {"seed": seed, **{o.name: parse_optional(o, values.get(o.name)) for o in SAMPLING_FIELDS}}
    sampler_values = {name: value for name, value in values.items() if name not in settings}
    chosen = get_sampler(sampler, **sampler_options(sampler, sampler_values))
    if isinstance(pipe, VideoPipeline):
        clips = pipe(condition["class_ids"], num_videos=count, sampler=chosen,
                     num_frames=frames, **settings)
        path = write_video(tile_clips(clips.videos, cols), Path(folder) / "clips.mp4", fps=8)
        first_frames = image_grid([Image.fromarray(video[0]) for video in clips.videos], cols)
        return first_frames, None, stats_markdown(clips.stats.to_dict(), None), None, str(path)
    out = pipe(**condition, num_images=count, sampler=chosen, **settings)
    amap = None
    if out.stats.accepted_lengths:
        amap = acceptance_figure(out.images, out.stats.accept_step, pipe.model.grid, cols=min(2, cols))
    figures, ar_grid = None, None
    if compare:
        ar = pipe(**condition, num_images=count, sampler=default_sampler(pipe.model), **settings)
        ar_grid = image_grid(ar.images, cols)
        figures = {"ar_forward_passes": ar.stats.forward_passes,
                   "step_compression": ar.stats.forward_passes / out.stats.forward_passes,
                   "latency_ratio": ar.stats.wall_time_s / out.stats.wall_time_s}
    table = stats_markdown(out.stats.to_dict(), figures) + prompt_note(pipe, condition.get("prompt"))
    return image_grid(out.images, cols), amap, table, ar_grid, None


def prompt_note(pipe: ImagePipeline | StreamPipeline, prompt: str | None) -> str:
    """What the page adds under the stats about a prompt's words a word-level text encoder does not know (the
    warning the command line prints, :func:`~vgen.models.word_encoder.unknown_word_notes`); empty when none."""
    encoder = getattr(pipe, "text_encoder", None)
    if prompt is None or not isinstance(encoder, WordTextEncoder):
        return ""
    notes = unknown_word_notes(prompt, encoder.known)
    return f"\n\n**Note:** the prompt's {notes}" if notes else ""


def stream_video(model: str, class_id: Any, num_frames: Any, seed: Any, steps: Any, cfg_scale: Any,
                 prompt: Any = None, *, folder: str | Path, control: StreamControl | None = None,
                 access: ModelAccess = ModelAccess(), fps: int = 8
                 ) -> Iterator[tuple[Image.Image | None, str, str | None]]:
    """Stream a video of the class (a class model) or the prompt (a text model; the other field is not read):
    after each block, its last frame (enlarged) and a progress line naming the block's class or prompt (and the
    prompt's unknown words, :func:`prompt_note`); at the end (or once ``control`` stops it), the mp4 of every frame
    done, written in ``folder``. Empty ``steps`` or ``cfg_scale`` keep the pipeline's defaults. Raises
    :class:`InputError` / ``ValueError`` on bad input."""
    num_frames, seed = (page_number(n, v) for n, v in [("num_frames", num_frames), ("seed", seed)])
    pipe = get_pipeline(model, access=access)
    if not isinstance(pipe, StreamPipeline):
        raise InputError(f"{pipe.info.name} is not a streaming video model: use the Generate tab")
    if pipe.is_text:
        condition = {"prompt": page_prompt(pipe, prompt)}
    else:
        condition = {"class_ids": [pipe.class_id(page_class(class_id))]}
    options = {"steps": parse_optional(STREAM_FIELDS["steps"], steps),
               "cfg_scale": parse_optional(STREAM_FIELDS["cfg_scale"], cfg_scale)}
    pipe.stream_config(**options)  # bad settings fail before anything starts
    control = StreamControl() if control is None else control
    path, frame = Path(folder) / "stream.mp4", None
    with StreamingVideoWriter(path, fps=fps) as writer:
        for block in pipe.stream_blocks(num_frames=num_frames, seed=seed, control=control, **condition, **options):
            writer.write(block.frames[0])
            frame = Image.fromarray(block.frames[0, -1]).resize((256, 256), Image.NEAREST)
            shown = f'prompt "{block.prompts[0]}"' if block.prompts else f"class {pipe.class_name(block.class_ids[0])}"
            recached = f" ({block.recache_s * 1000:.0f} ms re-encoding the cache)" if block.recache_s else ""
            switched = f", switched here{recached}" if block.switched else ""
            status = (f"frame {block.start_frame + block.frames.shape[1]} / {num_frames}, {shown}, "
                      f"{block.latency_s * 1000:.0f} ms for this block{switched}"
                      + prompt_note(pipe, block.prompts[0] if block.prompts else None))
            yield frame, status, None
    done = writer.frames_written
    yield frame, f"{'stopped' if control.stopped else 'done'}: {done} frames", str(path) if done else None


class StreamSessions:
    """The running streams of each browser session, newest last: Stop and the switch reach the newest one, and a
    session that goes away (its tab closed) cancels all of its streams. A request without a session (None) reaches
    no stream, and its own stream is reached by no other request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[object, list[StreamControl]] = {}
        self._targets: dict[StreamControl, Callable[[Any], int | str]] = {}

    @contextlib.contextmanager
    def running(self, session: str | None,
                target: Callable[[Any], int | str] | None = None) -> Iterator[StreamControl]:
        """The control of a new stream of ``session``, registered while the block runs; ``target`` reads the
        switch box for it (:func:`stream_target`; none: class ids only)."""
        control, key = StreamControl(), object() if session is None else session
        with self._lock:
            self._streams.setdefault(key, []).append(control)
            if target is not None:
                self._targets[control] = target
        try:
            yield control
        finally:
            with self._lock:
                streams = self._streams[key]
                streams.remove(control)
                self._targets.pop(control, None)
                if not streams:
                    del self._streams[key]

    def newest(self, session: str | None) -> StreamControl | None:
        with self._lock:
            return None if session is None else self._streams.get(session, [None])[-1]

    def count(self) -> int:
        """Streams running in all sessions."""
        with self._lock:
            return sum(map(len, self._streams.values()))

    def stop(self, session: str | None) -> str:
        """Stop the session's newest stream at its next denoising step."""
        control = self.newest(session)
        if control is None:
            return "no stream is running"
        control.cancel()
        return "stopping"

    def switch(self, session: str | None, value: Any) -> str:
        """Change the session's newest stream to ``value`` from its next block on: read by the stream's
        ``target``, else as a class id (:func:`page_class`)."""
        control = self.newest(session)
        if control is None:
            return "no stream is running"
        with self._lock:
            read = self._targets.get(control)
        target = page_class(value) if read is None else read(value)
        if read is None and isinstance(target, str):
            raise InputError(f"this stream takes class ids, not names such as {target!r}")
        control.switch_to(target)
        return f"{'class' if isinstance(target, int) else 'prompt'} {target!r} from the next block"

    def end(self, session: str | None) -> None:
        """Cancel every stream of a session that has gone away."""
        with self._lock:
            controls = [] if session is None else list(self._streams.get(session, []))
        for control in controls:
            control.cancel()


_END = object()


async def iterate_in_thread(items: Generator[Any, None, None],
                            cancel: Callable[[], None]) -> AsyncIterator[Any]:
    """``items`` iterated in a worker thread of its own. When the consumer goes away (Gradio cancels the event or
    closes this iterator), ``cancel`` is called at once, while the worker may still be inside a step, and
    ``items`` is closed in the worker after that step, so that its ``finally`` blocks run there."""
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vgen-stream")
    finished = False
    try:
        while (item := await asyncio.wrap_future(worker.submit(next, items, _END))) is not _END:
            yield item
        finished = True
    finally:
        if not finished:
            cancel()
        worker.submit(items.close)
        worker.shutdown(wait=False)


def build_app(default_model: str = DEFAULT_TEXT_MODEL, max_concurrency: int = 2, access: ModelAccess = ModelAccess(),
              sessions: StreamSessions | None = None):
    """The Gradio Blocks page, with at most ``max_concurrency`` generations, streams and model loads at once in
    all, serving the models ``access`` allows; ``sessions`` keeps its running streams. Gradio's cached outputs are
    removed after an hour and at exit."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # a local tool sends nothing; read where Gradio is imported
    import gradio as gr

    stream_models = [m for m in access.models() if is_streaming(m)]
    sessions = StreamSessions() if sessions is None else sessions
    limit = dict(concurrency_limit=max_concurrency, concurrency_id=CONCURRENCY_ID)
    with gr.Blocks(title="vgen", delete_cache=(3600, 3600), analytics_enabled=False) as app:
        gr.Markdown("# vgen: visual autoregressive generation with fast samplers")
        with gr.Tabs():
            add_generate_tab(gr, default_model, [m for m in access.models() if m not in stream_models], access, limit)
            add_stream_tab(gr, stream_models[0] if stream_models else "", stream_models, access, sessions, limit)

        def session_gone(request: gr.Request) -> None:
            sessions.end(session_of(request))

        session_gone.__annotations__["request"] = gr.Request  # see add_stream_tab
        app.unload(session_gone)  # run by Gradio's heartbeat of the session only (PageGate)
    return app.queue(default_concurrency_limit=max_concurrency, api_open=False)  # every call waits in the queue


def serve(app, host: str = "127.0.0.1", port: int = 7860, share: bool = False, **launch: Any):
    """Launch the page behind :class:`PageGate` and, unless ``prevent_thread_lock``, serve until Ctrl-C or
    SIGTERM (:func:`sigterm_interrupts`), then close it. Gradio's launch lines are printed with its hint for a
    public link given as the command's flag (``--share``). Closing the app ends its open connections too, so that the
    server's shutdown, which removes Gradio's cache, completes (Gradio's own wait for Ctrl-C stops only the server,
    which waits for a connected page past its exit)."""
    from starlette.middleware import Middleware

    wait = not launch.pop("prevent_thread_lock", False)
    with sigterm_interrupts():
        try:
            with contextlib.redirect_stdout(io.StringIO()) as said:  # Gradio's launch lines, its hint the CLI's
                launched = app.launch(server_name=host, server_port=port, share=share, prevent_thread_lock=True,
                                      app_kwargs={"middleware": [Middleware(PageGate, blocks=app)]}, **launch)
        finally:
            print(said.getvalue().replace(*SHARE_HINTS), end="", flush=True)
        try:
            while wait and app.is_running:
                time.sleep(0.1)
        except KeyboardInterrupt:
            app.close()
    return launched


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raised as ``KeyboardInterrupt`` in the main thread while the block runs, as Ctrl-C is; nothing
    changes when the block runs in another thread (only the main thread takes signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def page_handlers(blocks) -> dict[int, str]:
    """The handlers the page calls itself, by number and API name: those with Python code that an event of the
    page triggers (not the session's unload handler, which Gradio's heartbeat runs)."""
    return {number: fn.api_name for number, fn in blocks.fns.items()
            if fn.fn is not None and any(event != "unload" for _, event in fn.targets)}


class PageGate:
    """ASGI middleware in front of the page's server that lets through what the page sends and refuses the rest
    with one line (logged as one line) before Gradio sees it:

    - every upload: a multipart body and Gradio's upload routes, so that no file is stored, empty or not;
    - a call of a handler that the page does not call itself (:func:`page_handlers`), by number or by name, on
      any of Gradio's call routes, and a call with another number of values than its handler takes (Gradio would
      answer it with an empty error and a traceback in the log);
    - a second heartbeat of a connected session: Gradio ends a session, and its streams, when a heartbeat of it
      closes, so a client that sent another's session hash could end it."""

    def __init__(self, app: Callable, blocks: Any) -> None:
        self.app, self.blocks = app, blocks
        self.connected: set[str] = set()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"].rstrip("/"), scope["method"]
        route = path.partition(API_PREFIX)[2]  # Gradio's API routes, after any prefix a proxy adds
        if path.rsplit("/", 1)[-1] in UPLOAD_ROUTES or dict(scope["headers"]).get(b"content-type", b"").startswith(
                b"multipart/"):
            return await refuse(scope, receive, send, 403, f"this server takes no uploads ({method} {path!r})")
        if route.startswith("/heartbeat/"):
            return await self.heartbeat(route.removeprefix("/heartbeat/"), scope, receive, send)
        if method == "POST" and route.startswith(("/queue/join", "/run/", "/api/", "/call/")):
            body, receive = await read_body(receive)
            if problem := self.call_problem(route, body):
                return await refuse(scope, receive, send, *problem)
        await self.app(scope, receive, send)

    def call_problem(self, route: str, body: bytes) -> tuple[int, str] | None:
        """The status and message of what is wrong with a call to ``route`` (``/queue/join``, ``/run/NAME``,
        ``/api/NAME``, ``/call/NAME``, ``/call/v2/NAME``) with ``body``, or None: it names none of
        :func:`page_handlers` (by its number in the body, else by its name, as Gradio reads them), or gives it
        another number of values than it takes. A body Gradio cannot read is left to Gradio to refuse."""
        from gradio.data_classes import PredictBody

        handlers, name = page_handlers(self.blocks), route.rsplit("/", 1)[-1]
        try:
            call = None if route.startswith("/call/v2/") else PredictBody.model_validate_json(body)
        except ValueError:
            call = None
        number = None if call is None or route.startswith("/call/") else call.fn_index
        if number is None:
            if route == "/queue/join":
                return None  # Gradio refuses a join without a number
            number = next((n for n, api_name in handlers.items() if api_name == name), None)
        if number not in handlers:
            return 404, f"{API_PREFIX + route!r} names no handler of this page"
        inputs = self.blocks.fns[number].inputs
        if call is not None and len(call.data) not in {len(inputs), sum(not b.skip_api for b in inputs)}:
            return 422, f"{handlers[number]} takes {len(inputs)} values, got {len(call.data)}"
        return None

    async def heartbeat(self, session: str, scope: dict, receive: Callable, send: Callable) -> None:
        """The session's heartbeat, unless it is connected already."""
        if session in self.connected:
            return await refuse(scope, receive, send, 409, f"session {session!r} is connected already")
        self.connected.add(session)
        try:
            await self.app(scope, receive, send)
        finally:
            self.connected.discard(session)


async def refuse(scope: dict, receive: Callable, send: Callable, status: int, message: str) -> None:
    """Answer a request with ``status`` and ``message`` (every echoed value cut), as FastAPI answers errors, and
    log it as one line."""
    from starlette.responses import JSONResponse

    message = one_line(cut_values(message))
    log.warning("vgen app: refused: %s", message)
    await JSONResponse({"detail": message}, status)(scope, receive, send)


async def read_body(receive: Callable) -> tuple[bytes, Callable]:
    """A request's whole body, and a ``receive`` that hands it on as if it were unread."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message["type"] == "http.request" and message.get("more_body", False)
    body = b"".join(chunks)
    pending = [message if message["type"] != "http.request" else {"type": "http.request", "body": body}]

    async def replay() -> dict:
        return pending.pop() if pending else await receive()

    return body, replay


def session_of(request: Any) -> str | None:
    """The session of a request: Gradio's session hash; None for a request without one."""
    return getattr(request, "session_hash", None) or None


def model_label(access: ModelAccess, kind: str) -> str:
    return f"{kind} ({'a listed name or a server folder' if access.local_paths else 'one this server offers'})"


def add_generate_tab(gr, default_model: str, models: list[str], access: ModelAccess, limit: dict) -> None:
    """The Generate tab: images, the acceptance map and the stats of one sampler, optionally beside vanilla AR;
    the class picker or, for a text-to-image model, a prompt box with the model's example prompts."""
    def run(*args):
        values = dict(zip(GENERATE_INPUTS, args))
        try:
            with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as folder:
                yield generate(**values, folder=folder, access=access)  # the folder goes once Gradio has its copy
        except (ValueError, CheckpointError, OSError) as e:  # InputError is a ValueError
            raise refusal(gr, e) from None

    # Gradio names an API's parameters after the function's: /generate's are the page's field names
    run.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                           for name in GENERATE_INPUTS])

    with gr.Tab("Generate"):
        with gr.Row():
            with gr.Column():
                # custom values reach ModelAccess.check, which answers without echoing a long one
                model = gr.Dropdown(models, value=default_model, allow_custom_value=True,
                                    label=model_label(access, "model"))
                sampler = gr.Dropdown(available_samplers(), value="sjd", allow_custom_value=True, label="sampler")
                shown = model_controls(default_model, access)
                class_id = class_box(gr, "class name or id", next(iter(shown.class_names), "0"), shown.class_help(),
                                     visible=not shown.text_to_image)
                prompt = gr.Textbox(value=next(iter(shown.example_prompts), ""), label="prompt",
                                    visible=shown.text_to_image, placeholder="describe the image",
                                    info=f"what to draw, in a sentence (at most {MAX_TEXT} characters; Enter "
                                         f"generates)")
                example_prompts = gr.Dropdown(list(shown.example_prompts), value=None, label="example prompts",
                                              info="pick one to put it in the prompt box",
                                              visible=bool(shown.example_prompts))
                vocabulary = gr.Markdown(shown.vocabulary_markdown(), visible=bool(shown.vocabulary))
                num_images = number_box(gr, "num_images", "number of images", 4)
                seed = number_box(gr, "seed", "seed", 0)
                clip_frames = number_box(gr, "clip_frames", "frames a clip (video models)", 0,
                                         visible=shown.video)
                sampling = [option_box(gr, o, shown.settings[o.name]) for o in SAMPLING_FIELDS]
                compare = gr.Checkbox(value=False, label="compare with vanilla AR on the same seed")
                with gr.Accordion("sampler parameters (a list left empty: the preset's choice)", open=False):
                    fields = [option_box(gr, o) for o in SAMPLER_FIELDS]
                with gr.Accordion("LlamaGen checkpoints (server paths; nothing is downloaded)", open=False,
                                  visible=access.local_paths):
                    gpt_ckpt = gr.Textbox(value="", label="GPT checkpoint (.pt)")
                    vq_ckpt = gr.Textbox(value="", label="VQ checkpoint (.pt)")
                    gpt_model = gr.Dropdown(list(GPT_SIZES), value="GPT-B", allow_custom_value=True,
                                            label="GPT size")
                    image_size = gr.Dropdown(list(LLAMAGEN_IMAGE_SIZES), value=256, allow_custom_value=True,
                                             label="image size")
                button = gr.Button("Generate", variant="primary")
            with gr.Column():
                images = gr.Image(type="pil", label="images", format="png", height=192)
                amap = gr.Image(type="pil", label="acceptance map (pass that produced each token)", format="png")
                stats = gr.Markdown()
                ar_images = gr.Image(type="pil", label="vanilla AR, same seed", format="png")
                clip = gr.Video(label="clips (video models)")
        presets = [("ar", 4, 0), ("mcsjd", 4, 1), ("lantern", 8, 2)]
        if shown.example_prompts:
            gr.Examples([[default_model, name, text, count, seed_value] for (name, count, seed_value), text in
                         zip(presets, shown.example_prompts)], [model, sampler, prompt, num_images, seed])
        elif not shown.text_to_image:
            gr.Examples([[default_model, name, class_value, count, seed_value] for (name, count, seed_value),
                         class_value in zip(presets, shown.class_names[::3] or ("0", "1", "2"))],
                        [model, sampler, class_id, num_images, seed])
    inputs = [model, sampler, class_id, prompt, num_images, seed, clip_frames, compare, gpt_ckpt, vq_ckpt, gpt_model,
              image_size, *sampling, *fields]
    gr.on([button.click, prompt.submit], run, inputs, [images, amap, stats, ar_images, clip], api_name="generate",
          **limit)

    def model_changed(name: str, current: str, text: str):
        controls = model_controls(name, access)
        choices = controls.samplers
        example = {} if text else {"value": next(iter(controls.example_prompts), "")}  # a prompt is never echoed
        return (gr.update(choices=choices, value=current if current in choices else choices[0]),
                gr.update(visible=not controls.text_to_image, info=controls.class_help()),
                gr.update(visible=controls.text_to_image, **example),
                gr.update(visible=bool(controls.example_prompts), choices=list(controls.example_prompts),
                          value=None),
                gr.update(visible=bool(controls.vocabulary), value=controls.vocabulary_markdown()),
                gr.update(visible=controls.video),
                *(gr.update(value=controls.settings[o.name]) for o in SAMPLING_FIELDS))

    model.change(model_changed, [model, sampler, prompt],
                 [sampler, class_id, prompt, example_prompts, vocabulary, clip_frames, *sampling], api_name=False,
                 **limit)
    example_prompts.input(None, example_prompts, prompt, js="(text) => text")  # in the browser: no handler


def stream_target(model: str, access: ModelAccess, value: Any) -> int | str:
    """What the switch box's ``value`` asks a stream of ``model`` for: a prompt for a text model (a number is
    refused: it would be a class id), the class id of a class name or id for a class model (a ValueError lists its
    names)."""
    pipe = get_pipeline(model, access=access)
    if not isinstance(pipe, StreamPipeline):
        raise InputError(f"{pipe.info.name} is not a streaming video model: use the Generate tab")
    if not pipe.is_text:
        return pipe.class_id(page_class(value))
    if isinstance(value, (int, float)) or isinstance(class_label(text_field("switch", value)), int):
        raise InputError(f"{pipe.info.name} streams prompts: switch to a prompt, not a class id")
    return page_prompt(pipe, value)


def add_stream_tab(gr, default_model: str, models: list[str], access: ModelAccess, sessions: StreamSessions,
                   limit: dict) -> None:
    """The Streaming tab: frames play as blocks complete; Stop and the switch (a class or a prompt, as the model
    takes) reach the session's newest stream. The stream runs in a worker thread, so that Stop, a cancelled event
    or a closed tab end it at its next denoising step."""
    def frames_of(control: StreamControl, *args) -> Iterator:
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as folder:  # goes once Gradio has the last file
            yield from stream_video(*args, folder=folder, control=control, access=access)

    async def run(model, class_id, num_frames, seed, steps, cfg_scale, prompt, request: gr.Request):
        with sessions.running(session_of(request), functools.partial(stream_target, model, access)) as control:
            try:
                frames = frames_of(control, model, class_id, num_frames, seed, steps, cfg_scale, prompt)
                async for item in iterate_in_thread(frames, control.cancel):
                    yield item
            except (ValueError, CheckpointError, OSError) as e:
                raise refusal(gr, e) from None

    shown = stream_controls(default_model, access)
    with gr.Tab("Streaming"), gr.Row():
        with gr.Column():
            model = gr.Dropdown(models, value=default_model, allow_custom_value=True,
                                label=model_label(access, "streaming model"))
            class_id = class_box(gr, "class of the video", "0", "a class name or its id", visible=not shown.text)
            prompt = gr.Textbox(value=next(iter(shown.example_prompts), ""), label="prompt of the video",
                                visible=shown.text, placeholder="describe the video",
                                info=f"what the video shows, in a sentence (at most {MAX_TEXT} characters)")
            example_prompts = gr.Dropdown(list(shown.example_prompts), value=None, label="the model's example prompts",
                                          info="pick one to put it in the prompt box",
                                          visible=bool(shown.example_prompts))
            num_frames = number_box(gr, "num_frames", "frames", 160)
            seed = number_box(gr, "seed", "seed", 0)
            steps = option_box(gr, STREAM_FIELDS["steps"], shown.settings["steps"])
            cfg_scale = option_box(gr, STREAM_FIELDS["cfg_scale"], shown.settings["cfg_scale"])
            start = gr.Button("Stream", variant="primary")
            stop = gr.Button("Stop")
            target = gr.Textbox(value=shown.switch_value(), label="switch to", info=shown.switch_help(),
                                placeholder="a prompt, or a class name or id")
            switch = gr.Button("Switch at the next block")
        with gr.Column():
            frame = gr.Image(type="pil", label="latest frame", format="png", height=256)
            status = gr.Markdown()
            video = gr.Video(label="the stream so far (mp4)")

    def stop_clicked(request: gr.Request) -> str:
        return sessions.stop(session_of(request))

    def switch_clicked(value: Any, request: gr.Request) -> str:
        try:
            return sessions.switch(session_of(request), value)
        except ValueError as e:  # InputError, or a class name the stream's model does not have
            raise refusal(gr, e) from None

    # gradio passes the request to a parameter annotated gr.Request; with postponed annotations the string
    # "gr.Request" cannot be resolved (gr is a local here), so the type is set on the functions themselves
    for fn in (run, stop_clicked, switch_clicked):
        fn.__annotations__["request"] = gr.Request
    start.click(run, [model, class_id, num_frames, seed, steps, cfg_scale, prompt], [frame, status, video],
                api_name="stream", **limit)

    def model_changed(name: str, text: str):
        controls = stream_controls(name, access)
        example = {} if text else {"value": next(iter(controls.example_prompts), "")}  # a prompt is never echoed
        return (gr.update(value=controls.settings["steps"]), gr.update(value=controls.settings["cfg_scale"]),
                gr.update(visible=not controls.text), gr.update(visible=controls.text, **example),
                gr.update(visible=bool(controls.example_prompts), choices=list(controls.example_prompts),
                          value=None),
                gr.update(info=controls.switch_help(), value=controls.switch_value()))

    model.change(model_changed, [model, prompt], [steps, cfg_scale, class_id, prompt, example_prompts, target],
                 api_name=False, **limit)
    example_prompts.input(None, example_prompts, prompt, js="(text) => text")  # in the browser: no handler
    stop.click(stop_clicked, None, status, api_name="stop_stream", concurrency_limit=None)
    switch.click(switch_clicked, target, status, api_name="switch_class", concurrency_limit=None)
