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
"""Loading a CT and saving its label map: nibabel's defaults against monai.apps.vista3d.io.nifti (issue 15, goal 3).

For each CT (the end-to-end benchmark's phantoms: int16 ``.nii.gz`` written by ``write_phantom``) this times

* load: nibabel's default, ``nibabel.load(p).get_fdata()`` cast to a float32 tensor (MONAI's ``LoadImage``
  path), against ``load_image`` as float32 C-order (the API default), float32 in file order, and the stored
  int16 in file order (what the pipeline sends to a GPU), each with isal (when installed) and with zlib;
* save, for each output dtype: ``nibabel.save`` of the label map cast to that dtype (gzip level 1, nibabel's
  default) against ``save_label_map`` (level 1, one thread per core, and one thread) from the int16 C-order
  label map the pipeline returns; every written file is read back with nibabel and compared with the labels,
  the affine and the header fields; file sizes are reported.

The runs of the implementations being compared alternate, and each number is the minimum of ``--repeat`` runs,
because the development machine is shared. The files are written by the script and read from the page cache
(warm): the load numbers are decompression and conversion, not disk reads. Example::

    python tests/benchmarks/nifti_io.py --repeat 5 --json io.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import nibabel as nib
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d.cli.phantom import make_phantom_labels, write_phantom  # noqa: E402
from monai.apps.vista3d.io import nifti as vio  # noqa: E402
from monai.apps.vista3d.io.gzip_codec import available_cores  # noqa: E402
from monai.apps.vista3d.io.nifti_write import save_label_map  # noqa: E402

DEFAULT_CASES = "512x512x200@0.78x0.78x2.0,512x512x480@0.9x0.9x1.0"
#: header fields that describe the voxel values and so differ between a CT and its label map
VALUE_FIELDS = {"datatype", "bitpix", "scl_slope", "scl_inter", "cal_min", "cal_max", "vox_offset", "glmax", "glmin"}
#: the fields that mark a file as this program's output (``io.mark_output_header``): the intent 'label', 'vista3d'
MARK_FIELDS = {"intent_code", "intent_name", "intent_p1", "intent_p2", "intent_p3"}


def parse_cases(text: str) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """``"512x512x200@0.78x0.78x2.0,..."`` -> ``[((512, 512, 200), (0.78, 0.78, 2.0)), ...]``."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        shape, spacing = item.split("@")
        out.append((tuple(int(v) for v in shape.split("x")), tuple(float(v) for v in spacing.split("x"))))
    return out


def timed(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Wall times of each function over ``repeat`` rounds, the functions alternating within a round."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def best_of(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Minimum wall time of each function over ``repeat`` rounds, the functions alternating within a round."""
    return {k: min(v) for k, v in timed(fns, repeat).items()}


@contextmanager
def environment(var: str, value: str):
    """Set the environment variable ``var`` to ``value`` for the block, then restore it."""
    old = os.environ.get(var)
    os.environ[var] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def codec(name: str):
    """Force ``VISTA3D_GZIP_CODEC`` for the block."""
    return environment("VISTA3D_GZIP_CODEC", name)


def check_written(path: Path, labels: np.ndarray, ref: Any) -> None:
    """The file equals ``labels``, is marked as this program's output, and carries ``ref``'s affine and every header
    field but the value and mark ones."""
    from monai.apps.vista3d.io.nifti_write import is_vista3d_output

    if not is_vista3d_output(path):
        raise AssertionError(f"{path}: not marked as a vista3d output")
    back = nib.load(path)
    if not np.array_equal(np.asanyarray(back.dataobj), labels):
        raise AssertionError(f"{path}: the voxels differ from the label map")
    if not np.allclose(back.affine, ref.affine, atol=1e-6):
        raise AssertionError(f"{path}: the affine differs from the input's")
    for key in ref.header.keys():
        if key not in VALUE_FIELDS | MARK_FIELDS and not np.array_equal(back.header[key], ref.header[key]):
            raise AssertionError(f"{path}: header field {key} differs from the input's")


def _has_isal() -> bool:
    try:
        import isal  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"CTs as XxYxZ@SXxSYxSZ,... (default {DEFAULT_CASES})")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per measurement; the minimum is reported")
    parser.add_argument("--dtypes", default="uint8,int16,float32", help="output dtypes of the label map")
    parser.add_argument("--workdir", default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    cases = parse_cases(args.cases)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    codecs = (["isal"] if _has_isal() else []) + ["zlib"]
    cores = available_cores()
    rows: list[dict[str, Any]] = []

    def add(case, op, impl, seconds, ref=None, nbytes=None):
        ratio = ref / seconds if ref else None
        rows.append(
            {
                "case": case,
                "op": op,
                "impl": impl,
                "seconds": round(seconds, 4),
                "vs_nibabel": round(ratio, 2) if ratio else None,
                "file_bytes": nbytes,
            }
        )
        size = f"{nbytes / 1e6:7.2f} MB" if nbytes else " " * 10
        speed = f"{ratio:5.2f}x" if ratio else " " * 6
        print(f"{case:<14} {op:<14} {impl:<50} {seconds:7.3f} s  {speed}  {size}", flush=True)

    print(
        f"cores {cores}, torch threads {torch.get_num_threads()}, codecs {codecs}, load average "
        f"{os.getloadavg()[0]:.2f}; minimum of {args.repeat}, page cache warm"
    )
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        for shape, spacing in cases:
            case = "x".join(map(str, shape))
            src = write_phantom(tmp / f"ct_{case}.nii.gz", shape, spacing, seed=0)
            ref_img = nib.load(src)
            print(
                f"{case} at {spacing} mm: {src.stat().st_size / 1e6:.1f} MB gzip, "
                f"{np.prod(shape) * 2 / 1e6:.0f} MB of int16 voxels"
            )

            # ---- load
            def nib_load():
                return torch.from_numpy(nib.load(src).get_fdata().astype(np.float32))

            ref = nib_load()
            variants = {
                "float32 C order": {},
                "float32 file order": {"contiguous": False},
                "int16 file order (pipeline, GPU)": {"dtype": None, "contiguous": False},
            }
            timed = {}
            for c in codecs:  # nibabel runs in every round; its best over all rounds is the reference
                with codec(c):
                    for kw in variants.values():  # the same values as nibabel, whatever the layout
                        img, _ = vio.load_image(src, **kw)
                        if not torch.equal(img[0].float(), ref):
                            raise AssertionError("load_image differs from nibabel")
                    fns = {"nib": nib_load}
                    fns.update({name: (lambda kw=kw: vio.load_image(src, **kw)) for name, kw in variants.items()})
                    timed[c] = best_of(fns, args.repeat)
            nib_best = min(t["nib"] for t in timed.values())
            add(case, "load .nii.gz", "nibabel get_fdata -> float32 tensor", nib_best)
            for c, t in timed.items():
                for name in variants:
                    add(case, "load .nii.gz", f"load_image {name}, {c}", t[name], ref=nib_best)
            del ref, img

            # ---- save
            labels = make_phantom_labels(shape, spacing, seed=0).astype(np.int16)  # the pipeline's output type
            geom = vio.load_image(src, dtype=None, contiguous=False)[1]
            for dt in dtypes:
                nib_out, ours_out = tmp / f"nib_{dt}.nii.gz", tmp / f"ours_{dt}.nii.gz"

                def nib_save(dt=dt, out=nib_out):
                    nib.save(nib.Nifti1Image(labels.astype(dt), ref_img.affine, ref_img.header), out)

                fns = {"nib": nib_save}
                for c in codecs:
                    for threads in sorted({cores, 1}, reverse=True):
                        fns[(c, threads)] = lambda dt=dt, c=c, threads=threads: _save(
                            labels, geom, ours_out, dt, c, threads
                        )
                t = best_of(fns, args.repeat)
                nib_save()
                add(case, f"save {dt}", "nibabel.save (gzip level 1)", t["nib"], nbytes=nib_out.stat().st_size)
                for key, sec in t.items():
                    if key == "nib":
                        continue
                    c, threads = key
                    _save(labels, geom, ours_out, dt, c, threads)
                    check_written(ours_out, labels, ref_img)
                    add(
                        case,
                        f"save {dt}",
                        f"save_label_map {c} level 1, {threads} thread(s)",
                        sec,
                        ref=t["nib"],
                        nbytes=ours_out.stat().st_size,
                    )
            src.unlink()

    if args.json:
        meta = {
            "cases": args.cases,
            "cores": cores,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "codecs": codecs,
            "repeat": args.repeat,
            "load_average_end": os.getloadavg(),
            "python": platform.python_version(),
            "nibabel": nib.__version__,
            "numpy": np.__version__,
            "torch": torch.__version__,
            "page_cache": "warm",
            "command": "python tests/benchmarks/nifti_io.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


def _save(labels: np.ndarray, geom: Any, out: Path, dtype: str, codec_name: str, threads: int) -> None:
    with codec(codec_name):
        save_label_map(labels, geom, out, dtype=dtype, threads=threads)


if __name__ == "__main__":
    sys.exit(main())
