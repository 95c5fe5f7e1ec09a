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
"""File in, label map out: this fork's VISTA3D pipeline against the VISTA3D bundle's, per stage.

Both sides segment the same CT-like phantoms (int16 ``.nii.gz``, written once by
``monai.apps.vista3d.cli.phantom.write_phantom``) with the same random weights (one state dict, written by this
script, loaded strictly on both sides) and the same class prompt, and write a label map file:

* fork: ``run_batch``, the code the ``segment`` command runs (its loader and saver threads, the label map's
  one narrow copy to the host, the summary), with a ``Vista3DPipeline`` built once per ``--output-dtypes`` entry
  and one image per call;
* upstream (``--upstream PATH``: a folder where MONAI 1.6.1 is installed with ``pip install --target``): the
  bundle's ``configs/inference.json`` rebuilt from upstream transforms: ``LoadImaged`` -> ``EnsureChannelFirstd``
  -> ``EnsureTyped(device)`` -> ``Spacingd(1.5 mm)`` -> ``CropForegroundd(margin 10)`` -> ``VistaPreTransformd``
  -> ``ScaleIntensityRanged`` -> ``Orientationd(RAS)`` -> ``CastToTyped(float32)``; ``SlidingWindowInfererAdapt``
  (``with_coord``, fp16 autocast on CUDA); ``VistaPostTransformd`` -> ``Invertd(nearest)`` -> NaN to 255 ->
  ``SaveImaged(float32)``. The bundle's settings (spacing, crop, intensity window, roi, overlap) come from
  ``tests/testing_data/vista3d_labels.json``; ``LoadImaged`` uses its default (nibabel) reader.

Each side runs in its own process; each case is run once as a warm-up, then ``--repeats`` times, and the
median of each stage is reported (load / preprocess / inference / post = label ids + inversion / save /
total = the whole file-to-file call; the fork's stages are those of ``run_batch``'s image record, its total the
``run_batch`` call, summary included). Afterwards both written label maps are read back with nibabel and the
share of equal voxels is reported, with the output file sizes.

    python tests/benchmarks/vista3d_end_to_end.py --device cuda --upstream /tmp/up --json e2e.json
    python tests/benchmarks/vista3d_end_to_end.py --upstream /tmp/up     # CPU: small phantoms, a tiny network

The phantoms are written once to ``--workdir`` (a temporary folder by default) and read from the page cache
afterwards: the load column is decompression and conversion, not a cold disk read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
LABELS_JSON = REPO / "tests" / "testing_data" / "vista3d_labels.json"

#: the issue's CT sizes: (shape, spacing in mm)
CUDA_CASES = "512x512x200@0.78x0.78x2.0,512x512x480@0.9x0.9x1.0"
#: the same spacings on a tenth of the volume, for a tiny network on the CPU
CPU_CASES = "128x128x50@0.78x0.78x2.0,128x128x120@0.9x0.9x1.0"
STAGES = ("load", "preprocess", "inference", "post", "save", "total")


def parse_cases(text: str) -> list[tuple[tuple[int, int, int], tuple[float, float, float]]]:
    """``"512x512x200@0.78x0.78x2.0,..."`` -> ``[((512, 512, 200), (0.78, 0.78, 2.0)), ...]``.

    Raises:
        ValueError: a case is not ``XxYxZ@SXxSYxSZ`` with three positive sizes.
    """
    cases = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            shape_s, spacing_s = item.split("@")
            shape = tuple(int(v) for v in shape_s.lower().split("x"))
            spacing = tuple(float(v) for v in spacing_s.lower().split("x"))
        except ValueError:
            raise ValueError(f"case {item!r}: write it as XxYxZ@SXxSYxSZ, e.g. 512x512x200@0.78x0.78x2.0") from None
        if len(shape) != 3 or len(spacing) != 3 or min(shape) < 1 or min(spacing) <= 0:
            raise ValueError(f"case {item!r}: needs three positive sizes and three positive spacings")
        cases.append((shape, spacing))
    if not cases:
        raise ValueError("no cases given: e.g. --cases 512x512x200@0.78x0.78x2.0")
    return cases


def case_name(shape: tuple[int, ...], spacing: tuple[float, ...]) -> str:
    """File stem of a phantom, without dots: ``ct_512x512x200_0p78x0p78x2mm``."""
    return "ct_" + "x".join(map(str, shape)) + "_" + "x".join(f"{s:g}".replace(".", "p") for s in spacing) + "mm"


def median_stages(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per-stage median over timed runs (each a ``{stage: seconds}`` dict); stages missing in a run count 0."""
    keys = [k for k in STAGES if any(k in r for r in runs)]
    return {k: float(statistics.median(r.get(k, 0.0) for r in runs)) for k in keys}


def label_agreement(path_a: str | os.PathLike, path_b: str | os.PathLike) -> dict[str, Any]:
    """Read two label map files with nibabel; the share of equal voxels and whether their grids match.

    Returns:
        ``{"equal_voxels": fraction, "same_affine": bool, "shape": [X, Y, Z]}``; fraction is NaN when the shapes
        differ.
    """
    import nibabel as nib

    a, b = nib.load(str(path_a)), nib.load(str(path_b))
    va, vb = np.asanyarray(a.dataobj), np.asanyarray(b.dataobj)
    same = bool(np.allclose(a.affine, b.affine, atol=1e-4))
    if va.shape != vb.shape:
        return {"equal_voxels": float("nan"), "same_affine": same, "shape": list(va.shape)}
    eq = np.count_nonzero(va.astype(np.float32) == vb.astype(np.float32))
    return {"equal_voxels": eq / va.size, "same_affine": same, "shape": list(va.shape)}


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per (case, implementation): the median seconds of each stage, the file size, the speed-up."""
    head = f"{'CT':<30} {'impl':<16}" + "".join(f"{s:>11}" for s in STAGES) + f"{'file MB':>9}{'speed-up':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        st = r["stages"]
        cells = "".join(f"{st[s]:11.3f}" if s in st else f"{'-':>11}" for s in STAGES)
        up = r.get("speedup")
        lines.append(f"{r['case']:<30} {r['impl']:<16}{cells}{r.get('file_mb', float('nan')):9.1f}"
                     + (f"{up:8.2f}x" if up else f"{'':>9}"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- workers


def build_network(tiny: bool, embed_dim: int = 48) -> Any:
    """``vista3d132`` (or a 8-channel VISTA3D for the CPU) of whichever ``monai`` is imported, in eval mode."""
    from monai.networks.nets import vista3d132

    if not tiny:
        return vista3d132(encoder_embed_dim=embed_dim).eval()
    from monai.networks.nets.segresnet_ds import SegResNetDS2
    from monai.networks.nets.vista3d import (
        VISTA3D,
        ClassMappingClassify,
        PointMappingSAM,
    )

    enc = SegResNetDS2(in_channels=1, blocks_down=(1, 1, 1), norm="instance", out_channels=8, init_filters=8, dsdepth=1)
    return VISTA3D(enc, ClassMappingClassify(n_classes=512, feature_size=8, use_mlp=True),
                   PointMappingSAM(feature_size=8, n_classes=512, last_supported=132)).eval()


def _load_weights(args: argparse.Namespace, dev: Any) -> Any:
    import torch

    net = build_network(args.tiny, args.embed_dim)
    net.load_state_dict(torch.load(args.weights, map_location="cpu", weights_only=True), strict=True)
    return net.to(dev).eval()


def _class_ids(args: argparse.Namespace) -> list[int]:
    cfg = json.loads(LABELS_JSON.read_text())
    ids = list(cfg["everything_labels"])
    return ids[: args.classes] if args.classes else ids


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def fork_worker(args: argparse.Namespace) -> dict[str, Any]:
    """This fork: ``run_batch`` (what ``python -m monai.apps.vista3d segment`` runs) per case and output dtype."""
    import torch

    import monai
    from monai.apps.vista3d.batch.run import run_batch
    from monai.apps.vista3d.batch.segmenter import pipeline_segment_fn
    from monai.apps.vista3d.core.pipeline import Vista3DPipeline

    dev = torch.device(args.device)
    net = _load_weights(args, dev)
    cfg = json.loads(LABELS_JSON.read_text())
    ids = _class_ids(args)
    rows = []
    for dtype in args.output_dtypes:
        pipe = Vista3DPipeline(network=net, device=dev, roi_size=(args.roi,) * 3, overlap=cfg["inference"]["overlap"],
                               sw_batch_size=args.sw_batch_size, output_dtype=dtype, warn_random=False)
        segment = pipeline_segment_fn(pipe, classes=ids)
        for path in args.inputs:
            out_dir = Path(args.out) / f"fork_{dtype}"
            runs, out = [], None
            for i in range(args.repeats + 1):
                t0 = time.perf_counter()
                result = run_batch([path], out_dir, segment_fn=segment, overwrite=True)
                _sync(dev)
                total = time.perf_counter() - t0
                (rec,) = result.records
                if rec["status"] != "done":
                    raise RuntimeError(f"{path}: {rec['status']}: {rec['error']}")
                t, out = rec["stages"], rec["output"]
                run = {"load": t.get("load", 0.0), "preprocess": t.get("preprocess", 0.0),
                       "inference": t.get("inference", 0.0),
                       "post": t.get("postprocess", 0.0) + t.get("invert", 0.0), "save": t.get("save", 0.0),
                       "total": total}
                if i or not args.repeats:  # the first run is the warm-up, unless it is the only one
                    runs.append(run)
            rows.append({"impl": f"fork {dtype}", "input": path, "output": str(out), "runs": runs,
                         "stages": median_stages(runs), "file_bytes": Path(out).stat().st_size})
            print(f"  fork {dtype} {Path(path).name}: total {rows[-1]['stages']['total']:.3f} s", file=sys.stderr,
                  flush=True)
    from monai.apps.vista3d.io.gzip_codec import gzip_codec

    return {"rows": rows, "monai": monai.__version__, "torch": torch.__version__,
            "gzip_codec": gzip_codec().__name__}


def upstream_worker(args: argparse.Namespace) -> dict[str, Any]:
    """Upstream MONAI: the bundle's inference.json, transform by transform, per case."""
    import torch
    from monai.apps.vista3d.transforms import VistaPostTransformd, VistaPreTransformd

    import monai
    from monai.inferers import SlidingWindowInfererAdapt
    from monai.transforms import (
        CastToTyped,
        Compose,
        CropForegroundd,
        EnsureChannelFirstd,
        EnsureTyped,
        Invertd,
        Lambdad,
        LoadImaged,
        Orientationd,
        SaveImaged,
        ScaleIntensityRanged,
        Spacingd,
    )

    dev = torch.device(args.device)
    net = _load_weights(args, dev)
    cfg = json.loads(LABELS_JSON.read_text())
    pre, inf, post = cfg["preprocessing"], cfg["inference"], cfg["postprocessing"]
    sir = pre["scale_intensity_range"]
    ids = _class_ids(args)
    labels_dict = {k: v for k, v in cfg["label_names"].items()}
    loading = [LoadImaged(keys="image", image_only=True), EnsureChannelFirstd(keys="image"),
               EnsureTyped(keys="image", device=dev, track_meta=True)]
    rest = [Spacingd(keys="image", pixdim=pre["resample_spacing_mm"], mode=pre["spacing_mode"]),
            CropForegroundd(keys="image", allow_smaller=pre["crop_foreground"]["allow_smaller"],
                            margin=pre["crop_foreground"]["margin"], source_key="image"),
            VistaPreTransformd(keys="image", subclass=cfg["subclass"], labels_dict=labels_dict),
            ScaleIntensityRanged(keys="image", a_min=sir["a_min"], a_max=sir["a_max"], b_min=sir["b_min"],
                                 b_max=sir["b_max"], clip=sir["clip"]),
            Orientationd(keys="image", axcodes=pre["orientation"]), CastToTyped(keys="image", dtype=torch.float32)]
    load_t, rest_t, whole = Compose(loading), Compose(rest), Compose(loading + rest)
    inferer = SlidingWindowInfererAdapt(roi_size=(args.roi,) * 3, sw_batch_size=args.sw_batch_size,
                                        overlap=inf["overlap"], with_coord=True)
    to_labels = Compose([VistaPostTransformd(keys="pred"),
                         Invertd(keys="pred", transform=whole, orig_keys="image", nearest_interp=True, to_tensor=True),
                         Lambdad(keys="pred", func=lambda x: torch.nan_to_num(x, nan=post["nan_value"]))])
    out_dir = Path(args.out) / "upstream_float32"
    saver = SaveImaged(keys="pred", resample=False, output_dir=str(out_dir), output_ext=post["output_ext"],
                       output_dtype=np.float32, output_postfix=post["output_postfix"], separate_folder=True,
                       print_log=False)
    cv = torch.tensor(ids, device=dev).view(-1, 1)
    rows = []
    for path in args.inputs:
        runs = []
        for i in range(args.repeats + 1):
            t = {}
            t0 = time.perf_counter()
            data = load_t({"image": path, "label_prompt": torch.tensor(ids)})
            _sync(dev)
            t1 = time.perf_counter()
            data = rest_t(data)
            data["label_prompt"] = torch.as_tensor(data["label_prompt"])  # as the bundle's evaluator hands it on
            _sync(dev)
            t2 = time.perf_counter()
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.float16, enabled=dev.type == "cuda"):
                pred = inferer(data["image"][None], net, transpose=True, class_vector=cv, prompt_class=cv,
                               point_coords=None, point_labels=None, labels=None, label_set=None, prev_mask=None)
            data["pred"] = pred[0]
            del pred
            _sync(dev)
            t3 = time.perf_counter()
            data = to_labels(data)
            _sync(dev)
            t4 = time.perf_counter()
            saver(data)
            t5 = time.perf_counter()
            t = {"load": t1 - t0, "preprocess": t2 - t1, "inference": t3 - t2, "post": t4 - t3, "save": t5 - t4,
                 "total": t5 - t0}
            del data
            if i or not args.repeats:
                runs.append(t)
        stem = Path(path).name[: -len(".nii.gz")]
        out = out_dir / stem / f"{stem}_{post['output_postfix']}{post['output_ext']}"
        rows.append({"impl": "upstream float32", "input": path, "output": str(out), "runs": runs,
                     "stages": median_stages(runs), "file_bytes": out.stat().st_size})
        print(f"  upstream {Path(path).name}: total {rows[-1]['stages']['total']:.3f} s", file=sys.stderr, flush=True)
    return {"rows": rows, "monai": monai.__version__, "torch": torch.__version__}


# ---------------------------------------------------------------------------------------------- driver


def _run_worker(kind: str, pythonpath: str, args: argparse.Namespace, inputs: list[str], extra: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--device", args.device,
           "--repeats", str(args.repeats), "--sw-batch-size", str(args.sw_batch_size), "--roi", str(args.roi),
           "--classes", str(args.classes), "--weights", args.weights, "--out", args.out,
           "--output-dtypes", ",".join(args.output_dtypes), *(["--tiny"] if args.tiny else []), *extra,
           "--inputs", *inputs]
    print(f"[{kind}] PYTHONPATH={pythonpath} {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=args.out)
    if proc.returncode != 0:
        raise SystemExit(f"the {kind} worker failed with exit code {proc.returncode} (its error is above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--upstream", default=None, help="folder with upstream MONAI 1.6.1 (pip install --target PATH)")
    p.add_argument("--cases", default=None, help=f"phantoms XxYxZ@SXxSYxSZ,... (CUDA default {CUDA_CASES}; "
                                                  f"CPU default {CPU_CASES})")
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up; the median is reported")
    p.add_argument("--sw-batch-size", type=int, default=14, help="windows per network call, both sides (default 14)")
    p.add_argument("--output-dtypes", default="float32,uint8",
                   help="label map dtypes of the fork (default float32,uint8; upstream writes float32)")
    p.add_argument("--classes", type=int, default=0, help="first N of the 117 everything labels (0: all)")
    p.add_argument("--tiny", action="store_true", help="an 8-channel VISTA3D (the CPU default)")
    p.add_argument("--roi", type=int, default=None, help="window size (default 128; 32 with --tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and the phantoms")
    p.add_argument("--workdir", default=None, help="phantoms and outputs go here (default: a temporary folder)")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    p.add_argument("--worker", choices=("fork", "upstream"), help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    p.add_argument("--embed-dim", type=int, default=48, help=argparse.SUPPRESS)  # vista3d132's width, for a worker
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--inputs", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cpu = args.device == "cpu"
    args.tiny = args.tiny or (on_cpu and not args.worker)  # a worker builds what its driver names
    args.roi = args.roi or (32 if args.tiny else 128)
    args.output_dtypes = [d.strip() for d in args.output_dtypes.split(",") if d.strip()]
    if args.repeats < (0 if args.worker else 1):  # a worker's 0: one cold run, recorded (vista3d_cold_start.py)
        p.error("--repeats must be >= 1")
    if args.worker:
        result = (fork_worker if args.worker == "fork" else upstream_worker)(args)
        print(json.dumps(result))
        return 0
    if args.upstream and not (Path(args.upstream) / "monai" / "__init__.py").is_file():
        p.error(f"--upstream {args.upstream}: no monai package there; install it with "
                f"'pip install --no-deps --target {args.upstream} monai==1.6.1'")
    try:
        cases = parse_cases(args.cases or (CPU_CASES if on_cpu else CUDA_CASES))
    except ValueError as e:
        p.error(str(e))

    import torch

    sys.path.insert(0, str(REPO))
    from monai.apps.vista3d.cli.phantom import write_phantom

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vista3d_e2e_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.out = str(work)
    torch.manual_seed(args.seed)
    args.weights = str(work / "weights.pt")
    torch.save(build_network(args.tiny).state_dict(), args.weights)
    inputs, names = [], []
    for shape, spacing in cases:
        name = case_name(shape, spacing)
        path = work / f"{name}.nii.gz"
        if not path.is_file():
            write_phantom(path, shape, spacing, seed=args.seed)
        inputs.append(str(path))
        names.append(name)
        print(f"{name}: {path.stat().st_size / 1e6:.1f} MB gzip, {np.prod(shape) * 2 / 1e6:.0f} MB of int16 voxels",
              file=sys.stderr)

    results = {"fork": _run_worker("fork", str(REPO), args, inputs, [])}
    if args.upstream:
        results["upstream"] = _run_worker("upstream", str(Path(args.upstream).resolve()), args, inputs, [])

    rows, agreement = [], {}
    for inp, name in zip(inputs, names):
        up = next((r for r in results.get("upstream", {}).get("rows", []) if r["input"] == inp), None)
        for side in ("upstream", "fork"):
            for r in results.get(side, {}).get("rows", []):
                if r["input"] != inp:
                    continue
                row = {"case": name, "impl": r["impl"], "stages": r["stages"], "file_mb": r["file_bytes"] / 1e6,
                       "output": r["output"]}
                if up is not None and side == "fork":
                    row["speedup"] = up["stages"]["total"] / r["stages"]["total"]
                    ag = label_agreement(r["output"], up["output"])
                    agreement[f"{name} {r['impl']} vs upstream"] = ag
                rows.append(row)
    print()
    print(format_table(rows))
    for key, ag in agreement.items():
        print(f"{key}: {100 * ag['equal_voxels']:.4f} % equal voxels, same affine: {ag['same_affine']}")
    print(f"device {args.device}, sw_batch_size {args.sw_batch_size}, roi {args.roi}, "
          f"{'tiny network' if args.tiny else 'vista3d132'}, {args.classes or 117} classes, median of {args.repeats} "
          f"after a warm-up; inputs read from the page cache; fork gzip codec {results['fork'].get('gzip_codec')}")
    if args.json:
        meta = {"device": args.device, "sw_batch_size": args.sw_batch_size, "roi": args.roi, "tiny": args.tiny,
                "classes": args.classes or 117, "repeats": args.repeats, "cpus": os.cpu_count(),
                "command": "python tests/benchmarks/vista3d_end_to_end.py " + " ".join(
                    argv if argv is not None else sys.argv[1:]),
                "versions": {k: {"monai": v["monai"], "torch": v["torch"]} for k, v in results.items()}}
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows, "agreement": agreement,
                                               "raw": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
