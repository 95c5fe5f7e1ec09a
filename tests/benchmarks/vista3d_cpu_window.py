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
"""Seconds of one full-size VISTA3D window on the CPU: what ``segment`` costs per window without a GPU.

The published network (``vista3d132``, embed 48) on one 128³ window with the 117 classes of "everything",
random weights (speed does not depend on them). A CT's cost is this times its window count (printed for a
typical 512x512x300 chest-abdomen CT at 0.8x0.8x1.5 mm).

    python tests/benchmarks/vista3d_cpu_window.py --repeats 2
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from monai.apps.vista3d.labels import everything_labels  # noqa: E402
from monai.networks.nets import vista3d132  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    net = vista3d132().eval()
    x = torch.randn(1, 1, 128, 128, 128)
    cv = torch.tensor(everything_labels()).view(-1, 1)
    coords = [(slice(None), slice(None), slice(0, 128), slice(0, 128), slice(0, 128))]
    times = []
    with torch.no_grad():
        for _ in range(args.repeats):
            start = time.perf_counter()
            net(x, patch_coords=coords, class_vector=cv, prompt_class=cv, transpose=True)
            times.append(time.perf_counter() - start)
    # 512x512x300 at 0.8x0.8x1.5 mm -> 273x273x300 at 1.5 mm; windows of 128 with overlap 0.25 step by 96
    windows = math.prod(math.ceil((n - 128) / 96) + 1 for n in (273, 273, 300))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads: one 128^3 window "
          f"{', '.join(f'{t:.1f}' for t in times)} s; a 512x512x300 CT ({windows} windows) ~{windows * min(times) / 60:.0f} min")


if __name__ == "__main__":
    main()
