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
"""Load and save of a CT-sized NIfTI: plain nibabel (what MONAI's LoadImage/SaveImage do) vs monai.apps.vista3d.io.

Writes a phantom CT (int16 .nii.gz, like a scanner export) and its label map to a temporary folder, then times

* load: ``nibabel.load(p).get_fdata()`` -> float32 tensor (MONAI's NibabelReader path), nibabel's
  ``np.asanyarray(dataobj)`` -> float32, and ``load_image`` with zlib and with isal (if installed);
* save: ``nibabel.save`` of a float32 / uint8 label map (nibabel's gzip level 1) and ``save_label_map`` with
  zlib on 1 and N threads and with isal;
* a load+save loop of several volumes, sequential vs with ``AsyncSaver``.

Each timing is the minimum of ``--repeat`` runs (the machine may be shared). Example::

    python tests/benchmarks/nifti_io.py --size 512,512,300 --json io.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d import io as vio  # noqa: E402
from monai.apps.vista3d.batch import AsyncSaver  # noqa: E402
from monai.apps.vista3d.phantom import make_phantom_labels, write_phantom  # noqa: E402


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


class _codec:
    """Context: force VISTA3D_GZIP_CODEC for the block."""

    def __init__(self, name: str):
        self.name, self.old = name, None

    def __enter__(self):
        self.old = os.environ.get("VISTA3D_GZIP_CODEC")
        os.environ["VISTA3D_GZIP_CODEC"] = self.name

    def __exit__(self, *a):
        if self.old is None:
            os.environ.pop("VISTA3D_GZIP_CODEC", None)
        else:
            os.environ["VISTA3D_GZIP_CODEC"] = self.old


def _has_isal() -> bool:
    try:
        import isal  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="512,512,300", help="phantom size X,Y,Z (default 512,512,300)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the minimum is reported")
    parser.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="compression threads")
    parser.add_argument("--volumes", type=int, default=3, help="volumes in the load+save loop (0 to skip)")
    parser.add_argument("--device", default="cpu", help="only 'cpu': NIfTI I/O runs on the CPU")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.device != "cpu":
        parser.error("NIfTI I/O runs on the CPU; use --device cpu")
    shape = tuple(int(s) for s in args.size.split(","))
    torch.set_num_threads(os.cpu_count() or 1)
    isal = _has_isal()
    rows: list[dict] = []

    def add(op, impl, seconds, size=None, note=""):
        rows.append({"op": op, "impl": impl, "seconds": round(seconds, 4), "bytes": size, "note": note})
        mb = f"{size / 1e6:8.1f}" if size else " " * 8
        print(f"{op:<22} {impl:<40} {seconds:8.3f} s {mb} MB  {note}", flush=True)

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        src = write_phantom(d / "ct.nii.gz", shape, seed=0)
        labels = make_phantom_labels(shape, seed=0)
        print(f"phantom {shape} int16: {src.stat().st_size / 1e6:.1f} MB gzip; torch threads {torch.get_num_threads()}")
        print(f"{'operation':<22} {'implementation':<40} {'time':>10} {'file':>11}")

        # ---- load
        def nib_fdata():
            return torch.from_numpy(nib.load(src).get_fdata().astype(np.float32))

        def nib_dataobj():
            return torch.from_numpy(np.asanyarray(nib.load(src).dataobj).astype(np.float32))

        add("load .nii.gz", "nibabel get_fdata -> float32 (MONAI)", _best(nib_fdata, args.repeat))
        add("load .nii.gz", "nibabel asanyarray(dataobj) -> float32", _best(nib_dataobj, args.repeat))
        ref = nib_fdata()
        codecs = ["zlib"] + (["isal"] if isal else [])
        for c in codecs:
            with _codec(c):
                img, geom = vio.load_image(src)
                assert torch.equal(img[0], ref), "load_image differs from nibabel"
                add("load .nii.gz", f"load_image {c} (C-contiguous)", _best(lambda: vio.load_image(src), args.repeat))
                add(
                    "load .nii.gz",
                    f"load_image {c} contiguous=False",
                    _best(lambda: vio.load_image(src, contiguous=False), args.repeat),
                )
        del ref
        raw = d / "ct.nii"
        nib.save(nib.load(src), raw)
        add("load .nii", "nibabel get_fdata -> float32", _best(lambda: nib.load(raw).get_fdata().astype(np.float32), args.repeat))
        add("load .nii", "load_image", _best(lambda: vio.load_image(raw), args.repeat))

        # ---- save
        for dtype in ("float32", "uint8"):
            lab = labels.astype(dtype)
            out = d / f"nib_{dtype}.nii.gz"

            def nib_save():
                nib.save(nib.Nifti1Image(lab, geom.affine, geom.header), out)

            add(f"save {dtype} .nii.gz", "nibabel save (gzip level 1)", _best(nib_save, args.repeat), out.stat().st_size)
            for c in codecs:
                for threads in sorted({1, args.threads}):
                    with _codec(c):
                        out = d / f"ours_{dtype}_{c}_{threads}.nii.gz"

                        def ours():
                            vio.save_label_map(lab, geom, out, dtype=dtype, threads=threads)

                        t = _best(ours, args.repeat)
                    back = np.asanyarray(nib.load(out).dataobj)
                    assert np.array_equal(back, lab), "save_label_map output differs"
                    add(f"save {dtype} .nii.gz", f"save_label_map {c} level 1, {threads} thread(s)", t, out.stat().st_size)

        # ---- a loop over volumes: load next while the previous label map is written
        if args.volumes > 0:
            lab = labels.astype("float32")
            outs = d / "loop"

            def sequential():
                for i in range(args.volumes):
                    img, g = vio.load_image(src)
                    vio.save_label_map(lab, g, outs / f"s{i}.nii.gz")

            def overlapped():
                with AsyncSaver() as saver:
                    for i in range(args.volumes):
                        img, g = vio.load_image(src)
                        saver.submit(lab, g, outs / f"a{i}.nii.gz")

            def nibabel_loop():
                for i in range(args.volumes):
                    img = nib.load(src)
                    torch.from_numpy(img.get_fdata().astype(np.float32))
                    nib.save(nib.Nifti1Image(lab, img.affine, img.header), outs / f"n{i}.nii.gz")

            outs.mkdir()
            n = args.volumes
            add(f"load+save x{n}", "nibabel (MONAI LoadImage/SaveImage path)", _best(nibabel_loop, 1))
            add(f"load+save x{n}", "load_image + save_label_map", _best(sequential, 1))
            add(f"load+save x{n}", "load_image + AsyncSaver", _best(overlapped, 1))

    if args.json:
        meta = {
            "size": shape,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "isal": isal,
            "python": platform.python_version(),
            "nibabel": nib.__version__,
            "command": "python tests/benchmarks/nifti_io.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        }
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
