"""The listing commands. ``vgen models``: every embedded model (or each pipeline folder named) with its kind, its
class names (a text model: its words by attribute, as its model card lists them) and the settings it samples with
unless told otherwise, then the judges, read from their configs without loading weights. ``vgen samplers``: one
line per sampler, from the registry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vgen.apps.cli import main
from vgen.apps.models_cli import JUDGES, vocabulary_lines
from vgen.data.shapes import CLASS_NAMES
from vgen.hub import ASSETS
from vgen.models.word_encoder import SPECIAL_WORDS
from vgen.pipelines import ImagePipeline, PipelineInfo, available_models, load
from vgen.samplers import available_samplers

CARDS = Path(__file__).resolve().parents[2] / "docs" / "models"


@pytest.fixture
def listed(capsys, monkeypatch):
    """``vgen models ARGS`` -> (exit code, {model name: its lines as one text}, stderr), with every weights read
    made to fail."""
    def fail(*args, **kwargs):
        raise AssertionError("vgen models read a weights file")

    def run(*args: str):
        with monkeypatch.context() as patched:
            patched.setattr("vgen.models.checkpoint_io.load_file", fail)
            code = main(["models", *args])
        captured = capsys.readouterr()
        entries, name = {}, None
        for line in captured.out.splitlines():
            if not line.startswith(" "):
                name = line.split(":")[0]
            entries[name] = " ".join(filter(None, [entries.get(name), line.strip()]))
        return code, entries, captured.err
    return run


def test_every_embedded_model_is_listed_with_its_kind_classes_and_defaults(listed) -> None:
    code, entries, _ = listed()
    assert code == 0 and list(entries) == [*available_models(), *JUDGES]
    classes = f"classes: {', '.join(CLASS_NAMES)}"
    text_models = ("shapes-t2i", "shapes-t2v-stream")
    assert all(classes in text for name, text in entries.items() if name not in (*text_models, *JUDGES))
    assert entries["shapes-t2i"].startswith("shapes-t2i: text-to-image images (64 px), next-token AR, 16x16 tokens")
    assert 'prompts, e.g. "a large blue ring on a yellow background"' in entries["shapes-t2i"]
    assert "classes" not in entries["shapes-t2i"]
    assert entries["shapes-c2i"].startswith("shapes-c2i: class-conditional images (64 px), next-token AR, 16x16 "
                                            "tokens, with a draft head")
    assert "defaults: sampler ar, temperature 1.0, top_k 0, top_p 1.0, cfg_scale 4.0, cfg_interval -1" in \
        entries["shapes-c2i"]
    assert "continuous-token AR (diffusion head)" in entries["shapes-c2i-continuous"]
    assert "with a draft model" in entries["shapes-c2i-continuous"]
    assert "next-neighbour AR (NAR)" in entries["shapes-nar"] and "sampler nar," in entries["shapes-nar"]
    assert entries["shapes-video-nbp"].startswith("shapes-video-nbp: class-conditional video (8 frames of 64 px), "
                                                  "next-block AR (NBP), 8x16x16 tokens")
    assert entries["shapes-video-ar"].startswith("shapes-video-ar: class-conditional video (8 frames of 64 px), "
                                                 "next-token AR, 8x16x16 tokens")
    assert "temperature 0.9" in entries["shapes-video-nar"]
    assert "streaming video for `vgen stream`" in entries["shapes-blockdiff"]
    assert "defaults: steps 3, first_steps 8" in entries["shapes-blockdiff"]
    assert "cfg_scale 5.0" in entries["shapes-blockdiff-cfg"]
    assert entries["shapes-t2v-stream"].startswith("shapes-t2v-stream: prompt-conditioned streaming video")
    assert "prompts, e.g." in entries["shapes-t2v-stream"] and "classes" not in entries["shapes-t2v-stream"]
    assert "cfg_scale 5.0" in entries["shapes-t2v-stream"]


def test_a_folder_is_described_by_what_it_records(listed, tiny_pipeline_dir, tmp_path) -> None:
    pipe = load(tiny_pipeline_dir)
    unnamed = ImagePipeline(pipe.model, pipe.tokenizer, PipelineInfo(name="unnamed", image_size=16))
    unnamed.save_pretrained(tmp_path / "unnamed")
    code, entries, _ = listed(str(tiny_pipeline_dir), str(tmp_path / "unnamed"))
    assert code == 0 and list(entries) == ["tiny", "unnamed"]
    assert entries["tiny"] == ("tiny: class-conditional images (16 px), next-token AR, 4x4 tokens classes: a, b, c "
                               "defaults: sampler ar, temperature 1.0, top_k 0, top_p 1.0, cfg_scale 2.0, "
                               "cfg_interval -1")
    assert "classes: ids 0..2 (no names recorded)" in entries["unnamed"]


def test_a_text_streaming_folder_is_described_by_its_prompts(listed, tiny_text_stream_pipeline_dir) -> None:
    code, entries, _ = listed(str(tiny_text_stream_pipeline_dir))
    text = entries["tiny-text-stream"]
    assert code == 0 and text.startswith("tiny-text-stream: prompt-conditioned streaming video for `vgen stream` "
                                         "(16 px), block diffusion, 2-frame blocks")
    assert 'prompts, e.g. "' in text and "classes" not in text and "switch recache" in text

def test_an_unknown_model_gets_one_line(listed) -> None:
    code, entries, err = listed("nope")
    assert code == 2 and entries == {} and err.startswith("vgen: error: unknown model 'nope'")
    assert err.count("\n") == 1


def test_the_judges_are_listed_as_judges_with_what_they_read(listed) -> None:
    code, entries, _ = listed(*JUDGES)
    assert code == 0 and list(entries) == ["shapes-classifier", "shapes-scene-judge", "shapes-video-classifier"]
    assert all(text.startswith(f"{name}: judge (draws nothing)") and "used for: " in text
               for name, text in entries.items())
    assert f"64-px images into 8 classes ({', '.join(CLASS_NAMES)})" in entries["shapes-classifier"]
    assert "shape (8 values), colour (8 values), size (2 values), position (9 values), background (19 values)" in \
        entries["shapes-scene-judge"]
    assert "clips of 16 frames of 32 px" in entries["shapes-video-classifier"]


def test_the_text_model_lists_every_word_of_its_config_by_attribute(listed) -> None:
    config = json.loads((ASSETS / "shapes-t2i" / "text_encoder" / "config.json").read_text())["config"]
    words = [w for w in config["vocabulary"] if w not in SPECIAL_WORDS]
    code, entries, _ = listed("shapes-t2i")
    text = entries["shapes-t2i"]
    assert code == 0 and f"a single shape, in {len(words)} words: shape: box, circle, crescent" in text
    assert "; colour: blue, cyan," in text and "; size: big, huge, large, little, small, tiny;" in text
    listing = text.partition(" words: ")[2].partition(" defaults:")[0]
    assert set(words) <= set(re.findall(r"[a-z]+", listing))


def test_the_model_card_lists_the_words_vgen_models_lists() -> None:
    config = json.loads((ASSETS / "shapes-t2i" / "text_encoder" / "config.json").read_text())["config"]
    card = (CARDS / "shapes-t2i.md").read_text(encoding="utf-8")
    lines = vocabulary_lines(tuple(config["vocabulary"]))
    assert [line.split(":")[0] for line in lines] == ["shape", "colour", "size", "position", "background",
                                                       "other words"]
    assert all(f"- {line}\n" in card for line in lines)


def test_samplers_get_one_line_each_saying_lossless_the_models_and_what_they_do(capsys) -> None:
    assert main(["samplers"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert list(lines) == available_samplers()
    assert lines["ar"].split()[1:5] == ["plain", "next-token", "AR:", "vanilla"]
    assert lines["mcsjd"].split()[1] == lines["sjd"].split()[1] == lines["cspd"].split()[1] == "lossless"
    assert lines["lantern"].split()[1] == lines["gsd"].split()[1] == "lossy"
    assert "next-neighbour AR (NAR): all cells of a diagonal" in lines["nar"]
    assert "continuous-token AR (diffusion head): " in lines["cspd"]
    assert all(len(line.split(": ", 1)[1]) > 20 for line in lines.values())  # every sampler says what it does
