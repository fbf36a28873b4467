"""``vgen models``: every embedded model (or each pipeline folder named) with its kind, its class names and the
settings it samples with unless told otherwise, read from its configs without loading weights."""

from __future__ import annotations

import pytest

from vgen.apps.cli import main
from vgen.data.shapes import CLASS_NAMES
from vgen.pipelines import ImagePipeline, PipelineInfo, available_models, load


@pytest.fixture
def listed(capsys, monkeypatch):
    """``vgen models ARGS`` -> (exit code, {model name: its lines as one text}, stderr), with every weights read
    made to fail."""
    def fail(*args, **kwargs):
        raise AssertionError("vgen models read a weights file")

    def run(*args: str):
        with monkeypatch.context() as patched:
            patched.setattr("vgen.hub.load_file", fail)
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
    assert code == 0 and list(entries) == available_models()
    classes = f"classes: {', '.join(CLASS_NAMES)}"
    assert all(classes in text for name, text in entries.items() if name != "shapes-t2i")
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


def test_an_unknown_model_gets_one_line(listed) -> None:
    code, entries, err = listed("nope")
    assert code == 2 and entries == {} and err.startswith("vgen: error: unknown model 'nope'")
    assert err.count("\n") == 1
