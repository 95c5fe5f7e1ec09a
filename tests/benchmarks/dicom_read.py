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
"""Time reading a synthetic 512x512x300 CT series, the statistics of 117 structures and the preview.

    python -m tests.benchmarks.dicom_read [--size 512,512,300] [--repeats 3] [--device cpu] [--other-python PATH]

Readers timed on the same files (best of ``--repeats``, each in this process after one warm-up read of the
files into the page cache): ``load_dicom`` (this fork: pydicom decodes, numpy stacks), pydicom then numpy by hand
(read, sort along the normal, stack, rescale), highdicom's ``get_volume_from_series`` (what ``load_dicom`` used
before) laid out as ``[X, Y, Z]``, and SimpleITK's ImageSeriesReader; with ``--other-python`` (an
interpreter with dicom2nifti installed) dicom2nifti's ``dicom_series_to_nifti`` in that interpreter, timed there,
on a copy of the series whose InstanceNumbers follow the slice positions (its generic converter stacks slices by
InstanceNumber, and takes the shuffled numbers of the test series for several stacks). Then the statistics of a
label map of 117 structures on ``--device``, and the preview: in this process (its first call, and warm), and its
first call in a fresh interpreter (Pillow's import and font included; highdicom has imported Pillow here already).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from monai.apps.vista3d.core.statistics import structure_statistics
from monai.apps.vista3d.io.dicom import load_dicom
from monai.apps.vista3d.io.preview import preview_slices, write_preview
from monai.apps.vista3d.labels import everything_labels
from tests.apps.vista3d.dicom_series import SeriesSpec, write_series

_DICOM2NIFTI = """
import sys, time, tempfile, os
import dicom2nifti, dicom2nifti.settings as s
s.disable_validate_slice_increment()
best = 1e9
for _ in range(int(sys.argv[2])):
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        dicom2nifti.dicom_series_to_nifti(sys.argv[1], os.path.join(d, 'x.nii'), reorient_nifti=False)
        best = min(best, time.perf_counter() - t)
print(best)
"""


_FRESH_PREVIEW = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np, torch
from monai.apps.vista3d.io.preview import preview_slices, write_preview
from tests.benchmarks.dicom_read import _labels
shape = tuple(int(v) for v in sys.argv[1].split(","))
image = torch.randint(-1000, 1500, shape, dtype=torch.int16).float()
labels = _labels(shape, torch.device("cpu"))
t1 = time.perf_counter()
write_preview(preview_slices(image, labels, np.diag([0.7, 0.7, 1.0, 1.0])), sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"imports_and_volume_s": round(t1 - t0, 3), "first_preview_s": round(t2 - t1, 3)}))
"""


def _numbered_copy(folder: Path, dest: Path) -> Path:
    """A copy of the series with InstanceNumber 1, 2, ... along the slice normal (what dicom2nifti stacks by)."""
    import pydicom

    dest.mkdir()
    datasets = [(f, pydicom.dcmread(f)) for f in folder.iterdir()]
    o = np.asarray(datasets[0][1].ImageOrientationPatient, dtype=float)
    normal = np.cross(o[:3], o[3:])
    datasets.sort(key=lambda fd: float(np.asarray(fd[1].ImagePositionPatient, dtype=float) @ normal))
    for number, (f, ds) in enumerate(datasets, start=1):
        ds.InstanceNumber = number
        ds.save_as(dest / f.name, enforce_file_format=True)
    return dest


def _run_child(cmd: list[str]) -> str:
    """The last line a child interpreter prints; its last error line when it fails."""
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip().splitlines()[-1]


def _by_hand(folder: Path) -> np.ndarray:
    import pydicom

    datasets = [pydicom.dcmread(f) for f in folder.iterdir()]
    o = np.asarray(datasets[0].ImageOrientationPatient, dtype=float)
    normal = np.cross(o[:3], o[3:])
    datasets.sort(key=lambda d: float(np.asarray(d.ImagePositionPatient, dtype=float) @ normal))
    out = np.empty((int(datasets[0].Columns), int(datasets[0].Rows), len(datasets)), dtype=np.float32)
    for k, d in enumerate(datasets):
        out[:, :, k] = d.pixel_array.T * float(d.RescaleSlope) + float(d.RescaleIntercept)
    return out


def _highdicom(folder: Path) -> np.ndarray:
    """What load_dicom did before it stacked the slices itself: highdicom's volume of the series, in its layout."""
    import highdicom
    import pydicom

    datasets = [pydicom.dcmread(f) for f in folder.iterdir()]
    volume = highdicom.get_volume_from_series(datasets, dtype=np.float32, apply_presentation_lut=False, rtol=0.01,
                                              perpendicular_tol=0.01)
    return np.ascontiguousarray(volume.array.transpose(2, 1, 0))


def _sitk(folder: Path) -> np.ndarray:
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder)))
    return sitk.GetArrayFromImage(reader.Execute())


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: the files in the page cache, the imports done
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _labels(shape: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """117 box-shaped structures (the 'everything' ids) tiling the middle of the volume, background around them."""
    ids = everything_labels()
    lab = torch.zeros(shape, dtype=torch.uint8)
    nx, ny, nz = shape
    grid = int(np.ceil(len(ids) ** (1 / 3)))
    bx, by, bz = (int(0.8 * n / grid) for n in shape)
    for n, label_id in enumerate(ids):
        i, j, k = n % grid, (n // grid) % grid, n // (grid * grid)
        x0, y0, z0 = int(0.1 * nx) + i * bx, int(0.1 * ny) + j * by, int(0.1 * nz) + k * bz
        lab[x0:x0 + bx, y0:y0 + by, z0:z0 + bz] = label_id
    return lab.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="512,512,300")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--other-python", default=None, help="an interpreter with dicom2nifti installed")
    ap.add_argument("--skip-readers", action="store_true", help="only the statistics and the preview")
    args = ap.parse_args()
    shape = tuple(int(v) for v in args.size.split(","))
    device = torch.device(args.device)
    results: dict = {"size": list(shape), "device": str(device), "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="vista3d_dicom_bench_") as tmp:
        folder = Path(tmp) / "series"
        spec = SeriesSpec(shape=shape, spacing=(0.7, 0.7, 1.0))
        start = time.perf_counter()
        write_series(spec, folder)
        results["write_series_s"] = round(time.perf_counter() - start, 2)
        if not args.skip_readers:
            results["load_dicom_s"] = round(_best(lambda: load_dicom(folder), args.repeats), 3)
            results["pydicom_numpy_by_hand_s"] = round(_best(lambda: _by_hand(folder), args.repeats), 3)
            results["highdicom_volume_s"] = round(_best(lambda: _highdicom(folder), args.repeats), 3)
            results["simpleitk_s"] = round(_best(lambda: _sitk(folder), args.repeats), 3)
            if args.other_python:
                numbered = _numbered_copy(folder, Path(tmp) / "numbered")
                best = _run_child([args.other_python, "-c", _DICOM2NIFTI, str(numbered), str(args.repeats)])
                results["dicom2nifti_s"] = round(float(best), 3)
        image, geom = load_dicom(folder, device=device)
        labels = _labels(shape, device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def stats():
            out = structure_statistics(image, labels, geom.affine)
            sync()
            return out

        results["statistics_117_s"] = round(_best(stats, args.repeats), 3)
        results["structures"] = len(stats()["structures"])
        centre = [("liver", (shape[0] / 2, shape[1] / 2, shape[2] / 2))]
        start = time.perf_counter()
        write_preview(preview_slices(image, labels, geom.affine, centre), Path(tmp) / "first.png")
        results["preview_first_call_s"] = round(time.perf_counter() - start, 3)  # Pillow's imports and font included
        results["preview_s"] = round(_best(lambda: write_preview(preview_slices(image, labels, geom.affine, centre),
                                                                 Path(tmp) / "preview.png"), args.repeats), 3)
        fresh = _run_child([sys.executable, "-c", _FRESH_PREVIEW, args.size, str(Path(tmp) / "fresh.png")])
        results["preview_fresh_process"] = json.loads(fresh)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
