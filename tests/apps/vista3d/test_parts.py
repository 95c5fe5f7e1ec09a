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

import contextlib
import errno
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from collections import Counter
from pathlib import Path
from unittest import mock

import pytest
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.claims import (
    OutputClaims,
    OutputTaken,
    claim,
    claim_summary,
)
from monai.apps.vista3d.batch.parts import check_part, parse_part, split_parts
from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.summary_merge import format_summary, merge_summaries
from monai.apps.vista3d.cli.main import main
from monai.apps.vista3d.cli.phantom import write_phantom
from monai.apps.vista3d.errors import Vista3DInputError
from monai.apps.vista3d.io.paths import lock_path, part_summary_name
from tests.subprocess_env import child_env

ROOT = Path(__file__).resolve().parents[3]
# a second process that claims the path given on its command line, says so, and holds the claim until stdin closes;
HOLDER = (
    "import sys\nfrom monai.apps.vista3d.batch.claims import claim\n"
    "c = claim(sys.argv[1])\n"
    "print('held' if c is not None else 'busy', flush=True)\nsys.stdin.read()\n"
)


class Holder:
    """Another process holding a claim on ``path`` (as a part running elsewhere would)."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, env=child_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.state = self.proc.stdout.readline().strip()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # no clean-up runs: only the operating system drops the lock
        self.proc.wait(timeout=30)
        self.proc.stdin.close()
        self.proc.stdout.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()


class TestPartArgument(unittest.TestCase):
    @parameterized.expand([("0/1", (0, 1)), ("3/4", (3, 4)), (" 2 / 8 ", (2, 8)), ("0/1000", (0, 1000))])
    def test_valid(self, text, expected):
        self.assertEqual(parse_part(text), expected)

    @parameterized.expand([
        ("4/4", "parts are numbered from 0, so I must be in 0..3"), ("5/4", "I must be in 0..3"),
        ("0/0", "N must be 1 or more"),
        ("-1/4", "must be I/N"), ("1", "must be I/N"), ("a/b", "must be I/N"), ("1/2/3", "must be I/N"),
    ])
    def test_invalid(self, text, msg):
        with self.assertRaisesRegex(ValueError, msg):
            parse_part(text)

    @parameterized.expand([((1.5, 4),), (("1", "4"),), ((1, 2, 3),), (None,)])
    def test_not_two_integers(self, part):
        with self.assertRaisesRegex(ValueError, "two integers"):
            check_part(part)

    def test_summary_name(self):
        self.assertEqual(part_summary_name(check_part((2, 8))), "summary.part-2-of-8.json")
        with self.assertRaisesRegex(ValueError, "does not exist"):
            check_part((8, 8))


class TestSplit(unittest.TestCase):
    @parameterized.expand([(40, 4), (7, 3), (3, 5), (1, 1), (0, 2)])
    def test_same_split_in_any_order(self, n_items, n_parts):
        rng = random.Random(n_items)
        keys = [f"p{k:03d}/ct/ct_trans.nii.gz" for k in range(n_items)]
        sizes = [rng.choice([16**3, 24**3, 32**3, 40 * 40 * 24]) for _ in keys]
        parts = split_parts(keys, sizes, n_parts)
        self.assertEqual(len(parts), n_parts)
        self.assertEqual(sorted(j for p in parts for j in p), list(range(n_items)))  # every item once
        by_key = [sorted(keys[j] for j in p) for p in parts]
        for seed in range(3):  # another file-system order: the same items in the same parts
            order = list(range(n_items))
            random.Random(seed).shuffle(order)
            shuffled = split_parts([keys[j] for j in order], [sizes[j] for j in order], n_parts)
            self.assertEqual([sorted(keys[order[j]] for j in p) for p in shuffled], by_key)
        if n_items >= n_parts:
            loads = [sum(sizes[j] for j in p) for p in parts]
            self.assertLessEqual(max(loads) - min(loads), max(sizes))  # balanced by voxels

    def test_balanced_by_voxels_not_count(self):
        parts = split_parts(["a", "b", "c", "d", "e"], [400, 100, 100, 100, 100], 2)
        self.assertEqual(parts, [[0], [1, 2, 3, 4]])

    @parameterized.expand([
        (["a", "a"], [1, 1], 2, "unique"), (["a"], [1, 2], 2, "keys for"), (["a"], [1], 0, "N must be 1"),
    ])
    def test_errors(self, keys, sizes, n, msg):
        with self.assertRaisesRegex(ValueError, msg):
            split_parts(keys, sizes, n)


class _InTmp(unittest.TestCase):
    """A temporary folder, and the holding processes started by a test, stopped at its end."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        self.holders: list[Holder] = []

    def tearDown(self):
        for h in self.holders:
            h.stop()
        self._tmp.cleanup()

    def hold(self, path: Path) -> Holder:
        self.holders.append(Holder(path))
        return self.holders[-1]


class TestClaim(_InTmp):

    def test_claim_creates_and_release_removes(self):
        out = self.tmp / "out" / "ct" / "ct_trans.nii.gz"
        c = claim(out)
        self.assertIsNotNone(c)
        self.assertEqual(c.lock, self.tmp / "out" / "ct" / ".ct_trans.nii.gz.lock")
        self.assertIn(f"pid {os.getpid()} on", c.lock.read_text())
        c.release()
        self.assertFalse(c.held)
        self.assertFalse((self.tmp / "out").exists())  # the folders it created, empty again, are gone
        with claim(out) as c2:
            out.write_bytes(b"result")
        self.assertFalse(c2.held)
        self.assertEqual(sorted(p.name for p in out.parent.iterdir()), ["ct_trans.nii.gz"])  # folder kept

    def test_busy_while_held_free_after_a_kill(self):
        out = self.tmp / "ct" / "ct_trans.nii.gz"
        holder = self.hold(out)
        self.assertEqual(holder.state, "held")
        self.assertIsNone(claim(out))
        self.assertEqual(self.hold(out).state, "busy")  # a third process is refused too
        holder.kill()
        self.assertTrue(lock_path(out).exists())  # left behind by the killed process, but it blocks nothing
        c = claim(out)
        self.assertIsNotNone(c)
        self.assertEqual(self.hold(out).state, "busy")  # and this process's claim holds against others
        c.release()
        self.assertFalse(lock_path(out).exists())

    def test_summary_of_a_second_process(self):
        name = self.tmp / "summary.part-1-of-4.json"
        other = rf"^summary\.part-1-of-4\..+-{os.getpid()}\.json$"
        holder = self.hold(name)  # another process of part 1 is writing its summary
        path, c = claim_summary(name, started=2000.0)
        self.assertRegex(path.name, other)
        self.assertIsNotNone(c)
        c.release()
        holder.kill()
        name.write_text("{}")
        os.utime(name, (1000.0, 1000.0))  # an earlier run's summary: replaced
        path, c = claim_summary(name, started=2000.0)
        self.assertEqual(path, name)
        c.release()
        os.utime(name, (3000.0, 3000.0))  # written since this run started, by another process of the same part
        path, c = claim_summary(name, started=2000.0)
        self.assertRegex(path.name, other)
        c.release()
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), [name.name])  # no lock file left


class TestOutputClaims(_InTmp):
    def test_claiming_load(self):
        outs = [self.tmp / n / f"{n}_trans.nii.gz" for n in ("a", "b", "c")]
        outs[1].parent.mkdir()
        outs[1].write_bytes(b"done")  # written by another process after the plan
        outs[0].parent.mkdir()
        stale = outs[0].parent / ".a_trans.nii.gz.k2j9x.part"  # what a writer killed while saving leaves
        stale.write_bytes(b"half")
        holder = self.hold(outs[2])
        claims = OutputClaims()
        loaded = []
        load = claims.claiming(lambda path: loaded.append(path) or path, outs)
        self.assertEqual(load("a.nii.gz"), "a.nii.gz")
        self.assertTrue(lock_path(outs[0]).exists())
        self.assertFalse(stale.exists())
        with self.assertRaises(OutputTaken) as skipped:
            load("b.nii.gz")
        self.assertEqual(skipped.exception.status, "skipped")
        self.assertFalse(lock_path(outs[1]).exists())  # its claim was dropped at once
        with self.assertRaises(OutputTaken) as busy:
            load("c.nii.gz")
        self.assertEqual(busy.exception.status, "busy")
        self.assertEqual(busy.exception.owner, f"pid {holder.proc.pid} on {socket.gethostname()}")
        self.assertEqual(loaded, ["a.nii.gz"])  # nothing read for an output this process does not write
        claims.release(outs[0])
        self.assertEqual(list(outs[0].parent.iterdir()), [])
        holder.kill()
        claims.take(outs[2])
        claims.release_all()
        self.assertFalse(lock_path(outs[2]).exists())

    def test_sweep_after_a_writer_killed_after_its_save(self):
        out = self.tmp / "a" / "a_trans.nii.gz"
        holder = self.hold(out)
        out.write_bytes(b"written")
        claims = OutputClaims()
        claims.sweep(out)  # held by a live process: left alone
        self.assertTrue(lock_path(out).exists())
        holder.kill()  # killed after its save, before it removed its lock file
        (out.parent / ".a_trans.nii.gz.x1y2.part").write_bytes(b"")
        claims.sweep(out)
        self.assertEqual([p.name for p in out.parent.iterdir()], ["a_trans.nii.gz"])
        claims.sweep(out)  # nothing to do

    def test_an_output_the_plan_redoes_is_skipped_only_if_rewritten(self):
        out = self.tmp / "a" / "a_trans.nii.gz"
        out.parent.mkdir()
        out.write_bytes(b"old")
        os.utime(out, (1000.0, 1000.0))
        claims = OutputClaims(started=2000.0)
        claims.take(out, existed=True)  # older than the run (overwrite, or a class mask missing): redone
        self.assertTrue(lock_path(out).exists())
        claims.release(out)
        os.utime(out, (3000.0, 3000.0))  # written by another process of this run
        with self.assertRaisesRegex(OutputTaken, "since this run started"):
            claims.take(out, existed=True)
        os.utime(out, (1000.0, 1000.0))  # absent at the plan: whatever its time, another process wrote it
        with self.assertRaisesRegex(OutputTaken, "since this run started"):
            claims.take(out)
        self.assertFalse(lock_path(out).exists())

    def test_file_system_without_locks(self):
        out = self.tmp / "a" / "a_trans.nii.gz"
        claims = OutputClaims()
        with mock.patch("fcntl.lockf", side_effect=OSError(errno.ENOLCK, "No locks available")):
            with self.assertWarnsRegex(UserWarning, "does not support locks"):
                claims.take(out)
            claims.take(out)  # warned once
        with mock.patch("fcntl.lockf", side_effect=OSError(errno.EBADF, "Bad file descriptor")):
            with self.assertRaises(OSError):
                claims.take(out)


def _outputs_on_disk(folder: Path, names) -> None:
    """Whole one-voxel label maps at ``folder/<name>``: 'summary' checks the outputs it is told of on disk."""
    import nibabel as nib
    import numpy as np

    for name in names:
        nib.save(nib.Nifti1Image(np.zeros((1, 1, 1), np.uint8), np.eye(4)), folder / f"{name}.nii")
        (folder / f"{name}.nii").rename(folder / name)


def _summary(records, *, inputs, wall=10.0, started=1000.0, interrupted=False):
    recs = [{"image": f"{o}.nii.gz", "output": o, "status": s} for o, s in records]
    return {"images": len(recs), "inputs": inputs, "wall_seconds": wall, "started": started,
            "finished": started + wall, "host": "node1", "interrupted": interrupted, "per_image": recs}


class TestMerge(unittest.TestCase):
    def test_parts_merged_into_one_table(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            # 6 images in 3 parts: part 1 never reported; part 2 failed one image that a later run of 4 parts did
            (d / "summary.part-0-of-3.json").write_text(json.dumps(
                _summary([("a", "done"), ("b", "skipped")], inputs=6, wall=30.0, started=1000.0)))
            (d / "summary.part-2-of-3.json").write_text(json.dumps(
                _summary([("e", "failed"), ("f", "done")], inputs=6, wall=20.0, started=1010.0)))
            (d / "summary.part-3-of-4.json").write_text(json.dumps(
                _summary([("e", "done"), ("c", "busy")], inputs=6, wall=10.0, started=1050.0)))
            (d / "summary.part-3-of-4.node2-77.json").write_text(json.dumps(
                _summary([("c", "failed"), ("d", "interrupted")], inputs=6, wall=5.0, started=1052.0,
                         interrupted=True)))
            (d / "summary.part-9-of-9.json.tmp").write_text("{")  # not a summary name: ignored
            (d / "summary.part-1-of-4.json").write_text("{ cut")  # a summary name that is not JSON: named
            _outputs_on_disk(d, "abef")
            merged = merge_summaries(d)
            t = merged["totals"]
            self.assertEqual((t["inputs"], t["done"], t["skipped"], t["failed"], t["busy"], t["unreported"]),
                             (6, 3, 1, 1, 0, 1))
            self.assertFalse(t["complete"])
            self.assertEqual(t["seconds"], 65.0)
            self.assertEqual(t["span_seconds"], 60.0)  # first start 1000, last end 1060
            self.assertEqual(t["volumes_per_minute"], 3.0)
            self.assertEqual(merged["missing_parts"], ["1/3", "0/4", "1/4", "2/4"])
            self.assertEqual(merged["failed_parts"], ["2/3", "3/4"])
            self.assertEqual(merged["unreadable"], ["summary.part-1-of-4.json"])
            self.assertEqual(merged["interrupted_parts"], ["3/4"])
            table = format_summary(merged)
            self.assertIn("missing parts (no summary): 1/3, 0/4, 1/4, 2/4", table)
            self.assertIn("parts with failed images: 2/3, 3/4", table)
            self.assertIn("parts stopped before their end: 3/4", table)
            self.assertIn("4 of 6 image(s) have an output", table)
            self.assertIn("3/4*", table)
            row = next(line for line in table.splitlines() if line.startswith("0/3 "))
            self.assertEqual(row.split(), ["0/3", "2", "1", "1", "0", "0", "30.0", "2.00"])

    def test_complete_and_empty(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            self.assertEqual(merge_summaries(d)["parts"], [])
            self.assertFalse(merge_summaries(d)["totals"]["complete"])
            for i in range(2):
                (d / f"summary.part-{i}-of-2.json").write_text(json.dumps(
                    _summary([(f"x{i}", "done"), (f"y{i}", "skipped")], inputs=4)))
            _outputs_on_disk(d, ["x0", "y0", "x1", "y1"])
            merged = merge_summaries(d)
            self.assertTrue(merged["totals"]["complete"])
            self.assertEqual(merged["missing_parts"], [])
            self.assertNotIn("missing", format_summary(merged))


class TestSummaryCommand(unittest.TestCase):
    def test_summary_of_a_folder(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            code, out, err = run_main(["summary", d / "nothing"])
            self.assertEqual((code, err.strip()), (2, f"error: '{d / 'nothing'}' is not a folder; give the output "
                                                       "folder of the parts"))
            code, out, err = run_main(["summary", d])
            self.assertEqual(code, 1)
            self.assertIn("no summary in", err)
            (d / "summary.part-0-of-2.json").write_text(json.dumps(_summary([("a", "done")], inputs=2)))
            _outputs_on_disk(d, "ab")
            code, out, err = run_main(["summary", d])
            self.assertEqual(code, 1)
            self.assertIn("missing parts (no summary): 1/2", out)
            self.assertEqual(err.strip(), "error: 1 of 2 image(s) have no output; rerun the parts named above")
            (d / "summary.part-1-of-2.json").write_text(json.dumps(_summary([("b", "skipped")], inputs=2)))
            code, out, err = run_main(["summary", d, "--json", d / "all.json"])
            self.assertEqual((code, err), (0, ""), err)
            self.assertIn("2 of 2 image(s) have an output", out)
            self.assertTrue(json.loads((d / "all.json").read_text())["totals"]["complete"])


def tiny_segment(image, geometry):
    """A stand-in network (no weights, no windows): soft tissue is label 1."""
    return ((image[0] > 0) & (image[0] < 200)).to(torch.uint8), {"windows": 1}


class TestRunBatchPart(_InTmp):
    """``run_batch(part=...)`` in this process, with a stand-in network: the quick counterpart of the CLI tests."""

    def setUp(self):
        super().setUp()
        (self.tmp / "cts" / "sub").mkdir(parents=True)
        names = ["a.nii.gz", "b.nii.gz", "c.nii.gz", "sub/a.nii.gz", "sub/d.nii.gz"]
        self.images = [write_phantom(self.tmp / "cts" / n, SHAPES[k % 4], seed=k) for k, n in enumerate(names)]

    def test_parts_cover_the_batch_once(self):
        out = self.tmp / "out"
        results = [run_batch(self.tmp / "cts", out, tiny_segment, part=p) for p in ((0, 3), "1/3", (2, 3))]
        images = [{r["image"] for r in res.records} for res in results]
        self.assertEqual(sorted(set().union(*images)), sorted(map(str, self.images)))
        self.assertEqual(sum(len(i) for i in images), 5)  # disjoint
        for k, res in enumerate(results):
            self.assertEqual(res.summary_path, out / f"summary.part-{k}-of-3.json")
            saved = json.loads(res.summary_path.read_text())
            self.assertEqual((saved["part"], saved["inputs"], saved["done"]), ([k, 3], 5, len(images[k])))
        self.assertFalse((out / "summary.json").exists())
        self.assertTrue(merge_summaries(out)["totals"]["complete"])
        # the same split from the images listed in another order (not sub/a.nii.gz: it would be written to a/)
        files = [p for p in self.images if p != self.tmp / "cts" / "sub" / "a.nii.gz"]
        for k in range(2):
            listed = run_batch(files[::-1], self.tmp / "r", tiny_segment, part=(k, 2))
            flat = run_batch(files, self.tmp / "f", tiny_segment, part=(k, 2))
            self.assertEqual(sorted(r["image"] for r in listed.records), sorted(r["image"] for r in flat.records))
            self.assertEqual(len(flat.records), 2)

    def test_an_output_held_elsewhere_is_busy(self):
        out = self.tmp / "out"
        held = out / "b" / "b_trans.nii.gz"
        holder = self.hold(held)
        res = run_batch(self.tmp / "cts", out, tiny_segment)
        status = {Path(r["output"]).relative_to(out).as_posix(): r["status"] for r in res.records}
        self.assertEqual(status.pop("b/b_trans.nii.gz"), "busy")
        self.assertEqual(set(status.values()), {"done"})
        self.assertEqual((res.exit_code, res.count("busy")), (0, 1))
        self.assertFalse(held.exists())
        self.assertEqual(json.loads(res.summary_path.read_text())["busy"], 1)
        self.assertEqual([p.name for p in out.rglob(".*")], [".b_trans.nii.gz.lock"])  # the holder's only
        holder.kill()
        again = run_batch(self.tmp / "cts", out, tiny_segment)  # its stale lock blocks nothing
        self.assertEqual((again.done, again.skipped), (1, 4))
        self.assertEqual([p.name for p in out.rglob(".*")], [])

    def test_a_stopped_part_records_its_own_images(self):
        out = self.tmp / "out"
        calls = []

        def stopped_at_the_second(image, geometry):
            calls.append(geometry)
            if len(calls) == 2:
                raise KeyboardInterrupt  # Ctrl-C (SIGTERM unwinds the same way in the command line)
            return tiny_segment(image, geometry)

        with self.assertRaises(KeyboardInterrupt):
            run_batch(self.tmp / "cts", out, stopped_at_the_second, part=(1, 2))
        saved = json.loads((out / "summary.part-1-of-2.json").read_text())
        self.assertTrue(saved["interrupted"])
        self.assertEqual(saved["part"], [1, 2])
        finished = run_batch(self.tmp / "cts", out, tiny_segment, part=(0, 2))
        mine = {r["image"] for r in saved["per_image"]}
        self.assertEqual(len(mine), 5 - len(finished.records))  # part 1's images only, not 'unknown' others
        self.assertFalse(mine & {r["image"] for r in finished.records})
        self.assertEqual(sorted(r["status"] for r in saved["per_image"]).count("done"), 1)
        self.assertEqual([p.name for p in out.rglob(".*")], [])  # no lock left by the stopped run
        merged = merge_summaries(out)
        self.assertEqual(merged["interrupted_parts"], ["1/2"])
        self.assertEqual(merged["totals"]["done"], 1 + finished.done)

    @parameterized.expand([((4, 4), "I must be in 0..3"), ("2", "must be I/N"), ((0, 0), "N must be 1")])
    def test_bad_part(self, part, msg):
        with self.assertRaisesRegex(Vista3DInputError, msg):
            run_batch(self.tmp / "cts", self.tmp / "out", tiny_segment, part=part)
        self.assertFalse((self.tmp / "out").exists())


# tiny settings: one or a few 32^3 windows per image, a narrow random network (test_cli's TINY)
TINY = ["--roi-size", "32", "--embed-dim", "8", "--classes", "1,3", "--device", "cpu"]
SHAPES = [(40, 40, 24), (32, 32, 24), (40, 32, 24), (24, 24, 24)]


@pytest.mark.slow
class TestPartsAtOnce(unittest.TestCase):
    """``vista3d --part I/N`` processes started together over one output folder, as a job array runs them."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = Path(self._tmp.name)
        (self.tmp / "cts").mkdir()
        self.images = [write_phantom(self.tmp / "cts" / f"ct{k}.nii.gz", SHAPES[k % 4], seed=k) for k in range(8)]
        self.out = self.tmp / "out"
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def tearDown(self):
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._tmp.cleanup()

    def start(self, part: str, ranks: int = 1) -> tuple[subprocess.Popen, Path]:
        """A process of ``--part part`` (a torchrun of ``ranks`` when more than 1); its stdout goes to a file."""
        log = self.tmp / f"stdout.{len(self.procs)}.log"
        cmd = ["-m", "monai.apps.vista3d", "-i", str(self.tmp / "cts"), "-o", str(self.out), "--part", part, *TINY]
        if ranks > 1:
            cmd = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={_free_port()}",
                   f"--log-dir={self.tmp / 'torchrun-logs'}", *cmd]  # not a torchelastic_* left in /tmp
        env = child_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, *cmd], cwd=ROOT, env=env, stdout=f, stderr=subprocess.PIPE,
                                    text=True)
        self.procs.append((proc, log))
        return proc, log

    def finish(self, proc: subprocess.Popen) -> None:
        _, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, err)

    def wait_for(self, proc: subprocess.Popen, log: Path, text: str) -> None:
        """Wait until ``proc`` has printed ``text`` to ``log``; fail if it ends without."""
        while text not in log.read_text():
            if proc.poll() is not None:
                self.assertIn(text, log.read_text(), "the part ended before it printed this")
            time.sleep(0.01)

    def kill_after_first_output(self, proc: subprocess.Popen, log: Path) -> None:
        """SIGKILL ``proc`` once it has written one output (nothing of it runs after that)."""
        self.wait_for(proc, log, " -> ")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)

    def outputs(self) -> dict[Path, tuple[int, int]]:
        """Every output, with what changes when it is written again (inode, modification time)."""
        return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in self.out.rglob("*_trans.nii.gz")}

    def summary(self, name: str) -> dict:
        return json.loads((self.out / name).read_text())

    def assert_written_once(self) -> None:
        """All 8 outputs exist, each written by one process once, with no lock or temporary file left."""
        written = Counter(line.rsplit(" -> ", 1)[1] for _, log in self.procs
                          for line in log.read_text().splitlines() if " -> " in line)
        outs = self.outputs()
        self.assertEqual(len(outs), 8)
        self.assertLessEqual(set(written), {str(p) for p in outs})
        self.assertEqual([k for k, n in written.items() if n > 1], [])
        self.assertEqual([str(p) for p in self.out.rglob(".*")], [])
        res = subprocess.run([sys.executable, "-m", "monai.apps.vista3d", "summary", str(self.out)], cwd=ROOT,
                             env=child_env(), capture_output=True, text=True)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("8 of 8 image(s) have an output", res.stdout)

    def test_parts_at_once_a_part_under_torchrun_and_one_given_twice(self):
        whole = self.start("0/2", ranks=2)[0]
        # the same part twice, by mistake, running at once: the first is held (SIGSTOP) after its first output until
        # the second has begun (printed its first record), so that neither finishes before the other began, however
        # slowly a loaded host starts the second
        first, first_log = self.start("1/2")
        self.wait_for(first, first_log, " -> ")
        first.send_signal(signal.SIGSTOP)
        second, second_log = self.start("1/2")
        self.wait_for(second, second_log, "[1/")
        first.send_signal(signal.SIGCONT)
        for proc in (whole, first, second):
            self.finish(proc)
        self.assert_written_once()
        part0 = self.summary("summary.part-0-of-2.json")
        self.assertEqual((part0["part"], part0["inputs"], part0["world_size"]), ([0, 2], 8, 2))
        self.assertEqual({r["rank"] for r in part0["per_image"]}, {0, 1})  # torchrun's ranks share the part
        others = sorted(p.name for p in self.out.glob("summary.part-1-of-2.*.json"))
        self.assertEqual(len(others), 1, others)  # the second process of part 1 wrote its own summary
        twice = [self.summary("summary.part-1-of-2.json"), self.summary(others[0])]
        images1 = {r["image"] for r in twice[0]["per_image"]}
        self.assertEqual(images1, {r["image"] for r in twice[1]["per_image"]})  # each summary is whole
        self.assertEqual(sorted(images1 | {r["image"] for r in part0["per_image"]}), sorted(map(str, self.images)))
        self.assertFalse(images1 & {r["image"] for r in part0["per_image"]})
        done = Counter(r["image"] for s in twice for r in s["per_image"] if r["status"] == "done")
        self.assertEqual(sorted(done), sorted(images1))  # each image of part 1 done by one of the two
        self.assertEqual(set(done.values()), {1})

    def test_killed_part_rerun_finishes_only_what_is_missing(self):
        victim, log = self.start("0/2")
        other = self.start("1/2")[0]
        self.kill_after_first_output(victim, log)
        self.finish(other)
        before = self.outputs()
        self.assertLess(len(before), 8)
        rerun = self.start("0/2")[0]
        self.finish(rerun)
        self.assert_written_once()
        self.assertEqual({p: s for p, s in self.outputs().items() if p in before}, before)  # left alone
        again = self.summary("summary.part-0-of-2.json")
        self.assertEqual((again["done"], again["skipped"], again["images"]), (8 - len(before), 4 - again["done"], 4))

    def test_other_number_of_parts_over_a_partial_run(self):
        victim, log = self.start("0/2")
        self.kill_after_first_output(victim, log)  # it leaves its claim's lock file, and maybe a temporary file
        before = self.outputs()
        for proc in [self.start(f"{i}/3")[0] for i in range(3)]:
            self.finish(proc)
        self.assert_written_once()
        self.assertEqual({p: s for p, s in self.outputs().items() if p in before}, before)
        parts = [self.summary(f"summary.part-{i}-of-3.json") for i in range(3)]
        self.assertEqual(sum(s["done"] for s in parts), 8 - len(before))
        self.assertEqual(sum(s["skipped"] for s in parts), len(before))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_main(argv: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


if __name__ == "__main__":
    unittest.main()
