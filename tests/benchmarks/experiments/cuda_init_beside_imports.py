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
"""Experiment: can CUDA's start run beside the command's imports? (issue 50, item 2)

After ``import torch`` the command imports the modules of a run (the batch runner, the NIfTI reader and nibabel,
which imports pydicom where it is installed) and starts CUDA (``get_device_properties``: the driver's start); one
after the other in a fresh process today. This times, in fresh processes, from ``import torch`` done to both done:
``serial`` (today's order), ``thread`` (CUDA started on a thread while the main thread imports: pays only if the
driver's start lets go of the GIL), ``serial-no-pydicom`` (nibabel imported as where pydicom is not installed).

    python tests/benchmarks/experiments/cuda_init_beside_imports.py --repeats 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

CHILD = """
import sys, threading, time
import torch
start = time.perf_counter()
layout = sys.argv[1]
def cuda():
    torch.cuda.get_device_properties(0)
if layout == "thread":
    t = threading.Thread(target=cuda)
    t.start()
if layout == "serial-no-pydicom":
    sys.modules["pydicom"] = None
import monai.apps.vista3d.batch.run, monai.apps.vista3d.io.nifti_read, monai.apps.vista3d.core.feasibility
imports = time.perf_counter() - start
if layout == "serial-no-pydicom":
    del sys.modules["pydicom"]
if layout == "thread":
    t.join()
else:
    cuda()
print(f"{time.perf_counter() - start:.3f} {imports:.3f}")
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    for layout in ("serial", "thread", "serial-no-pydicom"):
        rows = []
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", CHILD, layout], capture_output=True, text=True, check=True,
                                 cwd=REPO).stdout.split()
            rows.append(f"{float(out[0]):.3f} s (imports {float(out[1]):.3f})")
        print(f"{layout:18s} import torch -> imports and CUDA done: {', '.join(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
