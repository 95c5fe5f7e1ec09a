"""Measurements for the PR write-ups, each run on a checkout of the branch and of the untouched tree it is built on.

    python tools/upstream_prs/bench.py SUBCOMMAND --tree untouched=PATH --tree branch=PATH [options]

Every tree is measured in its own fresh process with ``PYTHONPATH=PATH`` (its ``monai.__file__`` is printed), one
after the other in the same run on the same machine. Subcommands: ``class-head``, ``cache``, ``bottleneck``,
``timing``, ``clicks``, ``labeller``, ``meta-build``, ``review-9071``. The code that measures is below; nothing
here is upstream's.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], repeats: int, device) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# --- what each subcommand measures in one tree (runs inside that tree's process) ----------------------------------


def class_head(args) -> dict:
    import torch

    from monai.networks.nets.vista3d import ClassMappingClassify

    out = {}
    for k, c in [(1, 1), (1, 48), (3, 1), (117, 48)]:
        head = ClassMappingClassify(n_classes=max(k, 2), feature_size=c, use_mlp=False).eval()
        try:
            with torch.no_grad():
                logits, _ = head(torch.randn(2, c, 4, 4, 4), torch.arange(k).view(-1, 1))
            out[f"K={k} C={c}"] = f"ok {list(logits.shape)}"
        except Exception as e:  # the failure itself is the measurement
            out[f"K={k} C={c}"] = f"{type(e).__name__}: {str(e).splitlines()[0][:70]}"
    return out


def _tiny_or_full_vista3d(size: int):
    from monai.networks.nets.vista3d import vista3d132

    return vista3d132(encoder_embed_dim=48 if size >= 64 else 8)


def cache(args) -> dict:
    from unittest import mock

    import torch

    net = _tiny_or_full_vista3d(args.size).to(args.device).eval()
    settings = [True, False] if "release_cached_memory" in inspect.signature(type(net).__init__).parameters else [None]
    image = torch.randn(args.windows, 1, args.size, args.size, args.size, device=args.device)
    classes = torch.arange(1, args.classes + 1, device=args.device).view(-1, 1)
    out = {}
    for setting in settings:
        if setting is not None:
            net.release_cached_memory = setting
        name = f"release_cached_memory={setting}" if setting is not None else "untouched"
        with torch.no_grad(), mock.patch("torch.cuda.empty_cache", wraps=torch.cuda.empty_cache) as calls:
            net(image, class_vector=classes)
            count = calls.call_count
        with torch.no_grad():
            if torch.device(args.device).type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            ms = _median_ms(lambda: net(image, class_vector=classes), args.repeats, args.device)
        row = {"empty_cache calls per forward": count, "median ms": round(ms, 1)}
        if torch.device(args.device).type == "cuda":
            row["allocated peak MiB"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            row["reserved peak MiB"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
        out[name] = row
    return out


def bottleneck(args) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from monai.networks.nets.vista3d import vista3d132

    class Clones(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            result = func(*a, **(kw or {}))
            if func is torch.ops.aten.clone.default:
                self.calls += 1
                self.bytes += result.numel() * result.element_size()
            return result

    encoder = vista3d132().image_encoder.to(args.device).eval()
    x = torch.randn(1, 1, args.size, args.size, args.size, device=args.device)
    with torch.no_grad():
        with Clones() as clones:
            encoder(x, with_point=True, with_label=True)
        ms = _median_ms(lambda: encoder(x, with_point=True, with_label=True), args.repeats, args.device)
    return {"clone calls": clones.calls, "cloned MiB": round(clones.bytes / 2**20, 3), "median ms": round(ms, 1)}


def timing(args) -> dict:
    import torch

    from monai.inferers import SlidingWindowInferer

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv3d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv3d(8, args.classes, 3, padding=1)
    ).to(args.device)
    x = torch.randn(1, 1, args.size, args.size, args.size, device=args.device)
    roi = (args.roi,) * 3
    supported = "timing" in inspect.signature(SlidingWindowInferer.__init__).parameters
    out = {}
    for timed in [False, True] if supported else [False]:
        inferer = SlidingWindowInferer(roi, args.sw_batch_size, overlap=0.25, **({"timing": True} if timed else {}))
        with torch.no_grad():
            inferer(x, net)  # warm-up
            ms = _median_ms(lambda inferer=inferer: inferer(x, net), args.repeats, args.device)
        row: dict = {"median ms": round(ms, 1)}
        if timed:
            t = inferer.timings
            row.update({k: round(t[k] * 1e3, 2) for k in ("total", "forward", "other", "sync")})
            row.update({k: t[k] for k in ("windows", "batches", "synchronized")})
        out[f"timing={timed}"] = row
    return out


def clicks(args) -> dict:
    import torch

    from monai.apps.vista3d.inferer import point_based_window_inferer
    from monai.networks.nets.vista3d import vista3d132
    from monai.transforms.utils import keep_components_with_positive_points

    torch.manual_seed(0)
    net = vista3d132().to(args.device).eval()
    image = torch.randn(1, 1, *args.image, device=args.device)
    roi = [args.roi] * 3
    on_device = "device" in inspect.signature(point_based_window_inferer).parameters
    extra = {"device": image.device} if on_device else {}
    rng = torch.Generator().manual_seed(1)
    clicks_at = [[int(torch.randint(s // 4, 3 * s // 4, (1,), generator=rng)) for s in args.image] for _ in range(5)]

    def click(n: int, prev=None):
        coords = torch.tensor([clicks_at[:n]], device=args.device)
        labels = torch.ones(1, n, device=args.device)
        with torch.no_grad(), torch.autocast(torch.device(args.device).type, enabled=args.amp):
            logits = point_based_window_inferer(
                image,
                roi,
                net,
                coords,
                labels,
                prev_mask=prev,
                point_start=n - 1 if prev is not None else 0,
                transpose=True,
                **extra,
            )
        return keep_components_with_positive_points(logits, coords, labels)

    click(1)  # warm-up
    one = _median_ms(lambda: click(1), args.repeats, args.device)

    def sequence():
        prev = None
        for n in range(1, 6):
            prev = click(n, prev)
        return prev

    five = _median_ms(sequence, max(1, args.repeats // 2), args.device)
    return {
        "stitch device": str(image.device if on_device else "cpu"),
        "one click ms": round(one, 1),
        "5-click sequence ms": round(five, 1),
    }


def labeller(args) -> dict:
    import numpy as np
    import torch
    from scipy import ndimage
    from skimage import measure

    from monai.transforms.utils import label_connected_components

    rng = np.random.RandomState(0)
    noise = ndimage.gaussian_filter(rng.rand(*args.image), 3)
    masks = {"smooth blobs": noise > np.quantile(noise, 0.6), "random voxels": rng.rand(*args.image) < 0.3}
    out = {}
    for name, mask in masks.items():
        expected = measure.label(mask, connectivity=3)
        tensor = torch.as_tensor(mask, device=args.device)
        labels = label_connected_components(tensor, connectivity=3)
        ms = _median_ms(lambda t=tensor: label_connected_components(t, connectivity=3), args.repeats, args.device)
        sk = _median_ms(lambda m=mask: measure.label(m, connectivity=3), args.repeats, "cpu")
        equal = bool(np.array_equal(labels.cpu().numpy(), expected))
        out[name] = {
            "components": int(expected.max()),
            "equal to skimage": equal,
            f"label_connected_components on {args.device} ms": round(ms, 1),
            "skimage (CPU) ms": round(sk, 1),
        }
    return out


def review_9071(args) -> dict:
    """#9071's reduced inference (loaded from ``--pr-module``) against ``sliding_window_inference`` + argmax."""
    import importlib.util

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from monai.inferers import sliding_window_inference

    spec = importlib.util.spec_from_file_location("pr9071", args.pr_module)
    pr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pr)  # type: ignore[union-attr]

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            result = func(*a, **(kw or {}))
            for t in result if isinstance(result, (tuple, list)) else [result]:
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel() * t.element_size())
            return result

    out = {}
    for shape, dtype, outer in [
        ((40, 36, 72), torch.float32, None),
        ((40, 36, 72), torch.float32, 0),
        ((40, 36, 72), torch.float16, None),
        ((40, 36, 72), torch.float16, 0),
    ]:
        torch.manual_seed(0)
        conv = torch.nn.Conv3d(1, args.classes, 3, padding=1).to(dtype)
        x = torch.randn(1, 1, *shape).to(dtype)
        roi = (args.roi,) * 3
        with torch.no_grad():
            with Largest() as full_mode:
                full = sliding_window_inference(x, roi, args.sw_batch_size, conv, overlap=0.5)
            expected = full.argmax(dim=1, keepdim=True)
            with Largest() as reduced_mode:
                labels = pr.sliding_window_inference_with_reduction(
                    x, roi, args.sw_batch_size, conv, overlap=0.5, outer_dim=outer
                )
        differ = int((labels.long() != expected).sum())
        out[f"{tuple(shape)} {str(dtype)[6:]} outer_dim={outer}"] = {
            "voxels whose label differs from sliding_window_inference + argmax": differ,
            "largest tensor MiB (full, reduced)": [
                round(full_mode.numel / 2**20, 2),
                round(reduced_mode.numel / 2**20, 2),
            ],
        }
    return out


FRESH_META_BUILD = """
import sys, time, torch
from monai.networks.nets.vista3d import vista3d132
t = time.perf_counter()
with torch.device("meta"):
    vista3d132()
print(round(time.perf_counter() - t, 3), "sympy" in sys.modules, "torch._dynamo" in sys.modules)
"""


def meta_build(args) -> dict:
    times, loaded = [], set()
    for _ in range(args.repeats):
        proc = subprocess.run([sys.executable, "-c", FRESH_META_BUILD], capture_output=True, text=True, check=True)
        seconds, sympy, dynamo = proc.stdout.split()
        times.append(float(seconds))
        loaded |= {m for m, flag in (("sympy", sympy), ("torch._dynamo", dynamo)) if flag == "True"}
    return {
        "first meta build s (each a fresh process)": times,
        "median s": statistics.median(times),
        "loaded by the build": sorted(loaded) or "nothing",
    }


MEASURES = {
    "class-head": class_head,
    "cache": cache,
    "bottleneck": bottleneck,
    "timing": timing,
    "clicks": clicks,
    "labeller": labeller,
    "meta-build": meta_build,
    "review-9071": review_9071,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measure", choices=sorted(MEASURES))
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a MONAI checkout; repeatable")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", type=int, default=32, help="window or image edge (cache, bottleneck, timing)")
    parser.add_argument("--image", type=int, nargs=3, default=[96, 96, 64], help="image shape (clicks, labeller)")
    parser.add_argument("--roi", type=int, default=16)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--sw-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--amp", action="store_true", help="fp16 autocast (clicks)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each tree's process (0: default)")
    parser.add_argument(
        "--pr-module", help="review-9071: a file holding #9071's sliding_window_inference_with_reduction"
    )
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.inside:  # one tree, in this process
        import torch

        import monai

        if args.threads:
            torch.set_num_threads(args.threads)
        result = MEASURES[args.measure](args)
        print(json.dumps({"monai": str(Path(monai.__file__).parent), "torch": torch.__version__, **result}))
        return 0
    if not args.tree:
        raise SystemExit("pass --tree NAME=PATH at least once")
    raw = [a for a in (argv if argv is not None else sys.argv[1:])]
    print(f"$ python tools/upstream_prs/bench.py {' '.join(raw)}")
    for spec in args.tree:
        name, _, path = spec.partition("=")
        # the tree first; what PYTHONPATH held (e.g. packages installed with --target) stays after it
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(path).resolve()), os.environ.get("PYTHONPATH")])),
        }
        cmd = [sys.executable, str(Path(__file__).resolve()), *raw, "--inside"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
        if proc.returncode != 0:
            print(f"{name}: failed\n{proc.stderr[-3000:]}")
            return 1
        print(f"{name}: {proc.stdout.strip().splitlines()[-1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
