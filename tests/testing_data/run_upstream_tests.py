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
"""Run upstream MONAI's own unit tests of the carried modules against this fork (or against upstream itself).

Nothing of upstream is copied into this repository: the test files are taken from a clone of upstream's git
repository into a scratch folder outside it, next to two stand-ins written by this script: ``tests/test_utils.py``
(the few helpers those tests import, without ``monai.data`` and the other modules the fork does not carry) and a
``conftest.py`` that gives the fork ``eval_mode``, ``list_data_collate`` and ``MetaTensor`` stand-ins and turns a
name the fork declares not carried into a placeholder, so that only the tests using it fail (with the fork's
"not part of this fork" message) while the rest of their file runs. Each failure is then counted as a declared
not-carried name or as a difference::

    git clone https://github.com/Project-MONAI/MONAI /tmp/MONAI
    python tests/testing_data/run_upstream_tests.py --repo /tmp/MONAI --out /tmp/uptests

``--pythonpath`` puts another monai first (an upstream install, to see what fails there too); scikit-image, which
upstream's point-helper tests need, can be added the same way. See docs/upstream-compatibility.md for the counts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# upstream's tests of the modules this fork carries (at 1.5.0, whose cases 1.6.1 keeps)
TEST_FILES = (
    "tests/networks/nets/test_vista3d.py",
    "tests/networks/nets/test_segresnet_ds.py",
    "tests/networks/blocks/test_adn.py",
    "tests/networks/blocks/test_convolutions.py",
    "tests/networks/blocks/test_dynunet_block.py",
    "tests/networks/blocks/test_mlp.py",
    "tests/networks/blocks/test_unetr_block.py",
    "tests/networks/blocks/test_upsample_block.py",
    "tests/networks/layers/test_get_layers.py",
    "tests/inferers/test_sliding_window_inference.py",
    "tests/apps/vista3d/test_point_based_window_inferer.py",
    "tests/integration/test_vista3d_utils.py",
    "tests/utils/test_look_up_option.py",
    "tests/utils/test_optional_import.py",
    "tests/utils/test_squeeze_unsqueeze.py",
    "tests/utils/misc/test_ensure_tuple.py",
)

TEST_UTILS = '''"""Stand-in for upstream's tests/test_utils.py: the helpers the selected tests import."""
import io
import os
import unittest

import numpy as np
import torch


def assert_allclose(actual, desired, type_test=True, device_test=False, *args, **kwargs):
    as_np = lambda x: x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    np.testing.assert_allclose(as_np(actual), as_np(desired), *args, **kwargs)


def test_is_quick():
    return os.environ.get("QUICKTEST", "").lower() in ("1", "true", "yes")


def skip_if_quick(obj):
    return unittest.skipIf(test_is_quick(), "skipped in quick mode")(obj)


def skip_if_no_cuda(obj):
    return unittest.skipUnless(torch.cuda.is_available(), "needs CUDA")(obj)


class SkipIfBeforePyTorchVersion:
    def __init__(self, version):
        self.version = version

    def __call__(self, obj):
        return obj


TEST_TORCH_AND_META_TENSORS = [torch.as_tensor]


def test_script_save(net, *inputs, device=None, rtol=1e-4, atol=0.0):
    net = net.eval()
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(net), buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    with torch.no_grad():
        want, got = net(*inputs), loaded(*inputs)
    for a, b in zip(*(([w] if isinstance(w, torch.Tensor) else w) for w in (want, got))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=atol)


test_script_save.__test__ = False


class _ImageCase(unittest.TestCase):
    im_shape = (128, 64)
    input_channels, output_channels, num_classes = 1, 4, 3

    def setUp(self):
        rng = np.random.RandomState(0)
        grids = np.ogrid[tuple(slice(0, s) for s in self.im_shape)]
        image, labels = np.zeros(self.im_shape), np.zeros(self.im_shape)
        for k in range(4):
            centre, radius = [rng.randint(20, s - 20) for s in self.im_shape], rng.randint(5, 20)
            inside = sum((g - c) ** 2 for g, c in zip(grids, centre)) <= radius**2
            image[inside], labels[inside] = 0.5 + 0.5 * rng.random(), k % self.num_classes + 1
        self.imt = torch.tensor(image[None, None], dtype=torch.float32)
        self.seg1 = torch.tensor((labels[None, None] > 0), dtype=torch.float32)
        self.segn = torch.tensor(labels[None, None], dtype=torch.float32)


class TorchImageTestCase2D(_ImageCase):
    im_shape = (128, 64)


class TorchImageTestCase3D(_ImageCase):
    im_shape = (64, 48, 80)
'''

CONFTEST = '''"""Stand-ins for the fork: upstream helpers from modules it does not carry; declared names as placeholders."""
import contextlib
import importlib
import json
import os
import sys
import types

import torch

import monai
import monai.networks

RESULTS = []


@contextlib.contextmanager
def eval_mode(*nets):
    training = [n.training for n in nets]
    try:
        with torch.no_grad():
            yield [n.eval() for n in nets]
    finally:
        for n, t in zip(nets, training):
            n.train(t)


class NotCarried:
    """A name the fork declares not carried: any use raises the fork's error."""

    def __init__(self, name):
        object.__setattr__(self, "_name", name)

    def _fail(self, *args, **kwargs):
        from monai.utils.module import not_carried_error

        raise not_carried_error(self._name)

    __call__ = _fail

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        self._fail()


def _placeholders(module_name, previous):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        for find in (previous, lambda n: importlib.import_module(f"{module_name}.{n}")):
            try:
                if find is not None:
                    return find(name)
            except (AttributeError, ImportError):
                pass
        return NotCarried(f"{module_name}.{name}")

    return __getattr__


if monai.__version__.endswith("+vista3d"):
    monai.networks.eval_mode = eval_mode
    data, data_utils, meta = (types.ModuleType(n) for n in ("monai.data", "monai.data.utils", "monai.data.meta_tensor"))
    data_utils.list_data_collate = torch.utils.data.default_collate
    meta.MetaTensor = type("MetaTensor", (torch.Tensor,), {})
    data.utils, data.meta_tensor = data_utils, meta
    sys.modules.update({"monai.data": data, "monai.data.utils": data_utils, "monai.data.meta_tensor": meta})
    for name in ("monai.networks", "monai.networks.blocks", "monai.networks.blocks.dynunet_block",
                 "monai.networks.blocks.unetr_block", "monai.networks.blocks.convolutions", "monai.networks.layers",
                 "monai.networks.nets", "monai.inferers", "monai.utils", "monai.transforms", "monai.apps.vista3d"):
        module = importlib.import_module(name)
        module.__getattr__ = _placeholders(name, module.__dict__.get("__getattr__"))


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        crash = getattr(report.longrepr, "reprcrash", None)
        RESULTS.append({"id": report.nodeid, "outcome": report.outcome, "message": crash.message if crash else ""})


def pytest_sessionfinish(session):
    with open(os.environ["UPSTREAM_TEST_RESULTS"], "w") as f:
        json.dump(RESULTS, f)
'''

DECLARED = ("is not part of this fork", "is not carried by this fork")


def extract(repo: str, tag: str, out: str) -> None:
    """Upstream's test files at ``tag`` into ``out``, with the stand-ins and empty package ``__init__.py`` files."""
    for path in TEST_FILES:
        text = subprocess.run(
            ["git", f"--git-dir={repo}", "show", f"{tag}:{path}"], check=True, capture_output=True, text=True
        ).stdout
        os.makedirs(os.path.join(out, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(out, path), "w") as f:
            f.write(text)
        folder = os.path.dirname(path)
        while folder:
            open(os.path.join(out, folder, "__init__.py"), "a").close()
            folder = os.path.dirname(folder)
    for name, text in (("tests/test_utils.py", TEST_UTILS), ("conftest.py", CONFTEST)):
        with open(os.path.join(out, name), "w") as f:
            f.write(text)


def summarize(results: list[dict]) -> tuple[collections.Counter, list[dict]]:
    counts: collections.Counter = collections.Counter()
    differences = []
    for r in results:
        if r["outcome"] in ("passed", "skipped"):
            counts[r["outcome"]] += 1
        elif any(d in r["message"] for d in DECLARED):
            counts["declared not carried"] += 1
        else:
            counts["other failures"] += 1
            differences.append(r)
    return counts, differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="upstream MONAI's git directory (a clone's .git, or bare)")
    parser.add_argument("--tag", default="1.5.0", help="upstream tag to take the tests from")
    parser.add_argument("--out", default="/tmp/monai-upstream-tests", help="scratch folder (outside this repository)")
    parser.add_argument("--pythonpath", default="", help="paths put before this fork (e.g. upstream, scikit-image)")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    if out == ROOT or out.startswith(ROOT + os.sep):
        raise SystemExit(f"--out must be outside this repository ({ROOT}): upstream's tests are not copied into it")
    repo = os.path.join(args.repo, ".git") if os.path.isdir(os.path.join(args.repo, ".git")) else args.repo
    extract(repo, args.tag, out)
    results_file = os.path.join(out, "results.json")
    env = dict(os.environ, UPSTREAM_TEST_RESULTS=results_file)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.pythonpath, ROOT) if p)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=out, env=env)
    with open(results_file) as f:
        counts, differences = summarize(json.load(f))
    print(dict(counts))
    for r in differences:
        print(f"{r['id']}: {r['message'][:200]}")


if __name__ == "__main__":
    main()
