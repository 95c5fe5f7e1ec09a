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
"""How much the full-logits label map changes with ``sw_batch_size`` alone, in one MONAI implementation.

Under fp16 autocast cuDNN picks different convolution kernels for different batch sizes, so the logits of a
window differ in their last bits and labels flip wherever two classes are nearly tied (many voxels with random
weights). This measures that floor for whichever ``monai`` is importable (``PYTHONPATH=/tmp/up`` for upstream):
the label agreement of ``SlidingWindowInfererAdapt`` + post-transform at each batch size with the first one.

    PYTHONPATH=/tmp/up python tests/benchmarks/vista3d_batch_agreement.py --device cuda --sizes 256x256x256,512x512x512
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vista3d_everything import build_net, everything_labels, label_map  # noqa: E402


def main(argv=None) -> int:
    import monai
    from monai.inferers import SlidingWindowInfererAdapt

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", default=None, help="e.g. 256x256x256,512x512x512")
    p.add_argument("--sw-batch-sizes", default="14,1,2", help="the first is the reference")
    p.add_argument("--classes", type=int, default=117)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    roi = 128 if cuda else 32
    sizes = [tuple(int(v) for v in s.split("x")) for s in (a.sizes or ("256x256x256" if cuda else "48x48x48")).split(",")]
    net = build_net(not cuda, dev)
    ids = torch.tensor(everything_labels()[: a.classes], device=dev)
    cv = ids.view(-1, 1)
    amp = dict(device_type=dev.type, dtype=torch.float16, enabled=cuda)
    rows = []
    print(f"monai {monai.__version__}")
    for size in sizes:
        image = torch.rand((1, 1, *size), generator=torch.Generator().manual_seed(0)).to(dev)
        ref = None
        for bs in (int(b) for b in a.sw_batch_sizes.split(",")):
            inferer = SlidingWindowInfererAdapt(roi_size=(roi,) * 3, sw_batch_size=bs, overlap=0.25, with_coord=True)
            with torch.no_grad(), torch.autocast(**amp):
                labels = label_map(inferer(image, net, class_vector=cv, prompt_class=cv, transpose=True)[0], ids).cpu()
            ref = labels if ref is None else ref
            agree = (labels == ref).double().mean().item()
            rows.append({"size": "x".join(map(str, size)), "sw_batch_size": bs, "agreement_with_first": agree})
            print(f"{rows[-1]['size']:14s} sw_batch_size {bs:3d}  labels = sw_batch_size {a.sw_batch_sizes.split(',')[0]}: "
                  f"{100 * agree:.4f} %", flush=True)
            del labels
            if cuda:
                torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
