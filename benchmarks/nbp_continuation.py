"""Does an NBP video model keep a clip's class once its first frames are given? Continue real clips and classify
the frames the model draws.

For ``--count`` validation clips it tokenises the first ``--given`` frames, lets the model draw the rest
(``VideoPipeline``'s ``context``, guided by the clip's own class) and prints the per-frame domain classifier's figures
on the drawn frames only: clip class accuracy, frame accuracy and identity kept. Beside them, the same figures for
the real frames in the same places, and for clips drawn from the class alone (frame 0 included) with the same
settings. A model whose continuations keep the class but whose own clips do not has learnt the motion and not
yet the first frame.

It also scores the clips teacher-forced (every frame given its real predecessors): top-1 accuracy and loss on the
codes that change from the previous frame and on those that stay. A model that only copies the previous frame
has top-1 near 0 on the changed codes.

    python benchmarks/nbp_continuation.py --gpt vgen/assets/shapes-video-nbp/gpt \
        --vq vgen/assets/shapes-video-nbp/vq --data-dir runs/clips64 --count 64
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from PIL import Image

from vgen.data.clips import cached_clips, recorded_clips_config
from vgen.eval.quality import clip_class_accuracy, frame_change
from vgen.hub import from_pretrained
from vgen.pipelines import PipelineInfo, VideoPipeline
from vgen.training.ar import tokenize_split


def figures(videos: np.ndarray, classes: list[int]) -> dict:
    out = clip_class_accuracy(videos, classes)
    return {k: round(out[k], 4) for k in ("class_accuracy", "frame_accuracy", "identity_kept")}


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, codes: torch.Tensor, class_ids: torch.Tensor, batch_size: int) -> dict:
    """Top-1 accuracy and mean loss (nats) of frames 1 .. T-1 given real predecessors, on the codes [N, T*h*w]
    that differ from the same position one frame earlier and on those that do not."""
    logits = torch.cat([model(class_ids[i:i + batch_size], codes[i:i + batch_size]).float()
                        for i in range(0, len(codes), batch_size)])
    t = model.grid[0]
    x = codes.reshape(len(codes), t, -1)
    logp = logits.log_softmax(-1).reshape(*x.shape, -1)[:, 1:].gather(-1, x[:, 1:, :, None])[..., 0]
    hit = logits.argmax(-1).reshape(x.shape)[:, 1:] == x[:, 1:]
    changed = x[:, 1:] != x[:, :-1]
    return {"share_changed": round(float(changed.float().mean()), 4),
            "top1_changed": round(float(hit[changed].float().mean()), 4),
            "top1_kept": round(float(hit[~changed].float().mean()), 4),
            "loss_changed": round(float(-logp[changed].mean()), 3),
            "loss_kept": round(float(-logp[~changed].mean()), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpt", required=True, help="NBP model folder (a training export or a pipeline's gpt/)")
    p.add_argument("--vq", required=True, help="its per-frame VQ tokenizer folder")
    p.add_argument("--data-dir", required=True, help="moving-shapes clips folder (vgen.data.clips)")
    p.add_argument("--count", type=int, default=64, help="validation clips (classes in turn)")
    p.add_argument("--given", type=int, default=1, help="leading frames given to the model")
    p.add_argument("--cfg-scale", type=float, default=3.0)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (each token its argmax)")
    p.add_argument("--top-k", type=int, default=0, help="0: no top-k filter")
    p.add_argument("--top-p", type=float, default=1.0, help="NBP samples its UCF clips with 0.9")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--picture", default=None, help="PNG: the first 4 clips, each real (top) over its continuation")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = from_pretrained(args.gpt).eval(), from_pretrained(args.vq).eval()
    frames = model.grid[0]
    if not 0 < args.given < frames:
        raise SystemExit(f"--given must be between 1 and {frames - 1} frames, got {args.given}")
    clips, labels = cached_clips(args.data_dir, "val", args.count, recorded_clips_config(args.data_dir))
    clips, classes = np.asarray(clips), [int(c) for c in np.asarray(labels)]
    pipe = VideoPipeline(model, tokenizer, PipelineInfo(name="continuation", image_size=clips.shape[2]))
    generator = torch.Generator().manual_seed(args.seed)
    settings = {"cfg_scale": args.cfg_scale, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p}
    videos = np.concatenate([pipe(classes[i:i + args.batch_size], generator=generator, **settings,
                                  context=clips[i:i + args.batch_size, :args.given], batch_size=args.batch_size).videos
                             for i in range(0, len(clips), args.batch_size)])
    continued = videos[:, args.given:]
    if args.picture:
        rows = [np.concatenate(list(clip), axis=1) for pair in zip(clips[:4], videos[:4]) for clip in pair]
        Image.fromarray(np.concatenate(rows)).resize((rows[0].shape[1] * 2, len(rows) * rows[0].shape[0] * 2),
                                                     Image.NEAREST).save(args.picture)
    codes = tokenize_split(tokenizer, clips.reshape(-1, *clips.shape[2:]))
    codes = torch.from_numpy(codes.astype(np.int64)).reshape(len(clips), -1)
    free = pipe(classes, seed=args.seed, **settings).videos
    print(json.dumps({"clips": len(classes), "given_frames": args.given, **settings, "frame_change": {
                          "continued": round(float(frame_change(continued).mean()), 2),
                          "real": round(float(frame_change(clips[:, args.given:]).mean()), 2)},
                      "continued": figures(continued, classes),
                      "real_frames_in_the_same_places": figures(clips[:, args.given:], classes),
                      "drawn_from_the_class_alone": figures(free, classes),
                      "teacher_forced": teacher_forced(model, codes, torch.tensor(classes), args.batch_size)},
                     indent=2))


if __name__ == "__main__":
    main()
