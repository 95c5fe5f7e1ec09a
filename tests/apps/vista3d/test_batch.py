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

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

import nibabel as nib
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from parameterized import parameterized

from monai.apps.vista3d.batch import workers as batch_workers
from monai.apps.vista3d.batch.distributed import shard_by_size
from monai.apps.vista3d.batch.inputs import collect_inputs, plan_outputs
from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.workers import AsyncSaver
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.config import (
    BatchOptions,
    PipelineOptions,
    SettingError,
    TorchrunEnv,
    resolve_device,
)
from monai.apps.vista3d.core.job import SegmentJob
from monai.apps.vista3d.errors import (
    OutputCollisionError,
    Vista3DOutputError,
)
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.paths import output_path
from tests.apps.vista3d.stub_vista import StubVista, stub_job

SHAPES = [(24, 24, 24), (32, 24, 16), (16, 16, 16), (28, 20, 24), (24, 16, 16)]


def tiny_segment(image, geometry):
    """A stand-in network: label 1 for soft tissue, 21 for bone, 20 for lung; 'windows' = Z slices."""
    x = image[0]
    labels = torch.zeros_like(x, dtype=torch.uint8)
    labels[(x > 0) & (x < 200)] = 1
    labels[x >= 200] = 21
    labels[(x < -500) & (x > -950)] = 20
    return labels, {"windows": int(x.shape[2])}


def _make_inputs(folder: pathlib.Path, corrupt: bool = True) -> list[pathlib.Path]:
    paths = [write_phantom(folder / f"ct{i}.nii.gz", s, seed=i) for i, s in enumerate(SHAPES)]
    if corrupt:
        raw = paths[0].read_bytes()
        bad = folder / "broken.nii.gz"
        bad.write_bytes(raw[: len(raw) // 2])
        paths.insert(2, bad)
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, inputs: list[str], out: str, codes: dict) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    codes[rank] = run_batch(inputs, out, tiny_segment, backend="gloo").exit_code


class TestShard(unittest.TestCase):
    @parameterized.expand([([5, 1, 1, 1, 1, 1], 2), ([3, 3, 2, 2, 2], 2), (list(range(1, 20)), 4), ([7], 3)])
    def test_balanced_once(self, sizes, world):
        plan = shard_by_size(sizes, world)
        self.assertEqual(plan, shard_by_size(sizes, world))  # deterministic
        self.assertEqual(sorted(i for p in plan for i in p), list(range(len(sizes))))
        loads = [sum(sizes[i] for i in p) for p in plan]
        # greedy largest-first: no rank exceeds the best possible by more than the largest single item
        self.assertLessEqual(max(loads) - min(loads), max(sizes))
        if sizes == [5, 1, 1, 1, 1, 1]:
            self.assertEqual(loads, [5, 5])  # by volume, not by count

    def test_inputs_and_names(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            paths = _make_inputs(d, corrupt=False)
            (d / "list.txt").write_text("# two images\nct0.nii.gz\n\n" + str(paths[1]) + "\n")
            self.assertEqual(collect_inputs(d / "list.txt"), paths[:2])
            self.assertEqual(collect_inputs(d), paths)
        self.assertEqual(output_path("/a/b/ct_7.nii.gz", "/o"), pathlib.Path("/o/ct_7/ct_7_trans.nii.gz"))

    @parameterized.expand([("cuda", 1, "cuda:1"), ("cuda:0", 1, "cuda:0"), ("cpu", 3, "cpu"),
                           (torch.device("cuda"), 2, "cuda:2")])
    def test_device_of_rank(self, device, local_rank, expected):
        # a bare "cuda" gets this rank's index: torch.cuda.set_device refuses a device without one
        with mock.patch("torch.cuda.is_available", lambda: True), mock.patch("torch.cuda.device_count", lambda: 4), \
                mock.patch.dict(os.environ, {"LOCAL_RANK": str(local_rank)}):
            self.assertEqual(resolve_device(device), torch.device(expected))
        self.assertEqual(resolve_device(None).type, "cuda" if torch.cuda.is_available() else "cpu")

    @parameterized.expand([({}, (1, 0, None, 0)), ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, (4, 3, 1, 1))])
    def test_torchrun_env(self, env, expected):
        with mock.patch.dict(os.environ, env, clear=False):
            for k in {"WORLD_SIZE", "RANK", "LOCAL_RANK"} - set(env):
                os.environ.pop(k, None)
            got = TorchrunEnv.read()
            self.assertEqual((got.world_size, got.rank, got.local_rank, got.gpu), expected)

    @parameterized.expand([("mps",), ("tpu",), ("gpu0",)])
    def test_unsupported_device(self, device):
        with self.assertRaisesRegex(SettingError, "use 'cuda', 'cuda:N' or 'cpu'"):
            resolve_device(device)

    def test_cuda_missing(self):
        with mock.patch("torch.cuda.is_available", lambda: False):
            with self.assertRaisesRegex(SettingError, "CUDA is not available"):
                resolve_device("cuda")


def _patient_folders(root: pathlib.Path) -> None:
    """``root/cts``: two patients' ct.nii.gz, one image at the top, a hidden copy and a text file."""
    for name in ("p1/ct.nii.gz", "p2/ct.nii.gz", "top.nii.gz", ".hidden/ct.nii.gz"):
        (root / "cts" / name).parent.mkdir(parents=True, exist_ok=True)
        write_phantom(root / "cts" / name, (8, 8, 8), seed=0)
    (root / "cts" / "notes.txt").write_text("not an image")


class TestOutputsAndVolumes(unittest.TestCase):
    @parameterized.expand([
        ("folder_mirrored", ["cts"], ["o/p1/ct/ct_trans.nii.gz", "o/p2/ct/ct_trans.nii.gz", "o/top/top_trans.nii.gz"]),
        ("file_and_its_folder", ["cts/top.nii.gz", "cts"], ["o/top/top_trans.nii.gz", "o/p1/ct/ct_trans.nii.gz",
                                                            "o/p2/ct/ct_trans.nii.gz"]),
        ("same_file_twice", ["cts/p1/ct.nii.gz", "cts/p1/../p1/ct.nii.gz"], ["o/ct/ct_trans.nii.gz"]),
    ])
    def test_outputs_unique_per_input(self, _, inputs, expected):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            _patient_folders(d)
            items = [d / i for i in inputs]
            plan = plan_outputs(items, d / "o")
            self.assertEqual(sorted(str(o.relative_to(d)) for _, o in plan), sorted(expected))
            self.assertEqual(run_batch(items, d / "o", tiny_segment).exit_code, 0)
            self.assertEqual(sorted(str(p.relative_to(d)) for p in (d / "o").rglob("*.nii.gz")), sorted(expected))

    @parameterized.expand([("two_folders", ["cts/p1", "cts/p2"]), ("files", ["cts/p1/ct.nii.gz", "cts/p2/ct.nii.gz"])])
    def test_shared_output_refused_before_any_work(self, _, inputs):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            _patient_folders(d)
            items = [d / i for i in inputs]
            msg = "would both be written to .*ct_trans.nii.gz; nothing was started. Give their common folder"
            with self.assertRaisesRegex(OutputCollisionError, msg):
                plan_outputs(items, d / "o")
            with self.assertRaisesRegex(OutputCollisionError, msg):
                run_batch(items, d / "o", tiny_segment)
            self.assertFalse((d / "o").exists())

    def test_volume_index_applies_to_4d_only(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            three = write_phantom(d / "three.nii.gz", (10, 10, 8), seed=0)
            img = nib.load(three)
            vols = np.stack([np.asanyarray(img.dataobj), np.asanyarray(img.dataobj) + 100], -1)
            nib.save(nib.Nifti1Image(vols, img.affine), d / "four.nii.gz")
            self.assertEqual(run_batch([three, d / "four.nii.gz"], d / "o", tiny_segment, volume_index=1).exit_code, 0)
            expected, _ = tiny_segment(torch.from_numpy(vols[..., 1].astype(np.float32))[None], None)
            saved = nib.load(d / "o" / "four" / "four_trans.nii.gz").get_fdata()
            np.testing.assert_array_equal(saved, expected.numpy())
            self.assertEqual(run_batch([d / "four.nii.gz"], d / "o2", tiny_segment, volume_index=2).exit_code, 1)

    def test_failed_save_leaves_no_folder(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            (d / "cts" / "p1").mkdir(parents=True)
            src = write_phantom(d / "cts" / "p1" / "ct.nii.gz", (10, 10, 8), seed=0)

            def broken_save(*args, **kwargs):
                pathlib.Path(args[2]).parent.mkdir(parents=True)
                raise Vista3DOutputError("disk full (simulated)")

            with mock.patch.object(batch_workers, "save_label_map", broken_save):
                self.assertEqual(run_batch([d / "cts"], d / "o", tiny_segment).exit_code, 1)
            self.assertEqual(sorted(p.name for p in (d / "o").rglob("*")), ["summary.json"])
            self.assertTrue(src.is_file())


class TestBatchSingleProcess(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = pathlib.Path(self._tmp.name)
        self.inputs = _make_inputs(self.tmp)

    def tearDown(self):
        self._tmp.cleanup()

    def test_options_object_and_keywords_agree(self):
        good = [p for p in self.inputs if "broken" not in p.name][:2]
        opts = BatchOptions(postfix="seg", volume_index=None)
        by_object = run_batch(good, self.tmp / "a", tiny_segment, options=opts)
        by_keyword = run_batch(good, self.tmp / "b", tiny_segment, postfix="seg")
        self.assertEqual([r["status"] for r in by_object.records], ["done", "done"])
        self.assertEqual([pathlib.Path(r["output"]).name for r in by_object.records],
                         [pathlib.Path(r["output"]).name for r in by_keyword.records])
        self.assertTrue(all(r["output"].endswith("_seg.nii.gz") for r in by_object.records))
        # a keyword overrides the object's field; an unknown keyword is refused before any work
        again = run_batch(good, self.tmp / "a", tiny_segment, options=opts, postfix="trans")
        self.assertEqual(again.done, 2)
        with self.assertRaises(TypeError):
            run_batch(good, self.tmp / "c", tiny_segment, no_such_setting=1)
        self.assertFalse((self.tmp / "c").exists())

    def test_failure_isolated_and_restart(self):
        out = self.tmp / "out"
        code = run_batch(self.inputs, out, tiny_segment).exit_code
        self.assertEqual(code, 1)
        summary = json.loads((out / "summary.json").read_text())
        status = {pathlib.Path(r["image"]).name: r["status"] for r in summary["per_image"]}
        self.assertEqual(status.pop("broken.nii.gz"), "failed")
        self.assertEqual(set(status.values()), {"done"})
        bad = [r for r in summary["per_image"] if r["status"] == "failed"][0]
        self.assertIn("truncated", bad["error"])
        self.assertEqual((summary["images"], summary["done"], summary["failed"]), (6, 5, 1))
        for p, shape in zip([p for p in self.inputs if "broken" not in p.name], SHAPES):
            result = nib.load(output_path(p, out))
            self.assertEqual(result.shape, shape)
            np.testing.assert_array_equal(result.affine, nib.load(p).affine)
            expected, _ = tiny_segment(torch.from_numpy(nib.load(p).get_fdata().astype(np.float32))[None], None)
            np.testing.assert_array_equal(result.get_fdata(), expected.numpy())
        # restart after a partial run: only what is missing is redone
        output_path(self.inputs[1], out).unlink()
        self.assertEqual(run_batch(self.inputs, out, tiny_segment).exit_code, 1)
        status = {pathlib.Path(r["image"]).name: r["status"] for r in json.loads((out / "summary.json").read_text())["per_image"]}
        # the images the first run did stay done in the summary the restart writes (issue 34)
        self.assertEqual(status, {"ct0.nii.gz": "done", "ct1.nii.gz": "done", "broken.nii.gz": "failed",
                                  "ct2.nii.gz": "done", "ct3.nii.gz": "done", "ct4.nii.gz": "done"})
        earlier = {pathlib.Path(r["image"]).name for r in json.loads((out / "summary.json").read_text())["per_image"]
                   if r.get("earlier_run")}
        self.assertEqual(earlier, {"ct0.nii.gz", "ct2.nii.gz", "ct3.nii.gz", "ct4.nii.gz"})
        good = [p for p in self.inputs if "broken" not in p.name]
        self.assertEqual(run_batch(good, out, tiny_segment, overwrite=True, summary_path=self.tmp / "s.json").exit_code, 0)
        self.assertEqual(json.loads((self.tmp / "s.json").read_text())["done"], 5)

    def test_segment_errors_isolated(self):
        def flaky(image, geometry):
            if image.shape[-1] == 24:
                raise RuntimeError("CUDA out of memory (simulated)")
            return tiny_segment(image, geometry)[0]

        good = [p for p in self.inputs if "broken" not in p.name]
        self.assertEqual(run_batch(good, self.tmp / "o", flaky).exit_code, 1)
        per = json.loads((self.tmp / "o" / "summary.json").read_text())["per_image"]
        self.assertEqual([r["status"] for r in per], ["failed", "done", "done", "failed", "done"])
        self.assertIn("RuntimeError: CUDA out of memory", per[0]["error"])

    def test_default_is_the_pipeline(self):
        from monai.apps.vista3d.core.pipeline import Vista3DPipeline

        good = [p for p in self.inputs if "broken" not in p.name][:2]
        kw = {"network": StubVista({1: 60.0, 20: -850.0}), "roi_size": (32, 32, 32), "output_dtype": "uint8"}
        code = run_batch(good, self.tmp / "p", stub_job([1, 20], **kw)).exit_code
        self.assertEqual(code, 0)
        per = json.loads((self.tmp / "p" / "summary.json").read_text())["per_image"]
        direct = Vista3DPipeline(device="cpu", **kw)
        for r, p in zip(per, good):
            self.assertGreater(r["windows"], 0)
            self.assertIn("inference", r["stages"])
            saved = nib.load(r["output"])
            self.assertEqual(saved.get_data_dtype(), np.uint8)
            np.testing.assert_array_equal(np.asanyarray(saved.dataobj), direct(str(p), classes=[1, 20]).numpy())


class TestOnePath(unittest.TestCase):
    """The command line, run_batch and segment_file read, segment and save through the pipeline's code."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.inputs = _make_inputs(self.tmp, corrupt=False)[:2]
        self.kw = {"network": StubVista({1: 60.0, 20: -850.0}), "roi_size": (32, 32, 32)}

    def _spy_policy(self):
        """Count the load policy's uses (per device) while keeping what it decides."""
        from monai.apps.vista3d.io import load_policy

        calls, real = [], load_policy.load_options

        def spy(device):
            calls.append(torch.device(device).type)
            return real(device)

        return calls, mock.patch.object(load_policy, "load_options", spy)

    def test_every_entry_reads_through_the_load_policy(self):
        from monai.apps.vista3d.cli.main import main
        from monai.apps.vista3d.core.pipeline import Vista3DPipeline

        calls, patch = self._spy_policy()
        with patch:
            result = run_batch(self.inputs, self.tmp / "a", stub_job([1], **self.kw))
            self.assertEqual((result.done, calls), (2, ["cpu", "cpu"]))
            Vista3DPipeline(device="cpu", **self.kw).segment_file(self.inputs[0], self.tmp / "b", classes=[1])
            self.assertEqual(len(calls), 3)
            argv = ["-i", self.inputs[0], "-o", self.tmp / "c", "--embed-dim", "8", "--roi-size", "32", "--classes",
                    "1", "--device", "cpu", "--quiet"]
            with mock.patch("sys.stderr"):
                self.assertEqual(main([str(a) for a in argv]), 0)
            self.assertEqual(len(calls), 4)  # the command line's one image, read by the pipeline's policy

    def test_result_records_and_totals(self):
        out = self.tmp / "o"
        first = run_batch(self.inputs, out, tiny_segment)
        self.assertEqual((first.done, first.skipped, first.failed, first.exit_code), (2, 0, 0, 0))
        self.assertEqual(first.summary_path, out / "summary.json")
        self.assertEqual(json.loads(first.summary_path.read_text()), json.loads(json.dumps(first.summary())))
        self.assertEqual([r["image"] for r in first.records], [str(p) for p in self.inputs])
        self.assertTrue(all(r["seconds"] > 0 and r["windows"] for r in first.records))
        again = run_batch(self.inputs + [self.tmp / "missing.nii.gz"], out, tiny_segment)
        self.assertEqual((again.done, again.skipped, again.failed, again.exit_code), (0, 2, 1, 1))
        self.assertIn("no such file", again.records[-1]["error"])
        self.assertEqual(again.summary()["images"], 3)

    def test_bad_checkpoint_stops_before_any_image(self):
        from monai.apps.vista3d.errors import CheckpointError

        bad = self.tmp / "model.pt"
        bad.write_text("model weights: see the bundle\n")
        job = SegmentJob([1], PipelineOptions(roi_size=32), "cpu", weights=bad, network_kwargs={"encoder_embed_dim": 8})
        with self.assertRaisesRegex(CheckpointError, "is a text file, not a checkpoint"):
            run_batch(self.inputs, self.tmp / "o", job)
        self.assertFalse((self.tmp / "o").exists())

    def test_each_image_reported_when_its_file_is_written(self):
        reported = []
        first_written = threading.Event()

        def on_image(rec):
            reported.append((rec["image"], pathlib.Path(rec["output"]).is_file()))
            first_written.set()

        waited = []

        def segment(image, geometry):
            if waited == [] and len(segment.calls) == 1:
                # the second image: its segmentation waits for the first image's report, which must not wait
                # for the second image to finish
                waited.append(first_written.wait(30))
            segment.calls.append(geometry)
            return tiny_segment(image, geometry)

        segment.calls = []
        result = run_batch(self.inputs, self.tmp / "o", segment, on_image=on_image)
        self.assertEqual(waited, [True], "the first image was not reported while the second was segmented")
        self.assertEqual(reported, [(str(p), True) for p in self.inputs])
        self.assertEqual(result.done, 2)


@pytest.mark.slow
class TestBatchTwoProcesses(unittest.TestCase):
    def test_gloo_two_ranks_equal_single(self):
        with tempfile.TemporaryDirectory() as d:
            d = pathlib.Path(d)
            inputs = [str(p) for p in _make_inputs(d)]
            self.assertEqual(run_batch(inputs, d / "single", tiny_segment).exit_code, 1)
            codes = mp.Manager().dict()
            mp.spawn(_worker, args=(2, _free_port(), inputs, str(d / "multi"), codes), nprocs=2, join=True)
            self.assertEqual(dict(codes), {0: 1, 1: 1})  # every rank knows one image failed
            summary = json.loads((d / "multi" / "summary.json").read_text())
            self.assertEqual(summary["world_size"], 2)
            per = summary["per_image"]
            self.assertEqual(sorted(r["image"] for r in per), sorted(inputs))  # each image exactly once
            self.assertEqual({r["rank"] for r in per}, {0, 1})
            for r in per:
                if r["status"] == "done":
                    single = output_path(r["image"], d / "single")
                    self.assertEqual(pathlib.Path(r["output"]).read_bytes(), single.read_bytes())
            self.assertEqual([r["status"] for r in per].count("failed"), 1)
            self.assertEqual(sum(1 for _ in (d / "multi").glob("*/*_trans.nii.gz")), 5)


class TestAsyncSaver(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = pathlib.Path(self._tmp.name)
        self.src = write_phantom(self.tmp / "in.nii.gz", (24, 20, 16), seed=1)
        self.image, self.geom = load_image(self.src)

    def test_saves_all_in_order(self):
        order = []
        real = batch_workers.save_label_map

        def slow_save(labels, geom, path, **kw):
            order.append(pathlib.Path(path).name)
            return real(labels, geom, path, **kw)

        with mock.patch.object(batch_workers, "save_label_map", side_effect=slow_save):
            with AsyncSaver(max_pending=2, dtype="uint8") as saver:
                futs = [saver.submit(self.image[0] > i * 10, self.geom, self.tmp / f"o{i}.nii.gz") for i in range(4)]
        self.assertEqual(order, [f"o{i}.nii.gz" for i in range(4)])
        for i, f in enumerate(futs):
            self.assertEqual(f.result(), self.tmp / f"o{i}.nii.gz")
            back = nib.load(f.result())
            self.assertEqual(back.get_data_dtype(), np.uint8)
            np.testing.assert_array_equal(np.asanyarray(back.dataobj), (self.image[0] > i * 10).numpy())

    def test_errors_propagate_and_others_saved(self):
        saver = AsyncSaver()
        ok1 = saver.submit(self.image[0] > 0, self.geom, self.tmp / "a.nii.gz")
        bad = saver.submit(self.image[0] > 0, self.geom, self.src)  # the input: refused
        ok2 = saver.submit(self.image[0] > 0, self.geom, self.tmp / "b.nii.gz")
        with self.assertRaisesRegex(Vista3DOutputError, "is the input"):
            saver.close()
        self.assertIsInstance(bad.exception(), Vista3DOutputError)
        self.assertTrue(ok1.result().exists() and ok2.result().exists())
        with self.assertRaises(RuntimeError):
            saver.submit(self.image[0], self.geom, self.tmp / "c.nii.gz")

    def test_body_exception_not_masked(self):
        with self.assertRaisesRegex(KeyError, "boom"):
            with AsyncSaver() as saver:
                saver.submit(self.image[0] > 0, self.geom, self.tmp / "a.nii.gz")
                saver.submit(self.image[0] > 0, self.geom, self.src)
                raise KeyError("boom")
        self.assertTrue((self.tmp / "a.nii.gz").exists())  # pending saves finished anyway

    def test_bounded_and_saved_at_exit(self):
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "from monai.apps.vista3d.batch.workers import AsyncSaver\n"
            "from monai.apps.vista3d.io.nifti import load_image\n"
            "img, g = load_image(%r)\n"
            "s = AsyncSaver()\n"
            "for i in range(3): s.submit(img > 0, g, %r + f'/x{i}.nii.gz')\n"
            "s.submit(img > 0, g, %r)\n"  # fails: reported at exit, others still written
        ) % (str(pathlib.Path(__file__).resolve().parents[3]), str(self.src), str(self.tmp), str(self.src))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("background save failed", r.stderr)
        self.assertEqual(sorted(p.name for p in self.tmp.glob("x*.nii.gz")), ["x0.nii.gz", "x1.nii.gz", "x2.nii.gz"])


if __name__ == "__main__":
    unittest.main()
