"""How much a continuous-token target relies on an exact prefix: its diffusion loss on held-out real images when the
tokens its trunk reads carry Gaussian noise (the tokens its head learns stay clean).

Sampling feeds the trunk the model's own tokens, never exactly the ones it was trained on; a loss that climbs steeply
with a little prefix noise is a model that small sampling errors throw off, which ``vgen train mar --context-noise``
trains against. Each pipeline is measured on the same images (the validation split of the data it learnt from,
rendered from its recorded data settings), the same noise draws and the same diffusion steps.

    python benchmarks/context_noise.py --models shapes-c2i-continuous runs/other-pipeline --out context_noise
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import vgen
from vgen.data.shapes import SPLIT_SEEDS, ShapesConfig, render_batch
from vgen.training.mar import encode_split

DEFAULT_SIGMAS = [0.0, 0.05, 0.1, 0.2, 0.3]


@torch.no_grad()
def prefix_noise_losses(model, tokens: torch.Tensor, class_ids: torch.Tensor, sigmas: list[float],
                        batch_size: int = 64, seed: int = 0) -> list[float]:
    """The mean loss of ``model`` on ``tokens`` [N, L, C] with its prefix perturbed at each fixed noise std."""
    losses = []
    for sigma in sigmas:
        context = tokens + sigma * torch.randn(tokens.shape, generator=torch.Generator().manual_seed(seed))
        total = 0.0
        for i in range(0, len(tokens), batch_size):
            rows = slice(i, i + batch_size)
            loss = model.prefix_loss(class_ids[rows], tokens[rows], context[rows, :-1],
                                     torch.Generator().manual_seed(seed + 1 + i))
            total += float(loss) * len(tokens[rows])
        losses.append(total / len(tokens))
    return losses


def measure(name: str, sigmas: list[float], num_images: int, batch_size: int) -> dict:
    pipe = vgen.load(name)
    if not hasattr(pipe.model, "prefix_loss"):
        raise SystemExit(f"{name} is not a continuous-token model (its tokens are codes, not latents to perturb)")
    if pipe.info.data is None:
        raise SystemExit(f"{name} records no data settings: it was not packaged from a shapes data folder")
    images, labels = render_batch(SPLIT_SEEDS["val"], 0, num_images, ShapesConfig(**pipe.info.data))
    model = pipe.model.float().eval()
    tokens = torch.from_numpy(encode_split(pipe.tokenizer.float(), images, batch_size)).float()  # as training caches
    losses = prefix_noise_losses(model, tokens, torch.as_tensor(labels), sigmas, batch_size)
    return {"model": name, "num_images": num_images, "sigmas": sigmas, "losses": losses}


def table(rows: list[dict]) -> str:
    sigmas = rows[0]["sigmas"]
    lines = ["| model | " + " | ".join(f"prefix noise {s:g}" for s in sigmas) + " |",
             "|---|" + "---|" * len(sigmas)]
    for row in rows:
        base = row["losses"][0]
        cells = [f"{loss:.4f}" + ("" if i == 0 else f" ({loss / base:.1f}x)") for i, loss in enumerate(row["losses"])]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["shapes-c2i-continuous"])
    parser.add_argument("--sigmas", nargs="+", type=float, default=DEFAULT_SIGMAS)
    parser.add_argument("--num-images", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = [measure(name, args.sigmas, args.num_images, args.batch_size) for name in args.models]
    text = table(rows)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "context_noise.json").write_text(json.dumps(rows, indent=1))
        (args.out / "context_noise.md").write_text(text)


if __name__ == "__main__":
    main()
