# Copyright (c) MONAI Consortium
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Where the time of loading a CT ``.nii.gz`` goes, stage by stage (issue 15: load <= 0.35 s at 512x512x480).

For each CT (an int16 phantom written by ``write_phantom``, or ``--input`` files) this times

* ``read``: the compressed bytes into a preallocated buffer (page cache warm: no disk);
* ``inflate``: the whole file into a preallocated, pre-faulted buffer by the streaming reader (``Gunzip``,
  one isal thread, or zlib when isal is missing) and by rapidgzip (``ParallelGunzip``) at 1, 2, 4, 8, 16
  threads (at most the usable cores);
* ``load_image``: as the pipeline calls it on the CPU (float32, C order) and as it calls it for a GPU, on the
  CPU here (stored int16, file order), with each reader (``VISTA3D_GZIP_READER`` auto, stream, rapidgzip);
* with ``--device cuda``: ``load_image`` onto the GPU with the pipeline's options
  (``monai.apps.vista3d.core.pipeline.load_options``: stored type, file order; slabs copied while the file inflates), each
  reader, synchronised.

Each number is the minimum (and median) of ``--repeat`` runs, the variants alternating within a round. Example::

    python tests/benchmarks/nifti_load_stages.py --repeat 5 --device cuda --json stages.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d.io import gzip_codec as gz  # noqa: E402
from monai.apps.vista3d.io.nifti import load_image  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nifti_io import environment, timed  # noqa: E402

from monai.apps.vista3d.cli.phantom import write_phantom  # noqa: E402

DEFAULT_CASES = "512x512x480@0.9x0.9x1.0"
THREADS = (1, 2, 4, 8, 16)


def reader(name: str):
    """Force ``VISTA3D_GZIP_READER`` for the block."""
    return environment("VISTA3D_GZIP_READER", name)


def inflate_into(make: Callable[[], Any], buf: np.ndarray) -> int:
    """Inflate a whole file with the reader ``make()`` into ``buf``; the byte count."""
    r = make()
    try:
        n = r.readinto(buf)
        if r.readinto(np.empty(1, dtype=np.uint8)):
            raise AssertionError("the buffer is smaller than the inflated file")
    finally:
        r.close()
    return n


def stages(path: Path, repeat: int, device: str | None, cores: int) -> dict[str, list[float]]:
    """The timings of one file, by stage name."""
    size = path.stat().st_size
    raw = np.empty(size, dtype=np.uint8)
    raw[:] = 0
    with open(path, "rb") as f:
        plain = f.readinto(memoryview(raw))
    r = gz.Gunzip(path)
    try:
        inflated = r.skip()
    finally:
        r.close()
    out = np.zeros(inflated, dtype=np.uint8)
    out[:] = 0  # pre-faulted: page faults are a cost of load_image's own buffer, not of inflating

    def read_bytes():
        with open(path, "rb") as f:
            assert f.readinto(memoryview(raw)) == plain

    fns: dict[str, Callable[[], Any]] = {"read compressed bytes": read_bytes}
    fns["inflate Gunzip (1 thread, %s)" % gz.gzip_codec().__name__] = lambda: inflate_into(lambda: gz.Gunzip(path), out)
    if gz._import_rapidgzip() is not None:
        for t in sorted({min(t, cores) for t in THREADS}):
            fns[f"inflate rapidgzip {t} thread(s)"] = lambda t=t: inflate_into(lambda: gz.ParallelGunzip(path, t), out)
    readers = ["auto", "stream"] + (["rapidgzip"] if gz._import_rapidgzip() is not None else [])
    for r in readers:
        fns[f"load_image cpu float32 C order, reader {r}"] = lambda r=r: _load(path, r, {})
        fns[f"load_image cpu int16 file order, reader {r}"] = lambda r=r: _load(
            path, r, {"dtype": None, "contiguous": False}
        )
        if device:
            fns[f"load_image {device} int16 file order (pipeline), reader {r}"] = lambda r=r: _load(
                path, r, {"dtype": None, "contiguous": False, "device": device}
            )
    if device:
        _load(path, "stream", {"dtype": None, "contiguous": False, "device": device})  # device start-up
    return timed(fns, repeat)


def _load(path: Path, name: str, kwargs: dict) -> None:
    with reader(name):
        image, _ = load_image(path, **kwargs)
    if image.device.type == "cuda":
        torch.cuda.synchronize(image.device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"phantom CTs XxYxZ@SXxSYxSZ,... ({DEFAULT_CASES})")
    parser.add_argument("--input", action="append", default=[], help="a .nii.gz to time instead (repeatable)")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per measurement")
    parser.add_argument("--device", default=None, help="also time load_image onto this device (e.g. cuda)")
    parser.add_argument("--workdir", default=None, help="where the phantoms go (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    cores = gz.available_cores()
    print(
        f"cores {cores}, torch threads {torch.get_num_threads()}, codec {gz.gzip_codec().__name__}, rapidgzip "
        f"{'yes' if gz._import_rapidgzip() is not None else 'no'} (auto: >= {gz.RAPIDGZIP_MIN_CORES} cores, "
        f">= {gz.RAPIDGZIP_MIN_BYTES >> 20} MiB), load average {os.getloadavg()[0]:.2f}; page cache warm"
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        files = [Path(p) for p in args.input]
        if not files:
            for item in filter(None, (t.strip() for t in args.cases.split(","))):
                shape, spacing = item.split("@")
                shape = tuple(int(v) for v in shape.split("x"))
                files.append(
                    write_phantom(
                        Path(tmp) / f"ct_{'x'.join(map(str, shape))}.nii.gz",
                        shape,
                        tuple(float(v) for v in spacing.split("x")),
                        seed=0,
                    )
                )
        for path in files:
            print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB gzip")
            for stage, times in stages(path, args.repeat, args.device, cores).items():
                best, med = min(times), statistics.median(times)
                rows.append(
                    {
                        "file": path.name,
                        "stage": stage,
                        "min_s": round(best, 4),
                        "median_s": round(med, 4),
                        "times_s": [round(t, 4) for t in times],
                    }
                )
                print(f"  {stage:<58} min {best:7.3f} s   median {med:7.3f} s", flush=True)
    if args.json:
        meta = {
            "cores": cores,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "codec": gz.gzip_codec().__name__,
            "rapidgzip": gz._import_rapidgzip() is not None,
            "device": args.device,
            "repeat": args.repeat,
            "load_average_end": os.getloadavg(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "command": "python tests/benchmarks/nifti_load_stages.py "
            + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
