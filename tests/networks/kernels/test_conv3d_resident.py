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
"""The resident-weight Gluon convolution, with slab and with patch loads, without and with a residual, against
float64 (Hopper GPUs only); its input checks, the replay of its barrier arithmetic and its sm_90 builds (on any
machine)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from parameterized import parameterized

import monai
from monai.networks.kernels import conv3d_resident
from monai.networks.kernels.conv3d import conv3x3x3_weights
from monai.networks.kernels.conv3d_resident import conv3x3x3_resident, resident_unavailable_reason

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REASON = resident_unavailable_reason(DEVICE)


def _input(g: torch.Generator, batch: int, channels: int, d: int, h: int, w: int, device: str = DEVICE):
    """48 random channels, NaN in the padding channels (a kernel that reads them fails the comparison),
    channels-last fp16."""
    x = torch.randn(batch, channels, d, h, w, generator=g)
    x[:, 48:] = float("nan")
    return x.half().to(device).contiguous(memory_format=torch.channels_last_3d)


def _residual(g: torch.Generator, batch: int, d: int, h: int, w: int, device: str = DEVICE) -> torch.Tensor:
    """A residual of the output's shape: 48 random channels of unit scale, the 16 padding channels zero,
    channels-last fp16."""
    r = torch.randn(batch, 64, d, h, w, generator=g)
    r[:, 48:] = 0.0
    return r.half().to(device).contiguous(memory_format=torch.channels_last_3d)


def _weights(g: torch.Generator, device: str = DEVICE) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``Conv3d`` weight [48, 48, 3, 3, 3] (outputs of unit scale) and its GEMM operand."""
    weight = (torch.randn(48, 48, 3, 3, 3, generator=g) / (27 * 48) ** 0.5).to(device)
    return weight, conv3x3x3_weights(weight, out_columns=64, planes=1)


class TestAvailability(unittest.TestCase):
    def test_reason_off_gpu(self):
        reason = resident_unavailable_reason("cpu")
        self.assertIsInstance(reason, str)
        self.assertGreater(len(reason), 10)

    def test_reason_without_gluon(self):
        with mock.patch.object(conv3d_resident, "_GLUON_MISSING", "Triton 3.4 has no usable Gluon"):
            self.assertEqual(resident_unavailable_reason("cuda"), "Triton 3.4 has no usable Gluon")

    def test_runs_on_hopper(self):
        if conv3d_resident._GLUON_MISSING is not None:
            self.skipTest(conv3d_resident._GLUON_MISSING)
        with mock.patch.object(conv3d_resident, "interpreting", return_value=False):
            with mock.patch.object(torch.cuda, "get_device_capability", return_value=(9, 0)):
                self.assertIsNone(resident_unavailable_reason("cuda"))
            with mock.patch.object(torch.cuda, "get_device_capability", return_value=(10, 0)):
                self.assertIn("compute capability 9.x", resident_unavailable_reason("cuda"))

    @parameterized.expand(
        [("3.6.0", True), ("3.7.1", True), ("3.7.0", True), ("3.8.0", False), ("3.9.0", False), ("3.10.0", False)]
        + [("3.6.0+git4ab2b1c", True), ("3.5.1", False), ("4.0.0rc1", False)]
    )
    def test_slab_table(self, version, slabs):
        # the measured releases: slabs on 3.6 and 3.7, patches elsewhere; a local build's suffix does not matter
        self.assertEqual(conv3d_resident.slab_loads_supported(version), slabs)

    def test_triton_older_than_3_6(self):
        if conv3d_resident._GLUON_MISSING is not None:
            self.skipTest(conv3d_resident._GLUON_MISSING)
        with mock.patch.object(conv3d_resident.triton, "__version__", "3.5.1"):
            self.assertIn("Triton 3.5.1 does not build", resident_unavailable_reason("cuda"))


class TestInputChecks(unittest.TestCase):
    """Bad inputs are refused before any GPU work, so these run on every machine (on the CPU the last check, the
    device's, refuses the good ones)."""

    def setUp(self):
        g = torch.Generator().manual_seed(0)
        self.x = _input(g, 1, 64, 3, 4, 8, device="cpu")
        _, self.w = _weights(g, device="cpu")

    def test_layout_and_dtype(self):
        with self.assertRaisesRegex(ValueError, "channels-last"):
            conv3x3x3_resident(self.x.contiguous(), self.w)
        with self.assertRaisesRegex(ValueError, "fp16 tensor, got torch.float32"):
            conv3x3x3_resident(self.x.float(), self.w)
        with self.assertRaisesRegex(ValueError, r"\[B, C, D, H, W\]"):
            conv3x3x3_resident(self.x[0], self.w)

    @parameterized.expand([(32,), (52,)])
    def test_channels(self, channels):
        x = torch.zeros(1, channels, 2, 3, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        with self.assertRaisesRegex(ValueError, f"got {channels} channels"):
            conv3x3x3_resident(x, self.w)

    def test_empty_and_misaligned(self):
        empty = torch.zeros(0, 64, 2, 3, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        with self.assertRaisesRegex(ValueError, "non-empty"):
            conv3x3x3_resident(empty, self.w)
        # channels-last storage starting one element (2 bytes) past an aligned address
        shifted = torch.zeros(1 + self.x.numel(), dtype=torch.float16)[1:].view(1, 3, 4, 8, 64).permute(0, 4, 1, 2, 3)
        self.assertTrue(shifted.is_contiguous(memory_format=torch.channels_last_3d))
        with self.assertRaisesRegex(ValueError, "16-byte aligned"):
            conv3x3x3_resident(shifted, self.w)

    @parameterized.expand(
        [
            ("two planes", dict(planes=2)),  # stacked for the Triton kernel's two planes per program
            ("64 input channels", dict(in_channels=64)),
            ("48 output columns", dict(out_columns=48)),
        ]
    )
    def test_weights(self, _, kwargs):
        weight = torch.randn(48, 48, 3, 3, 3)
        with self.assertRaisesRegex(ValueError, r"conv3x3x3_weights\(weight, out_columns=64, planes=1\)"):
            conv3x3x3_resident(self.x, conv3x3x3_weights(weight, **{"out_columns": 64, **kwargs}))

    def test_weights_dtype(self):
        with self.assertRaisesRegex(ValueError, "fp16 weights of shape"):
            conv3x3x3_resident(self.x, self.w.float())

    def test_programs(self):
        with self.assertRaisesRegex(ValueError, "programs >= 1"):
            conv3x3x3_resident(self.x, self.w, programs=0)

    def test_device(self):
        with self.assertRaisesRegex(ValueError, "cannot run on cpu: "):
            conv3x3x3_resident(self.x, self.w)
        # a good residual and output get as far as the device check
        with self.assertRaisesRegex(ValueError, "cannot run on cpu: "):
            conv3x3x3_resident(self.x, self.w, residual=torch.zeros_like(self.x), out=torch.empty_like(self.x))

    def test_channel_slices(self):
        # the halves of a 128-channel tensor (96 real) read, added and written in place: what the quartered
        # 96-channel convolution passes; the checks let them through to the device check
        wide = torch.zeros(1, 128, 3, 4, 8, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        with self.assertRaisesRegex(ValueError, "cannot run on cpu: "):
            conv3x3x3_resident(wide[:, 48:], self.w, residual=wide[:, 48:112], out=wide[:, 48:112])
        with self.assertRaisesRegex(ValueError, r"the output must have the output's shape \(1, 64, 3, 4, 8\)"):
            conv3x3x3_resident(self.x, self.w, out=wide[:, :48])
        with self.assertRaisesRegex(ValueError, "channels-last fp16 output, got torch.float16 with strides"):
            conv3x3x3_resident(self.x, self.w, out=torch.empty(1, 64, 3, 4, 8, dtype=torch.float16))
        odd = torch.zeros(1, 3, 4, 8, 68, dtype=torch.float16).permute(0, 4, 1, 2, 3)[:, :64]  # 136-byte rows
        with self.assertRaisesRegex(ValueError, r"its strides \(.*\) must be multiples of 8 elements"):
            conv3x3x3_resident(odd, self.w)

    @parameterized.expand(
        [
            ("48 channels", (1, 48, 3, 4, 8)),  # the output has 64 (48 + zero padding)
            ("other depth", (1, 64, 2, 4, 8)),
            ("other batch", (2, 64, 3, 4, 8)),
        ]
    )
    def test_residual_shape(self, _, shape):
        residual = torch.zeros(shape, dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
        with self.assertRaisesRegex(ValueError, r"the residual must have the output's shape \(1, 64, 3, 4, 8\)"):
            conv3x3x3_resident(self.x, self.w, residual=residual)

    def test_residual_layout_and_dtype(self):
        with self.assertRaisesRegex(ValueError, "channels-last fp16 residual, got torch.float16 with strides"):
            conv3x3x3_resident(self.x, self.w, residual=torch.zeros_like(self.x).contiguous())
        with self.assertRaisesRegex(ValueError, "channels-last fp16 residual, got torch.float32"):
            conv3x3x3_resident(self.x, self.w, residual=torch.zeros_like(self.x, dtype=torch.float32))

    def test_residual_device_and_alignment(self):
        elsewhere = torch.zeros_like(self.x, device="meta")
        with self.assertRaisesRegex(ValueError, "the residual is on meta, the input on cpu"):
            conv3x3x3_resident(self.x, self.w, residual=elsewhere)
        # channels-last storage starting one element (2 bytes) past an aligned address
        shifted = torch.zeros(1 + self.x.numel(), dtype=torch.float16)[1:].view(1, 3, 4, 8, 64).permute(0, 4, 1, 2, 3)
        with self.assertRaisesRegex(ValueError, "reads the residual by TMA, which needs 16-byte aligned storage"):
            conv3x3x3_resident(self.x, self.w, residual=shifted)


# every form of the kernel built for sm_90 in a fresh interpreter: by "slabs stats residual", the shared bytes and PTX,
# or the compiler's first error; under "version" the Triton that built them
_BUILD_SCRIPT = """
import json, sys
import triton
from monai.networks.kernels.conv3d_resident import compile_for_sm90
builds = {"version": triton.__version__}
for slabs in (False, True):
    for stats in (False, True):
        for residual in (False, True):
            try:
                c = compile_for_sm90(stats=stats, residual=residual, slabs=slabs)
                build = {"shared": c.metadata.shared, "ptx": c.asm["ptx"]}
            except Exception as e:
                build = {"error": (str(e).splitlines() or [type(e).__name__])[0]}
            builds[f"{slabs} {stats} {residual}"] = build
json.dump(builds, sys.stdout)
"""
_FORMS = [(s, st, r) for s in (False, True) for st in (False, True) for r in (False, True)]


def _build_all(triton_dir: str | None = None) -> dict:
    """:data:`_BUILD_SCRIPT`'s builds, with the Triton installed in ``triton_dir`` first on the path when given."""
    # without TRITON_INTERPRET: with it (the CPU test runs) Triton's own jit helpers, such as the reductions' combine
    # functions, are interpreter objects the compiler refuses (a cached build hid this)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(monai.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [triton_dir, root, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT], env=env, capture_output=True, text=True, cwd=root)
    if run.returncode:
        raise AssertionError(f"the sm_90 build script failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


@functools.lru_cache(maxsize=None)
def _sm90_builds() -> dict:
    """The sm_90 builds of every form with the installed Triton."""
    return _build_all()


def _check_builds(case: unittest.TestCase, builds: dict) -> None:
    """What must build on Triton ``builds["version"]``: the four patch forms always, the four slab forms exactly
    where :py:data:`~monai.networks.kernels.conv3d_resident.SLAB_TRITONS` says (a release that starts or stops
    building them fails here until the table is brought up to date), each within the shared memory of a block."""
    version = builds["version"]
    slabs = conv3d_resident.slab_loads_supported(version)
    for form in _FORMS:
        build = builds[" ".join(map(str, form))]
        if form[0] and not slabs:
            case.assertIn("error", build, f"slab loads build on Triton {version}: add it to SLAB_TRITONS")
        else:
            case.assertNotIn("error", build, f"Triton {version}, form (slabs, stats, residual) {form}: {build}")
            case.assertLessEqual(build["shared"], conv3d_resident.SHARED_LIMIT)


@unittest.skipUnless(conv3d_resident._GLUON_MISSING is None, f"no Gluon: {conv3d_resident._GLUON_MISSING}")
class TestBuildsPerVersion(unittest.TestCase):
    def test_installed_triton(self):
        import triton

        builds = _sm90_builds()
        self.assertEqual(builds["version"], triton.__version__)
        if conv3d_resident.triton_release() < conv3d_resident.OLDEST_TRITON:
            self.skipTest(f"Triton {triton.__version__} is older than the kernel (3.6); the fused path says so")
        _check_builds(self, builds)


# the oldest Triton the kernel supports (PyTorch 2.11's): CI builds every form with it as well as with the installed one
OLDEST_PIN = "3.6.0"
# what pip prints when it cannot reach the package index (then, and only then, the oldest-Triton build is skipped)
_NO_INDEX = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "ProxyError",
    "ConnectTimeoutError",
    "Could not fetch URL",
)


def _oldest_triton_dir() -> str:
    """A folder holding ``triton==OLDEST_PIN`` (no dependencies), installed by pip on first use and kept in
    ``$MONAI_TRITON_CACHE`` (default ``~/.cache/monai-tests``): a wheel of ~190 MB, ~640 MB installed."""
    cache = os.environ.get("MONAI_TRITON_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "monai-tests")
    target = os.path.join(cache, f"triton-{OLDEST_PIN}")
    if os.path.isdir(os.path.join(target, f"triton-{OLDEST_PIN}.dist-info")):
        return target
    os.makedirs(cache, exist_ok=True)
    partial = tempfile.mkdtemp(dir=cache, prefix=".triton-")  # renamed into place only once complete
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", partial, f"triton=={OLDEST_PIN}"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        text = run.stdout + run.stderr
        if any(marker in text for marker in _NO_INDEX):
            raise unittest.SkipTest(f"pip cannot reach the package index for triton=={OLDEST_PIN}: {text[-300:]}")
        raise AssertionError(f"pip did not install triton=={OLDEST_PIN}:\n{text[-3000:]}")
    try:
        os.replace(partial, target)
    except OSError:  # another run put it there first
        shutil.rmtree(partial, ignore_errors=True)
    return target


@pytest.mark.slow
@pytest.mark.network  # pip downloads the Triton wheel: only with ./runtests.sh --network
@unittest.skipUnless(conv3d_resident._GLUON_MISSING is None, f"no Gluon: {conv3d_resident._GLUON_MISSING}")
class TestOldestTriton(unittest.TestCase):
    """Every form built for sm_90 with the oldest supported Triton, installed beside the one in use (a subprocess
    imports it first): there the slab loads, the production form, must build."""

    def test_every_form_builds(self):
        builds = _build_all(_oldest_triton_dir())
        self.assertEqual(builds["version"], OLDEST_PIN)
        self.assertTrue(conv3d_resident.slab_loads_supported(OLDEST_PIN))
        _check_builds(self, builds)
        self.assertEqual([f for f in _FORMS if "error" in builds[" ".join(map(str, f))]], [])


@unittest.skipUnless(conv3d_resident._GLUON_MISSING is None, f"no Gluon: {conv3d_resident._GLUON_MISSING}")
class TestBuild(unittest.TestCase):
    """The production forms compile for compute capability 9.0 without a GPU: with patch loads everywhere, with
    slab loads where the installed Triton builds them (elsewhere TestBuildsPerVersion checks that it refuses them)."""

    builds: dict = {}

    @classmethod
    def setUpClass(cls):
        cls.builds = _sm90_builds()

    def _build(self, slabs: bool, stats: bool, residual: bool) -> dict:
        if slabs and not conv3d_resident.slab_loads_supported():
            self.skipTest(f"Triton {self.builds['version']} does not build the slab loads (SLAB_TRITONS)")
        build = self.builds[f"{slabs} {stats} {residual}"]
        self.assertNotIn("error", build)
        return build

    @parameterized.expand(_FORMS)
    def test_fits_shared_memory(self, slabs, stats, residual):
        build = self._build(slabs, stats, residual)
        self.assertLessEqual(build["shared"], conv3d_resident.SHARED_LIMIT)
        ptx = build["ptx"]
        self.assertIn("wgmma.mma_async", ptx)
        self.assertIn("cp.async.bulk.tensor", ptx)
        # the statistics are its only pointer stores: without them the stand-in pointers (the output) are not written
        self.assertEqual("st.global" in ptx, stats)
        # the residual comes by TMA into the staging buffer and is read back from there, never by pointer
        self.assertNotIn("ld.global", ptx)
        self.assertEqual("ldmatrix" in ptx, residual)

    @parameterized.expand([(s, st) for s in (False, True) for st in (False, True)])
    def test_residual_costs_no_shared_buffer(self, slabs, stats):
        # the residual shares the output's staging buffer: at most a barrier's alignment is added
        plain = self._build(slabs, stats, False)["shared"]
        self.assertLessEqual(self._build(slabs, stats, True)["shared"], plain + 16)


@unittest.skipUnless(conv3d_resident._GLUON_MISSING is None, f"no Gluon: {conv3d_resident._GLUON_MISSING}")
class TestSlabProtocol(unittest.TestCase):
    """The barrier arithmetic of the warp-specialized kernel, replayed in Python over a program's first tiles: each
    wait expects the phase its barrier is in, and each ring buffer is released by exactly two arrivals."""

    # (units per input plane: 3 slabs or 9 patches, ring buffers)
    @parameterized.expand([(3, 3), (3, 2), (3, 4), (3, 6), (9, 4), (9, 3), (9, 6), (9, 12)])
    def test_phases(self, unit, stages):
        group, uses = conv3d_resident._unit_group, conv3d_resident._ready_uses
        done = {}  # completions so far of each ready barrier (group * stages + buffer), and of each buffer's loads
        loads = {}
        for tile in range(4):
            for u in range(4 * unit):
                bar, buf = group(u, unit) * stages + u % stages, u % stages
                # the producer's wait: the buffer's use number counts the loads into it before this one
                self.assertEqual(tile * (4 * unit // stages) + u // stages, loads.get(buf, 0))
                loads[buf] = loads.get(buf, 0) + 1
                # the consumers' wait: the parity of the barrier's completions before this unit's
                phase = (tile * uses(u, unit, stages, False) + uses(u, unit, stages, True)) & 1
                self.assertEqual(phase, done.get(bar, 0) & 1)
                done[bar] = done.get(bar, 0) + 1

    @parameterized.expand([(3,), (9,)])
    def test_releases(self, unit):
        # plane 0 multiplies the units of input planes d0 - 1 ... d0 + 1, plane 1 those of d0 ... d0 + 2; a unit one
        # plane uses alone is released with count 2, a shared one with 1 by each: always the empty barrier's count
        for u in range(4 * unit):
            users = [plane for plane in (0, 1) if unit * plane <= u < unit * plane + 3 * unit]
            each = 1 if conv3d_resident._unit_group(u, unit) == 1 else 2
            self.assertEqual(each * len(users), 2, f"unit {u}")


@unittest.skipUnless(REASON is None, f"the resident-weight convolution does not run here: {REASON}")
class TestResidentConv(unittest.TestCase):
    """The kernel with its default loads (slabs where this Triton builds them, ``slabs=None``); TestResidentConvPatches
    runs the same cases with per-shift patches."""

    slabs: bool | None = None

    def setUp(self):
        self.conv = functools.partial(conv3x3x3_resident, slabs=self.slabs)

    # (batch, stored channels, D, H, W, programs): odd D (the last tile's second plane lies outside the volume),
    # H and W not multiples of the 8 x 16 tile, a volume smaller than one tile, a batch of 3; programs: None = one
    # per SM, else fewer (each program walks many tiles, so the look-ahead crosses tiles and samples); 48 stored
    # channels (no padding)
    @parameterized.expand(
        [
            (1, 64, 13, 20, 24, None),
            (3, 64, 7, 9, 17, 5),
            (1, 64, 1, 5, 7, None),
            (3, 64, 5, 3, 6, None),
            (2, 64, 4, 19, 33, 1),
            (3, 48, 6, 8, 16, 2),
            (2, 64, 16, 32, 48, None),
        ]
    )
    def test_against_float64(self, batch, channels, d, h, w, programs):
        g = torch.Generator().manual_seed(batch * d + h)
        x = _input(g, batch, channels, d, h, w)
        weight, gemm = _weights(g)
        torch.full((batch, 64, d, h, w), float("nan"), device=DEVICE)  # the output is likely to reuse this block
        y, (mean, var) = self.conv(x, gemm, stats=True, programs=programs)
        self.assertEqual(tuple(y.shape), (batch, 64, d, h, w))
        self.assertEqual(y.dtype, torch.float16)
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        ref = F.conv3d(x[:, :48].double(), weight.double(), padding=1)
        # every voxel: fp16 rounding of values of unit scale, fp32 accumulation
        torch.testing.assert_close(y[:, :48].double(), ref, rtol=2e-3, atol=2e-3)
        self.assertTrue(torch.equal(y[:, 48:], torch.zeros_like(y[:, 48:])))
        # the statistics are those of the output as stored (fp16), padding channels included
        ref_var, ref_mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        self.assertEqual(tuple(mean.shape), (batch, 64))
        self.assertEqual(tuple(var.shape), (batch, 64))
        torch.testing.assert_close(mean.double(), ref_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), ref_var, rtol=1e-4, atol=1e-9)
        # the statistics epilogue leaves the output as it was
        y_plain, none = self.conv(x, gemm, programs=programs)
        self.assertIsNone(none)
        self.assertTrue(torch.equal(y_plain, y))

    # (batch, stored channels, D, H, W, programs), as above: odd D (the last tile's second plane, and its residual
    # box, lie outside the volume), edge tiles, a volume smaller than one tile, one program (every residual load
    # waits for the store before it in the one staging buffer), a program per tile (its only tile's planes)
    @parameterized.expand(
        [
            (1, 64, 13, 20, 24, None),
            (3, 64, 7, 9, 17, 5),
            (1, 64, 1, 5, 7, None),
            (2, 64, 4, 19, 33, 1),
            (3, 48, 6, 8, 16, 2),
            (2, 64, 6, 16, 32, 24),
        ]
    )
    def test_residual_against_float64(self, batch, channels, d, h, w, programs):
        g = torch.Generator().manual_seed(batch * d + w)
        x = _input(g, batch, channels, d, h, w)
        residual = _residual(g, batch, d, h, w)
        weight, gemm = _weights(g)
        torch.full((batch, 64, d, h, w), float("nan"), device=DEVICE)  # the output is likely to reuse this block
        y, (mean, var) = self.conv(x, gemm, stats=True, programs=programs, residual=residual)
        self.assertEqual(tuple(y.shape), (batch, 64, d, h, w))
        self.assertTrue(y.is_contiguous(memory_format=torch.channels_last_3d))
        ref = F.conv3d(x[:, :48].double(), weight.double(), padding=1) + residual[:, :48].double()
        # values of scale ~1.4: fp16 rounding of the sum, fp32 accumulation
        torch.testing.assert_close(y[:, :48].double(), ref, rtol=2e-3, atol=3e-3)
        self.assertTrue(torch.equal(y[:, 48:], torch.zeros_like(y[:, 48:])))
        # the statistics are those of the sum as stored: against the float64 sum rounded to fp16, they differ only
        # where the kernel's fp32 sum rounds to the other neighbour
        ref_var, ref_mean = torch.var_mean(ref.half().double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(mean[:, :48].double(), ref_mean, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(var[:, :48].double(), ref_var, rtol=1e-3, atol=1e-4)
        # and exactly (up to fp32 summation) those of the output it returns, padding channels included (zeros)
        out_var, out_mean = torch.var_mean(y.double(), dim=(2, 3, 4), unbiased=False)
        torch.testing.assert_close(mean.double(), out_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var.double(), out_var, rtol=1e-4, atol=1e-9)
        self.assertTrue(bool((mean[:, 48:] == 0).all()) and bool((var[:, 48:] == 0).all()))
        # the same output without the statistics; the residual left as it was
        residual_before = residual.clone()
        y_plain, none = self.conv(x, gemm, programs=programs, residual=residual)
        self.assertIsNone(none)
        self.assertTrue(torch.equal(y_plain, y))
        self.assertTrue(torch.equal(residual, residual_before))

    def test_residual_is_added_once(self):
        # conv(x) + r - conv(x) = r up to the fp16 rounding of the sum: a residual dropped, added twice or taken
        # from another plane or tile (an mbarrier phase off by one) shows
        g = torch.Generator().manual_seed(7)
        x = _input(g, 2, 64, 9, 11, 21)
        _, gemm = _weights(g)
        residual = _residual(g, 2, 9, 11, 21)
        for programs in (None, 3):
            y_plain, _ = self.conv(x, gemm, programs=programs)
            y, _ = self.conv(x, gemm, programs=programs, residual=residual)
            diff = y.double() - y_plain.double()
            # two fp16 roundings of values up to ~8 (half an ulp each: 2e-3); a wrong residual is off by ~1
            torch.testing.assert_close(diff, residual.double(), rtol=0, atol=1e-2)

    @parameterized.expand([(None,), (3,)])
    def test_channel_slices(self, programs):
        # input channels 48-95 of a 128-channel tensor, a residual sliced from another and the output written into
        # channels 48-111 of a third (FusedConfig.resident_96's calls): the same values as contiguous operands,
        # and nothing outside the output slice touched
        g = torch.Generator().manual_seed(11)
        wide = torch.randn(2, 128, 5, 9, 17, generator=g).half().to(DEVICE)
        wide = wide.contiguous(memory_format=torch.channels_last_3d)
        residual = torch.randn(2, 128, 5, 9, 17, generator=g)
        residual[:, 96:] = 0
        residual = residual.half().to(DEVICE).contiguous(memory_format=torch.channels_last_3d)
        _, gemm = _weights(g)
        expected, (mean, var) = self.conv(
            wide[:, 48:96].contiguous(memory_format=torch.channels_last_3d),
            gemm,
            stats=True,
            programs=programs,
            residual=residual[:, 48:112].contiguous(memory_format=torch.channels_last_3d),
        )
        out = torch.full_like(wide, 7.0)
        y, (mean_s, var_s) = self.conv(
            wide[:, 48:], gemm, stats=True, programs=programs, residual=residual[:, 48:112], out=out[:, 48:112]
        )
        self.assertEqual(y.data_ptr(), out[:, 48:112].data_ptr())
        self.assertTrue(torch.equal(out[:, 48:112], expected))
        self.assertTrue(bool((out[:, :48] == 7).all()) and bool((out[:, 112:] == 7).all()))
        self.assertTrue(torch.equal(mean_s, mean) and torch.equal(var_s, var))

    def test_residual_elsewhere(self):
        g = torch.Generator().manual_seed(2)
        _, gemm = _weights(g)
        with self.assertRaisesRegex(ValueError, "the residual is on cpu"):
            self.conv(_input(g, 1, 64, 2, 3, 4), gemm, residual=_residual(g, 1, 2, 3, 4, device="cpu"))

    def test_weights_elsewhere(self):
        g = torch.Generator().manual_seed(1)
        _, gemm = _weights(g, device="cpu")
        with self.assertRaisesRegex(ValueError, "the weights are on cpu"):
            self.conv(_input(g, 1, 64, 2, 3, 4), gemm)


class TestResidentConvPatches(TestResidentConv):
    slabs = False


if __name__ == "__main__":
    unittest.main()
