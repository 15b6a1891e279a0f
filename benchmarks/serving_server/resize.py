"""The image door's per-image work, Pillow's resize against the C one (serve/resample.c).

    python benchmarks/serving_server/resize.py [--repeats 30] [--output resize.json]

The 16 photo-like 640x480 JPEGs of ``prepost.py``, each decoded, centre-cropped to
224x224 (shorter side 256) and normalized into the model's float planes by the server's
own ``ImageDecoder``, on one thread, the two resizes alternating image by image; and the
resize alone (the decoded image's crop box to the normalized planes). Medians in ms; the
tensors of both ways are compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "src"))

from prepost import photo_like  # noqa: E402  (beside this script)

from turboinfer.serve.images import ImageDecoder  # noqa: E402
from turboinfer.serve.prepost_config import ImagePreprocess  # noqa: E402
from turboinfer.serve.resample import DISABLE_ENV, resampler  # noqa: E402


def decoder(native: bool, pool: ThreadPoolExecutor) -> ImageDecoder:
    if native:
        os.environ.pop(DISABLE_ENV, None)
    else:
        os.environ[DISABLE_ENV] = "0"
    made = ImageDecoder(ImagePreprocess(kind="image"), np.dtype(np.float32), pool)
    os.environ.pop(DISABLE_ENV, None)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--output", default="resize.json")
    args = parser.parse_args()
    if resampler() is None:
        raise SystemExit("no native resize here (no C compiler?)")
    from PIL import Image

    from turboinfer.hardware import profile
    from turboinfer.native_build import cpu_flags

    files = [photo_like(640, 480, seed) for seed in range(16)]
    with ThreadPoolExecutor(1) as pool:
        doors = {"pillow": decoder(False, pool), "native": decoder(True, pool)}
        outs = {name: np.empty((3, 224, 224), np.float32) for name in doors}
        times: dict[str, list[float]] = {name: [] for name in doors}
        same = True
        for _ in range(args.repeats):
            for raw in files:
                for name, door in doors.items():
                    start = time.perf_counter()
                    door.fill("image", raw, outs[name])
                    times[name].append(1e3 * (time.perf_counter() - start))
                same &= bool(np.array_equal(outs["pillow"].view(np.uint32),
                                            outs["native"].view(np.uint32)))
    # The resize alone, from the decoded photo.
    rgb = np.asarray(Image.open(__import__("io").BytesIO(files[0])).convert("RGB"))
    side = 224 / (256 / 480)
    box = ((640 - side) / 2, (480 - side) / 2, (640 + side) / 2, (480 + side) / 2)
    scale = np.full(3, 1 / (255 * 0.226), np.float32)
    bias = np.full(3, -2.0, np.float32)
    image = Image.fromarray(rgb)
    alone: dict[str, list[float]] = {"pillow": [], "native": []}
    found = resampler()
    assert found is not None
    for _ in range(args.repeats * 16):
        start = time.perf_counter()
        pixels = np.asarray(image.resize((224, 224), Image.Resampling.BILINEAR, box=box))
        planes = np.multiply(pixels.transpose(2, 0, 1), scale.reshape(3, 1, 1))
        np.add(planes, bias.reshape(3, 1, 1), out=planes)
        alone["pillow"].append(1e3 * (time.perf_counter() - start))
        start = time.perf_counter()
        found.planes(rgb, box, scale, bias, outs["native"])
        alone["native"].append(1e3 * (time.perf_counter() - start))
    cpu = profile(engines=False, gpus=False).cpu
    result = {"cpu": cpu.model_name, "isa": sorted(cpu.features),
              # the four-pixel groups of resample.c need it
              "avx512_vbmi": "avx512vbmi" in cpu_flags().split(),
              "load_average_1m": os.getloadavg()[0], "images": len(files),
              "repeats": args.repeats, "same_tensors": same,
              "door_ms": {k: statistics.median(v) for k, v in times.items()},
              "resize_ms": {k: statistics.median(v) for k, v in alone.items()}}
    result["door_speedup"] = result["door_ms"]["pillow"] / result["door_ms"]["native"]
    result["resize_speedup"] = result["resize_ms"]["pillow"] / result["resize_ms"]["native"]
    (HERE / args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
