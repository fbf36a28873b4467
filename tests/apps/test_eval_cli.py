"""``vgen eval``'s printed result: one line of text unless ``--json`` asks for the object."""

from __future__ import annotations

from vgen.apps.eval_cli import frechet_line


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
