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
"""Experiment: the two host-side costs of a file-to-file run beside the windows (issue 50, item 5).

1. Saving a label map that lies on the GPU (512x512x200, uint8 output): ``serial`` copies the whole file-order
   map to pageable host memory, then compresses it on every core (the saver before 1af1d56); ``slabs`` hands
   :func:`save_label_map` a :class:`DeviceLabelMap`, whose slabs cross on the compressing threads. (Slabs into
   pinned memory were tried at 29567dc: no faster warm, 0.042 s against 0.039, and dropped.)
2. Inflating the CT with rapidgzip at chunk sizes of 1-8 MiB (its default 4 MiB gives a 46 MB file only a dozen
   chunks for 16 cores), and the whole ``load_image`` to the GPU as the loader runs it (slabs through pinned
   memory) and as it ran before (a whole-volume pageable buffer, each slab copied from there).
3. The copies alone: the CT's voxels to the GPU and the label map back, fresh pageable, reused pageable and pinned
   host memory.

Rounds alternate between the forms; the first round (the process's first use of each) is printed apart from
the minimum and median of the ``--repeats`` after it.

    python tests/benchmarks/experiments/label_map_transfer.py --repeats 7

``--device cpu`` runs the same steps on the host (a check of the script, not a measurement of the copies).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.io import nifti_read
from monai.apps.vista3d.io.gzip_codec import available_cores, rapidgzip_chunk_bytes
from monai.apps.vista3d.io.label_transfer import to_device_file_order
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.nifti_write import save_label_map


def _show(name: str, times: list[float]) -> None:
    """The first round (the process's first use: fresh pinned memory, cold caches), then the others."""
    first, rest = times[0], times[1:]
    print(f"  {name:<34} first {first:.4f} s  min {min(rest):.4f} s  median {statistics.median(rest):.4f} s")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def save_forms(ct: Path, out: Path, repeats: int, device: torch.device) -> None:
    _, geom = load_image(ct)
    g = torch.Generator(device=device).manual_seed(0)
    labels = torch.randint(0, 3, tuple(geom.spatial_shape), generator=g, device=device, dtype=torch.int16)
    labels[100:300, 100:300] += 5  # a body of labels in a background, as a segmentation has

    def serial() -> None:
        host = to_device_file_order(labels, np.dtype("uint8")).data.cpu().numpy().T
        save_label_map(host, geom, out / "serial.nii.gz", "uint8")

    def slabs() -> None:
        save_label_map(labels, geom, out / "slabs.nii.gz", "uint8")

    forms = {"slabs (the saver)": slabs, "serial": serial}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeats + 1):
        for name, fn in forms.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    shape = tuple(geom.spatial_shape)
    print(f"save a {shape} label map on {device} as uint8, {available_cores()} compressing threads:")
    for name, ts in times.items():
        _show(name, ts)
    same = (out / "serial.nii.gz").read_bytes() == (out / "slabs.nii.gz").read_bytes()
    print(f"  files identical: {same}")


def inflate_forms(ct: Path, repeats: int, device: torch.device) -> None:
    import rapidgzip

    threads = available_cores()
    sizes = (1, 2, 4, 8)
    times: dict[str, list[float]] = {f"rapidgzip {mib} MiB chunks": [] for mib in sizes}
    loads = {f"load_image to {device}": contextlib.nullcontext,
             "load_image, whole-volume buffer": lambda: mock.patch.object(nifti_read, "_staged", lambda d, t: False)}
    times.update({name: [] for name in loads})
    buf = bytearray(1 << 24)
    for _ in range(repeats + 1):
        for mib in sizes:
            t0 = time.perf_counter()
            with rapidgzip.RapidgzipFile(str(ct), parallelization=threads, chunk_size=mib << 20) as f:
                while f.readinto(buf):
                    pass
            times[f"rapidgzip {mib} MiB chunks"].append(time.perf_counter() - t0)
        for name, context in loads.items():
            _sync(device)
            t0 = time.perf_counter()
            with context():
                image, _ = load_image(ct, device=device)
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            del image
    print(f"inflate {ct.name} ({ct.stat().st_size / 1e6:.1f} MB), {threads} threads "
          f"(load_image's chunks: {rapidgzip_chunk_bytes(ct.stat().st_size, threads) >> 20} MiB):")
    for name, ts in times.items():
        _show(name, ts)


def copy_forms(shape: tuple[int, ...], repeats: int) -> None:
    """The copies under both costs, alone: the CT's int16 voxels to the GPU and its uint8 label map back, from and to
    fresh pageable memory (what the loader and the saver use), reused pageable memory and pinned memory."""
    n = int(np.prod(shape))
    dev16, dev8 = torch.zeros(n, dtype=torch.int16, device="cuda"), torch.zeros(n, dtype=torch.uint8, device="cuda")
    reused16, reused8 = torch.ones(n, dtype=torch.int16), torch.ones(n, dtype=torch.uint8)
    pinned16, pinned8 = reused16.pin_memory(), reused8.pin_memory()
    forms = {
        "to the GPU, fresh pageable": lambda: dev16.copy_(torch.from_numpy(np.ones(n, np.int16))),
        "to the GPU, reused pageable": lambda: dev16.copy_(reused16),
        "to the GPU, pinned": lambda: dev16.copy_(pinned16),
        "to the host, fresh pageable": lambda: dev8.cpu(),
        "to the host, reused pageable": lambda: reused8.copy_(dev8),
        "to the host, pinned": lambda: pinned8.copy_(dev8),
    }
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeats + 1):
        for name, fn in forms.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    print(f"copies of {n / 1e6:.0f} M voxels (int16 to the GPU, uint8 back; 'fresh' includes filling new host pages):")
    for name, ts in times.items():
        _show(name, ts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--device", default="cuda")
    p.add_argument("--size", default="512,512,200", help="the CT's voxels, X,Y,Z")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shape = tuple(int(v) for v in args.size.split(","))
        ct = write_phantom(work / "ct.nii.gz", shape, (0.78, 0.78, 2.0), seed=0)
        device = torch.device(args.device)
        save_forms(ct, work, args.repeats, device)
        inflate_forms(ct, args.repeats, device)
        if device.type == "cuda":
            copy_forms(shape, args.repeats)


if __name__ == "__main__":
    main()
