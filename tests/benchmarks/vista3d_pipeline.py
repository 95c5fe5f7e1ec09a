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
"""End-to-end VISTA3D pipeline latency: the same as ``python -m monai.apps.vista3d benchmark``.

Writes a CT-like phantom, segments it with random weights and prints the per-stage table (load,
preprocessing, inference with its sliding-window stages, postprocessing, inversion, save) and latency vs
``sw_batch_size``. CPU default: 160x160x96 phantom, ``vista3d132(encoder_embed_dim=8)``, roi 64³ (about
1.5 min on 2 cores); CUDA default: 256x256x176, the bundle's network and roi 128³, fp16 autocast.

    python tests/benchmarks/vista3d_pipeline.py --help
    python tests/benchmarks/vista3d_pipeline.py --device cuda --json pipeline.json
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from monai.apps.vista3d.cli.main import main

    sys.exit(main(["benchmark", *sys.argv[1:]]))
