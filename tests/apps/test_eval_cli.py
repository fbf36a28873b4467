"""``vgen eval``'s printed result: one line of text unless ``--json`` asks for the object; ``vgen eval clip`` end to
end on a tiny random CLIP."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vgen.apps.cli import main
from vgen.apps.eval_cli import frechet_line
from vgen.eval.clip import clip_score, load_clip


def test_a_frechet_result_reads_as_one_line() -> None:
    result = {"fid": 12.34567, "kid_mean": 0.0123456, "kid_std": 0.00123, "features": "inception", "n_real": 500,
              "n_fake": 1}
    assert frechet_line(result, "images") == ("FID 12.346, KID 0.01235 ± 0.0012 (inception features; 500 real and "
                                              "1 fake image)")
    from_stats = {**result, "kid_mean": None, "kid_std": None, "n_fake": 64}
    assert frechet_line(from_stats, "images").startswith("FID 12.346, KID n/a (a side is a stats file) (")
    clips = {"fvd": 80.0, "kvd_mean": 1.5, "kvd_std": 0.25, "features": "i3d", "n_real": 8, "n_fake": 8,
             "num_frames": 16}
    assert frechet_line(clips, "videos") == "FVD 80.000, KVD 1.5 ± 0.25 (i3d features; 8 real and 8 fake videos of " \
                                            "16 frames)"


# ---- vgen eval clip -----------------------------------------------------------------------------------------
def clip_inputs(folder: Path, n: int = 3) -> tuple[np.ndarray, list[str]]:
    """``n`` random 40x48 images saved as PNGs in ``folder`` and their prompts (the last over 77 tokens)."""
    images = np.random.default_rng(0).integers(0, 256, (n, 40, 48, 3), dtype=np.uint8)
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i:03d}.png")
    return images, ["a red cat", "blue dog on a mat", "x" * 80][:n]


def test_eval_clip_scores_a_folder_against_a_prompt_file(tiny_clip_dir, tmp_path, capsys) -> None:
    images, prompts = clip_inputs(tmp_path / "images")
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n")
    args = ["eval", "clip", "--images", str(tmp_path / "images"), "--prompts", str(tmp_path / "prompts.txt"),
            "--clip", str(tiny_clip_dir), "--batch-size", "2"]
    assert main(args) == 0
    captured = capsys.readouterr()
    expected = clip_score(images, prompts, load_clip(tiny_clip_dir))
    assert captured.out == f"CLIP score {expected['clip_score']:.4f} over 3 images (tiny; 1 prompt cut to 77 tokens)\n"
    assert "vgen: warning: 1 of 3 prompts have more than 77 tokens" in captured.err
    assert main([*args, "--json", str(tmp_path / "clip.json")]) == 0
    line = capsys.readouterr().out
    result = json.loads(line)
    assert json.loads((tmp_path / "clip.json").read_text()) == result and line.count("\n") == 1
    assert result["clip_score"] == pytest.approx(expected["clip_score"], abs=1e-5)
    assert {key: result[key] for key in ("count", "truncated", "images", "prompts", "weights_sha256")} == {
        "count": 3, "truncated": 1, "images": str(tmp_path / "images"), "prompts": str(tmp_path / "prompts.txt"),
        "weights_sha256": expected["weights_sha256"]}
    assert len(result["warnings"]) == 1


def test_eval_clip_reads_the_prompts_of_a_sample_many_npz(tiny_clip_dir, tmp_path, capsys) -> None:
    images, prompts = clip_inputs(tmp_path / "images")
    np.savez(tmp_path / "samples.npz", images, np.arange(3), prompts=np.array(prompts))
    assert main(["eval", "clip", "--images", str(tmp_path / "samples.npz"), "--clip", str(tiny_clip_dir),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prompts"] == f"{tmp_path / 'samples.npz'}:prompts" and result["count"] == 3
    assert result["clip_score"] == pytest.approx(clip_score(images, prompts, load_clip(tiny_clip_dir))["clip_score"],
                                                 abs=1e-5)


def test_eval_clip_bad_input_is_one_line_naming_the_file(tiny_clip_dir, tiny_t5_dir, tmp_path, capsys) -> None:
    images, prompts = clip_inputs(tmp_path / "images", 2)
    np.savez(tmp_path / "no_prompts.npz", images)
    np.savez(tmp_path / "blank.npz", images, prompts=np.array(["a red cat", " "]))
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    folder, npz = tmp_path / "images", tmp_path / "no_prompts.npz"
    cases = {
        (folder, tmp_path / "three.txt", tiny_clip_dir):
            f"2 images in {folder} but 3 prompts in {tmp_path / 'three.txt'}: the CLIP score needs one prompt",
        (npz, None, tiny_clip_dir): f"give --prompts: {npz} is not an .npz holding a 'prompts' array",
        (tmp_path / "blank.npz", None, tiny_clip_dir): f"prompt 1 in {tmp_path / 'blank.npz'}:prompts is empty",
        (npz, tmp_path / "three.txt", tmp_path / "none"): f"no CLIP folder at {tmp_path / 'none'}",
        (npz, tmp_path / "three.txt", tiny_t5_dir): f"{tiny_t5_dir} holds a 't5' model, not CLIP",
        (npz, tmp_path / "three.txt", tmp_path): f"{tmp_path} is not a CLIP model folder (no config.json)",
    }
    for (images_path, prompts_path, clip), message in cases.items():
        args = ["eval", "clip", "--images", str(images_path), "--clip", str(clip)]
        args += ["--prompts", str(prompts_path)] if prompts_path else []
        assert main(args) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith(f"vgen: error: {message}")
        assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


@pytest.mark.parametrize("flag", ["--images", "--videos"])
def test_eval_stats_refuses_an_empty_path_in_one_line(flag, tmp_path, capsys) -> None:
    assert main(["eval", "stats", flag, "", "--out", str(tmp_path / "stats.npz")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"vgen: error: {flag} needs a path: a folder, .npz or .npy\n"
    assert not (tmp_path / "stats.npz").exists()
