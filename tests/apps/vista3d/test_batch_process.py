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
"""The device is decided once where a job enters; run_batch leaves the process as it found it."""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import tempfile
import unittest
from contextlib import redirect_stderr
from unittest import mock

import torch
from parameterized import parameterized

from monai.apps.vista3d.batch import run as batch
from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.cli.main import main
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import TorchrunEnv, resolve_device
from monai.apps.vista3d.errors import Vista3DInputError
from tests.apps.vista3d.stub_vista import StubVista, stub_job

TORCHRUN_RANK_1 = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}


def _forbidden(*_, **__):
    raise AssertionError("CUDA process state touched")


def _one_gpu():
    """A machine with one GPU, as CUDA would report it, not used yet by this process (whatever tests ran before in
    it); setting the current device fails the test."""
    return [mock.patch("torch.cuda.is_available", lambda: True), mock.patch("torch.cuda.device_count", lambda: 1),
            mock.patch("torch.cuda.is_initialized", lambda: False),
            mock.patch("torch.cuda.set_device", _forbidden), mock.patch("torch.cuda.device", _forbidden),
            mock.patch("torch.cuda.Stream", _forbidden), mock.patch("torch.cuda.current_stream", _forbidden)]



@contextlib.contextmanager
def _torchrun(env: TorchrunEnv):
    """This process's environment as torchrun would set it for ``env`` (the variables it lacks removed)."""
    values = {"WORLD_SIZE": env.world_size, "RANK": env.rank, "LOCAL_RANK": env.local_rank,
              "LOCAL_WORLD_SIZE": env.local_world_size}
    with mock.patch.dict(os.environ, {k: str(v) for k, v in values.items() if v is not None}):
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
        yield

class TestRankDevice(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.image = write_phantom(self.tmp / "ct.nii.gz", (24, 24, 24), seed=0)
        for p in _one_gpu():
            p.start()
            self.addCleanup(p.stop)

    @parameterized.expand([("cuda", TorchrunEnv(2, 1, 1, 2), "torchrun started 2 ranks on this node but it has 1 GPUs"),
                           ("cuda", TorchrunEnv(1, 0, 1), "torchrun started 2 ranks on this node but it has 1 GPUs"),
                           (None, TorchrunEnv(4, 3, 3, 4), "torchrun started 4 ranks on this node but it has 1 GPUs"),
                           ("cuda:1", TorchrunEnv(), "device 'cuda:1' does not exist: this machine has 1 GPUs")])
    def test_missing_gpu_refused(self, device, env, message):
        with self.assertRaises(Vista3DInputError) as ctx, _torchrun(env):
            resolve_device(device)
        self.assertIn(message, str(ctx.exception))
        self.assertNotIn("\n", str(ctx.exception))

    @parameterized.expand([("cpu", TorchrunEnv(2, 1, 1, 2), "cpu"), ("cuda", TorchrunEnv(2, 0, 0, 2), "cuda:0"),
                           ("cuda:0", TorchrunEnv(2, 1, 1, 2), "cuda:0")])
    def test_device_of_this_rank(self, device, env, expected):
        with _torchrun(env):
            self.assertEqual(resolve_device(device), torch.device(expected))

    @parameterized.expand([("fresh process", False), ("CUDA used before", True)])
    def test_cpu_rank_never_sets_a_gpu(self, _, initialized):
        # rank 1 of two on a one-GPU machine, asked to run on the CPU: no CUDA state is touched, also in a process
        # that used the GPU before (under pytest-xdist, an earlier test of the same worker; the stage timers then
        # waited on the current GPU stream of a CPU job)
        with mock.patch.dict(os.environ, TORCHRUN_RANK_1), mock.patch("torch.cuda.is_initialized", lambda: initialized):
            result = run_batch([self.image], self.tmp / "o", stub_job([1], StubVista({1: 60.0})))
        self.assertEqual(result.done, 1, result.records)

    def test_process_group_binds_no_gpu(self):
        # torchrun with 2 ranks and --device cpu on a one-GPU machine: rank 1 starts its group without a GPU
        started = []
        env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
        with mock.patch.dict(os.environ, env), mock.patch("torch.distributed.is_initialized", lambda: bool(started)), \
                mock.patch("torch.distributed.init_process_group", lambda backend, **kw: started.append(backend)), \
                mock.patch("torch.distributed.get_rank", lambda: 1), \
                mock.patch("torch.distributed.get_world_size", lambda: 2), \
                mock.patch("torch.distributed.destroy_process_group", lambda: started.clear()):
            with batch.dist_context() as (rank, world, local):
                self.assertEqual((rank, world, local, started), (1, 2, 1, ["gloo"]))

    def test_cli_refuses_a_rank_without_a_gpu(self):
        argv = ["-i", str(self.image), "-o", str(self.tmp / "c"), "--embed-dim", "8", "--roi-size", "32",
                "--device", "cuda", "--quiet"]
        err = io.StringIO()
        with mock.patch.dict(os.environ, TORCHRUN_RANK_1), redirect_stderr(err):
            self.assertEqual(main(argv), 2)
        self.assertIn("torchrun started 2 ranks on this node but it has 1 GPUs", err.getvalue())
        self.assertFalse((self.tmp / "c").exists())


class TestNoProcessWideChanges(unittest.TestCase):
    def test_run_batch_leaves_the_process_as_it_was(self):
        def state():
            mask = os.umask(0o022)
            os.umask(mask)
            flags = (torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
            current = torch.cuda.current_device() if torch.cuda.is_available() else None
            return mask, torch.get_rng_state().clone(), flags, current, torch.get_num_threads()

        with tempfile.TemporaryDirectory() as tmp:
            image = write_phantom(pathlib.Path(tmp) / "ct.nii.gz", (24, 24, 24), seed=0)
            before = state()
            result = run_batch([image], pathlib.Path(tmp) / "o", stub_job([1], StubVista({1: 60.0}), sw_batch_size="auto"))
            after = state()
        self.assertEqual(result.done, 1, result.records)
        self.assertEqual(before[0], after[0])
        self.assertTrue(torch.equal(before[1], after[1]))
        self.assertEqual(before[2:], after[2:])


if __name__ == "__main__":
    unittest.main()
