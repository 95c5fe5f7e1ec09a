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
"""End-to-end VISTA3D pipeline with a stub network whose logits are known: labels land where they should."""

from __future__ import annotations

import contextlib
import tempfile
import unittest
from pathlib import Path
from unittest import mock

import nibabel as nib
import numpy as np
import torch
from parameterized import parameterized

from monai.apps.vista3d.batch.run import run_batch
from monai.apps.vista3d.batch.segmenter import pipeline_segment_fn
from monai.apps.vista3d.config import PipelineOptions
from monai.apps.vista3d.core.pipeline import Vista3DPipeline
from monai.apps.vista3d.core.postprocess import ClassMasks
from monai.apps.vista3d.errors import (
    ClassPromptError,
    EmptyForegroundError,
    PromptError,
    Vista3DInputError,
    Vista3DOutputError,
)
from monai.apps.vista3d.io.nifti import load_image
from monai.apps.vista3d.io.paths import class_mask_paths
from monai.inferers import plan_sliding_windows
from tests.apps.vista3d.stub_vista import (
    HU,
    LIVER,
    LIVER_2,
    SPLEEN,
    StubVista,
    inside,
    phantom,
    rotation,
)
from tests.networks.tiny_vista3d import tiny_vista3d_with_recorded_weights


def _pipe(network, **kw):
    kw.setdefault("roi_size", (32, 32, 32))
    return Vista3DPipeline(network=network, device="cpu", **kw)


ORIENTATIONS = [
    ("ras_1mm", np.eye(3), (1.0, 1.0, 1.0), (40, 40, 36)),
    ("las_aniso", np.diag([-1.0, 1.0, 1.0]), (0.8, 0.9, 2.5), (46, 40, 15)),
    ("oblique", rotation(0.35, 0.2), (1.1, 1.0, 1.3), (36, 38, 30)),
    ("pir", np.array([[0.0, 0.0, -1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]]), (1.2, 0.9, 1.0), (40, 40, 36)),
]


class TestPipelineStub(unittest.TestCase):
    @parameterized.expand(ORIENTATIONS)
    def test_labels_land_on_the_organs(self, _, direction, spacing, shape):
        img, aff, world = phantom(shape, direction, spacing)
        pipe = _pipe(StubVista(HU), sw_batch_size=2)
        result = pipe.segment(torch.from_numpy(img), aff, classes="liver,spleen")
        out = result.labels
        self.assertEqual(tuple(out.shape), shape)
        self.assertEqual(out.dtype, torch.int16)
        out = out.numpy()
        grow = 1.5 + max(spacing)  # nearest-neighbour round trip through the 1.5 mm grid
        for label_id, box in ((1, LIVER), (3, SPLEEN)):
            inner = inside(world, box, -grow)
            self.assertGreater(inner.sum(), 10)
            self.assertTrue((out[inner] == label_id).all(), f"label {label_id} missing inside its box")
        outer = ~inside(world, LIVER, grow) & ~inside(world, SPLEEN, grow)
        self.assertTrue((out[outer] == 0).all(), "labels outside the organ boxes")
        self.assertEqual(set(np.unique(out).tolist()), {0, 1, 3})
        for stage in ("preprocess", "inference", "postprocess", "invert"):
            self.assertIn(stage, result.timings)
        windows = plan_sliding_windows(result.record.final_shape, (32,) * 3, 0.25).num_windows
        self.assertEqual(pipe.network.calls, -(-windows // 2))
        self.assertEqual((result.windows, result.sw_batch_size), (windows, min(2, windows)))
        # the full-logits path (upstream's) gives the same label map, with the inferer's stage split
        full = _pipe(StubVista(HU), sw_batch_size=2, streaming=False).segment(
            torch.from_numpy(img), aff, classes="liver,spleen"
        )
        torch.testing.assert_close(full.labels.numpy(), out, rtol=0, atol=0)
        self.assertIn("inference/forward", full.timings)
        self.assertEqual((full.windows, full.sw_batch_size), (windows, min(2, windows)))

    def test_everything_prompt_and_sequential_ids(self):
        img, aff, world = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))
        out = _pipe(StubVista(HU))(torch.from_numpy(img), aff).numpy()  # default: the 117 labels
        self.assertEqual(set(np.unique(out).tolist()), {0, 1, 3})

    def test_point_prompt_keeps_the_clicked_component(self):
        img, aff, world = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0), boxes=(LIVER, LIVER_2),
                                  values=(300.0, 300.0))
        centre = np.array([np.mean(b) for b in LIVER])
        click = np.linalg.solve(aff, np.append(centre, 1.0))[:3]
        pipe = _pipe(StubVista(HU, point_level=300.0))
        out = pipe(torch.from_numpy(img), aff, points=[click.tolist()], point_labels=[1]).numpy()
        grow = 2.5
        self.assertTrue((out[inside(world, LIVER, -grow)] == 1).all())
        self.assertTrue((out[inside(world, LIVER_2, grow)] == 0).all(), "the unclicked region was kept")
        # with a class, the label is the class id
        out = pipe(torch.from_numpy(img), aff, classes="spleen", points=[click.tolist()], point_labels=[1]).numpy()
        self.assertEqual(set(np.unique(out).tolist()) - {0, 255}, set())  # stub spleen level absent: background
        out = pipe(torch.from_numpy(img), aff, classes="liver", points=[click.tolist()], point_labels="1").numpy()
        self.assertTrue((out[inside(world, LIVER, -grow)] == 1).all())

    @parameterized.expand([("default", {}, 0), ("bundle", {"unreached_label": 255}, 255)])
    def test_voxels_outside_the_point_window(self, _, options, fill):
        """Voxels no point window reached are background by default (what a viewer expects), 255 as the bundle's."""
        img, aff, world = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))
        centre = np.array([np.mean(b) for b in LIVER])
        click = np.linalg.solve(aff, np.append(centre, 1.0))[:3]
        pipe = _pipe(StubVista(HU), roi_size=(8, 8, 8), **options)
        out = pipe(torch.from_numpy(img), aff, points=[click], point_labels=[1]).numpy()
        near = (np.abs(world - centre) < 4).all(-1)
        far = (np.abs(world - centre) > 12).any(-1)
        self.assertTrue((out[near] == 1).all())
        self.assertTrue((out[far] == fill).all())
        self.assertLessEqual(set(np.unique(out).tolist()), {0, 1, fill})

    def test_segment_file_round_trip(self):
        for dtype in (np.int16, np.float32):
            img, aff, world = phantom((38, 36, 20), np.diag([-1.0, -1.0, 1.0]), (0.9, 1.0, 2.0))
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "ct scan.nii.gz"
                nimg = nib.Nifti1Image(img.astype(dtype), aff)
                nimg.header.set_qform(aff, code=1)
                nimg.header.set_sform(aff, code=2)
                nib.save(nimg, src)
                before = src.read_bytes()
                pipe = _pipe(StubVista(HU))
                result = pipe.segment_file(src, Path(tmp) / "out", classes=[1, "spleen"])
                out = result.output
                self.assertEqual(out, Path(tmp) / "out" / "ct scan" / "ct scan_trans.nii.gz")
                res = nib.load(out)
                self.assertEqual(res.shape, img.shape)
                np.testing.assert_allclose(res.affine, nib.load(src).affine, atol=1e-6)
                self.assertEqual(int(res.header["sform_code"]), 2)
                self.assertEqual(res.get_data_dtype(), np.uint8)  # the default: label ids and 255 fit
                lab = np.asarray(res.dataobj)
                self.assertTrue((lab[inside(world, LIVER, -3.5)] == 1).all())
                self.assertTrue((lab[inside(world, SPLEEN, -3.5)] == 3).all())
                self.assertEqual(src.read_bytes(), before, "the input file changed")
                for key in ("load", "preprocess", "inference", "postprocess", "invert", "save"):
                    self.assertIn(key, result.timings)
                with self.assertRaisesRegex(Vista3DOutputError, "overwrite=True"):
                    pipe.segment_file(src, Path(tmp) / "out", classes=[1])
                f32 = _pipe(StubVista(HU), output_dtype="float32").segment_file(
                    src, Path(tmp) / "out", classes=[1, "spleen"], overwrite=True)
                back = nib.load(f32.output)
                self.assertEqual(back.get_data_dtype(), np.float32)  # the bundle's files
                np.testing.assert_array_equal(np.asarray(back.dataobj), lab)

    def test_batch_driver_runs_the_pipeline(self):
        with tempfile.TemporaryDirectory() as tmp:
            srcs = []
            for i, (direction, spacing) in enumerate([(np.eye(3), (1.0, 1.0, 1.5)), (np.diag([-1.0, 1, 1]), (0.9,) * 3)]):
                img, aff, _ = phantom((34, 32, 22), direction, spacing)
                srcs.append(Path(tmp) / f"ct{i}.nii.gz")
                nib.save(nib.Nifti1Image(img, aff), srcs[-1])
            paths = [srcs[0], Path(tmp) / "missing.nii.gz", srcs[1]]
            pipe = _pipe(StubVista(HU))
            seen = []
            result = run_batch(paths, Path(tmp) / "batch", pipeline_segment_fn(pipe, "1,3"), on_image=seen.append)
            self.assertEqual(result.exit_code, 1)
            self.assertEqual((result.done, result.failed, len(result.records)), (2, 1, 3))
            self.assertEqual(sorted(r["image"] for r in seen), sorted(map(str, paths)))
            by_name = {Path(r["image"]).name: r for r in seen}
            self.assertEqual(by_name["missing.nii.gz"]["status"], "failed")
            self.assertIn("no such file", by_name["missing.nii.gz"]["error"])
            for src in srcs:
                rec = by_name[src.name]
                out = Path(tmp) / "batch" / src.name[:-7] / f"{src.name[:-7]}_trans.nii.gz"
                self.assertEqual((rec["status"], rec["output"]), ("done", str(out)))
                for key in ("load", "preprocess", "inference", "postprocess", "invert", "save"):
                    self.assertIn(key, rec["stages"])
                one = pipe.segment_file(src, Path(tmp) / "single", classes="1,3").output
                np.testing.assert_array_equal(np.asarray(nib.load(out).dataobj), np.asarray(nib.load(one).dataobj))


NIB_DATA = Path(nib.__file__).parent / "tests" / "data"


@unittest.skipUnless((NIB_DATA / "anatomical.nii").is_file(), "nibabel's test data is not installed")
class TestPipelineLoad(unittest.TestCase):
    def test_stored_type_for_an_accelerator(self):
        img, aff, _ = phantom((40, 36, 30), np.eye(3), (1.0, 1.0, 1.5))
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "ct.nii.gz"
            nib.save(nib.Nifti1Image(img.astype(np.int16), aff), src)
            pipe = _pipe(StubVista(HU))
            on_cpu, _ = pipe.load(src)  # the CPU: float32, C order
            self.assertEqual((on_cpu.dtype, on_cpu.is_contiguous()), (torch.float32, True))
            x, _ = pipe.preprocess(on_cpu, aff)
            # an accelerator: the stored int16 in file order on the device, converted by preprocess there; "meta"
            # stands in for a GPU (no data), and the same tensor on the CPU shows preprocess gives the same input
            pipe.device = torch.device("meta")
            on_dev, geom = pipe.load(src)
            self.assertEqual((on_dev.device.type, on_dev.dtype), ("meta", torch.int16))
            self.assertEqual(tuple(on_dev.shape), (1, 40, 36, 30))
            self.assertEqual(on_dev.stride()[1:], (1, 40, 40 * 36))
            pipe.device = torch.device("cpu")
            stored, _ = load_image(src, dtype=None, contiguous=False)
            torch.testing.assert_close(pipe.preprocess(stored, geom.affine)[0], x, rtol=0, atol=0)


class TestNibabelFiles(unittest.TestCase):
    """Real NIfTI files that nobody here wrote: big-endian int16 LAS, big-endian float RAS, a 4D series."""

    @parameterized.expand([("anatomical.nii", None), ("reoriented_anat_moved.nii", None), ("example4d.nii.gz", 1)])
    def test_round_trip_geometry(self, name, volume_index):
        src = NIB_DATA / name
        ref = nib.load(src)
        with tempfile.TemporaryDirectory() as tmp:
            # the stub sees MR intensities: any label is fine, the grid and the header are what is checked
            pipe = _pipe(StubVista({1: 200.0, 3: 1000.0}), roi_size=(64, 64, 64))
            out = pipe.segment_file(src, tmp, classes="1,3", volume_index=volume_index).output
            res = nib.load(out)
            self.assertEqual(res.shape, ref.shape[:3])
            np.testing.assert_allclose(res.affine, ref.affine, atol=1e-5)
            for key in ("qform_code", "sform_code"):
                self.assertEqual(int(res.header[key]), int(ref.header[key]))
            np.testing.assert_allclose(res.header["pixdim"][1:4], ref.header["pixdim"][1:4])
            lab = np.asarray(res.dataobj)
            self.assertTrue(set(np.unique(lab).tolist()) <= {0.0, 1.0, 3.0})
            self.assertGreater((lab > 0).sum(), 0)


VESSEL = 25  # "hepatic vessel": in the overlap stub a wide band that covers the liver and the spleen
OVERLAP_LEVELS = {1: 300.0, VESSEL: 450.0, 3: 600.0}


def _overlap_stub() -> StubVista:
    """Liver (1) and spleen (3) as before, and a vessel class whose logit is higher than theirs on both organs."""
    return StubVista(OVERLAP_LEVELS, widths={VESSEL: 250.0})


class TestPerClassMasks(unittest.TestCase):
    """``per_class=True``: one mask per class on the input grid, overlaps kept, the same on both paths."""

    @parameterized.expand(ORIENTATIONS[1:3])
    def test_overlap_kept_on_both_paths(self, _, direction, spacing, shape):
        img, aff, world = phantom(shape, direction, spacing)
        classes = "liver,hepatic vessel,spleen"
        streamed = _pipe(_overlap_stub(), sw_batch_size=2, per_class=True).segment(torch.from_numpy(img), aff, classes)
        full = _pipe(_overlap_stub(), sw_batch_size=2, per_class=True, streaming=False).segment(
            torch.from_numpy(img), aff, classes
        )
        for result in (streamed, full):
            self.assertIsInstance(result.masks, ClassMasks)
            self.assertEqual(list(result.masks), [1, VESSEL, 3])
            self.assertEqual(tuple(result.masks.spatial_shape), shape)
        self.assertTrue(torch.equal(streamed.masks.packed, full.masks.packed))
        self.assertTrue(torch.equal(streamed.labels, full.labels))
        masks = {i: m.numpy() for i, m in streamed.masks.items()}
        labels = streamed.labels.numpy()
        grow = 1.5 + max(spacing)
        liver, spleen = inside(world, LIVER, -grow), inside(world, SPLEEN, -grow)
        self.assertGreater(min(liver.sum(), spleen.sum()), 10)
        self.assertTrue(masks[1][liver].all() and masks[3][spleen].all())
        self.assertTrue(masks[VESSEL][liver].all() and masks[VESSEL][spleen].all())
        outer = ~inside(world, LIVER, grow) & ~inside(world, SPLEEN, grow)  # organ edges blend into other levels
        for label_id in (1, VESSEL, 3):
            self.assertFalse(masks[label_id][outer].any())
        # the label map gives both organs to the vessel: the liver is lost there and kept in its mask
        self.assertTrue((labels[liver] == VESSEL).all() and (labels[spleen] == VESSEL).all())
        self.assertFalse((labels == 1).any())
        # each label is inside its class's mask, background exactly where no mask is set
        for label_id, mask in masks.items():
            self.assertTrue(mask[labels == label_id].all())
        self.assertTrue(np.array_equal(labels == 0, ~np.any(list(masks.values()), axis=0)))
        # without per_class: no masks, the same label map
        plain = _pipe(_overlap_stub(), sw_batch_size=2).segment(torch.from_numpy(img), aff, classes)
        self.assertIsNone(plain.masks)
        self.assertTrue(torch.equal(plain.labels, streamed.labels))

    def test_streamed_masks_equal_thresholded_logits_tiny_vista3d(self):
        model = tiny_vista3d_with_recorded_weights()
        pipe = Vista3DPipeline(network=model, device="cpu", roi_size=32, sw_batch_size=2, per_class=True)
        x = torch.rand(1, 40, 37, 30, generator=torch.Generator().manual_seed(0))
        ids = [1, 3, 25, 14, 5, 6, 7, 8, 9, 10]  # two packed bytes
        logits, _ = pipe.infer(x, ids)
        labels, masks, run = pipe.stream(x, ids)
        self.assertEqual(run.windows, 4)
        self.assertTrue(torch.equal(masks.dense().bool(), logits[0] > 0))
        full_labels, full_masks = pipe.postprocess(logits, ids)
        self.assertTrue(torch.equal(masks.packed, full_masks.packed))
        self.assertTrue(torch.equal(labels, full_labels))
        self.assertGreater(int(((logits[0] > 0).sum(0) > 1).sum()), 0)  # overlaps to keep

    def test_point_prompt_with_a_class(self):
        img, aff, world = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))
        centre = np.array([np.mean(b) for b in LIVER])
        click = np.linalg.solve(aff, np.append(centre, 1.0))[:3]
        pipe = _pipe(_overlap_stub(), roi_size=(16, 16, 16), per_class=True, unreached_label=255)
        result = pipe.segment(torch.from_numpy(img), aff, classes="liver", points=[click.tolist()], point_labels=[1])
        self.assertEqual(list(result.masks), [1])
        mask, labels = result.masks[1].numpy(), result.labels.numpy()
        self.assertTrue(np.array_equal(mask, labels == 1))
        self.assertTrue((labels == 255).any())  # voxels no point window reached: in no mask
        self.assertFalse(mask[labels == 255].any())
        with self.assertRaisesRegex(PromptError, "per-class masks need classes") as ctx:
            pipe.segment(torch.from_numpy(img), aff, classes=None, points=[click.tolist()], point_labels=[1])
        self.assertNotIn("\n", str(ctx.exception))

    @parameterized.expand([
        ("empty_string", "", ClassPromptError, "empty class name"),
        ("empty_list", [], ClassPromptError, "the class list is empty"),
        ("unknown_name", "liver,hepatic vesel", ClassPromptError, "did you mean 'hepatic vessel'"),
    ])
    def test_bad_prompts_one_line_before_any_work(self, _, classes, error, msg):
        img, aff, _ = phantom((30, 30, 24), np.eye(3), (1.0, 1.0, 1.0))
        stub = _overlap_stub()
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "ct.nii.gz"
            nib.save(nib.Nifti1Image(img, aff), src)
            with self.assertRaisesRegex(error, msg) as ctx:
                _pipe(stub, per_class=True).segment_file(src, Path(tmp) / "out", classes=classes)
            self.assertNotIn("\n", str(ctx.exception))
            self.assertEqual(stub.calls, 0)
            self.assertFalse((Path(tmp) / "out").exists())

    def test_segment_file_writes_the_masks(self):
        img, aff, world = phantom((38, 36, 20), np.diag([-1.0, -1.0, 1.0]), (0.9, 1.0, 2.0))
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "ct scan.nii.gz"
            nimg = nib.Nifti1Image(img.astype(np.int16), aff)
            nimg.header.set_qform(aff, code=1)
            nimg.header.set_sform(aff, code=2)
            nib.save(nimg, src)
            out = Path(tmp) / "out"
            pipe = _pipe(_overlap_stub(), per_class=True)
            result = pipe.segment_file(src, out, classes="liver,hepatic vessel,spleen")
            folder = out / "ct scan"
            self.assertEqual(result.output, folder / "ct scan_trans.nii.gz")
            self.assertEqual(result.mask_outputs, class_mask_paths(out / "ct scan", [1, VESSEL, 3]))
            self.assertEqual(
                sorted(p.name for p in folder.iterdir()),
                ["ct scan_trans.nii.gz", "hepatic_vessel.nii.gz", "liver.nii.gz", "spleen.nii.gz"],
            )
            ref = nib.load(src)
            for label_id, path in result.mask_outputs.items():
                back = nib.load(path)
                self.assertEqual(back.get_data_dtype(), np.uint8)
                np.testing.assert_array_equal(back.affine, ref.affine)
                self.assertEqual((int(back.header["qform_code"]), int(back.header["sform_code"])), (1, 2))
                np.testing.assert_array_equal(np.asarray(back.dataobj), result.masks[label_id].numpy())
            liver = np.asarray(nib.load(result.mask_outputs[1]).dataobj)
            self.assertTrue((liver[inside(world, LIVER, -3.5)] == 1).all())
            self.assertSetEqual(set(np.unique(liver).tolist()), {0, 1})
            self.assertIn("save", result.timings)
            # a mask already there stops the next run before any work, unless overwrite
            (folder / "ct scan_trans.nii.gz").unlink()
            calls = pipe.network.calls
            with self.assertRaisesRegex(Vista3DOutputError, "spleen.nii.gz: exists"):
                pipe.segment_file(src, out, classes="spleen")
            self.assertEqual(pipe.network.calls, calls)
            again = pipe.segment_file(src, out, classes="spleen", overwrite=True)
            self.assertEqual(list(again.mask_outputs), [3])


class TestStagesCompose(unittest.TestCase):
    STAGES = ("load", "preprocess", "prompts", "infer", "stream", "postprocess", "invert")

    def _spied(self, stack: contextlib.ExitStack) -> dict[str, int]:
        """Count the calls of each stage method, keeping what it does."""
        calls = dict.fromkeys(self.STAGES, 0)
        for name in self.STAGES:
            real = getattr(Vista3DPipeline, name)

            def spy(self_, *args, _name=name, _real=real, **kwargs):
                calls[_name] += 1
                return _real(self_, *args, **kwargs)

            stack.enter_context(mock.patch.object(Vista3DPipeline, name, spy))
        return calls

    def test_segment_is_its_stages(self):
        """``segment`` runs the pipeline's own stage methods, each once, and gives what they give by hand."""
        img, aff, _ = phantom((30, 28, 24), np.eye(3), (1.2, 1.0, 1.5))
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "ct.nii.gz"
            nib.save(nib.Nifti1Image(img, aff), src)
            aff = nib.load(src).affine  # as the file stores it
            image = torch.from_numpy(img)[None]
            pipe = _pipe(StubVista(HU), streaming=False)
            x, record = pipe.preprocess(image, aff)
            logits, _ = pipe.infer(x, [1, 3])
            by_stage = pipe.invert(pipe.postprocess(logits, [1, 3])[0], record)
            self.assertTrue({1, 3} <= set(torch.unique(by_stage).tolist()))
            expected = {False: {"infer": 1, "postprocess": 1, "stream": 0}, True: {"infer": 0, "postprocess": 0,
                                                                                     "stream": 1}}
            for streaming in (False, True):
                with contextlib.ExitStack() as stack:
                    calls = self._spied(stack)
                    result = pipe.replace(streaming=streaming).segment(image, aff, classes=[1, 3])
                torch.testing.assert_close(result.labels, by_stage)
                self.assertIsNone(result.geometry)  # a tensor has no file geometry
                self.assertEqual(calls, {"load": 0, "preprocess": 1, "prompts": 1, "invert": 1,
                                         **expected[streaming]})
            with contextlib.ExitStack() as stack:
                calls = self._spied(stack)
                written = pipe.segment_file(src, Path(tmp) / "out", classes=[1, 3])
            self.assertEqual((calls["load"], calls["invert"]), (1, 1))
            np.testing.assert_array_equal(written.geometry.affine, aff)
            self.assertEqual((list(written.timings)[0], list(written.timings)[-1]), ("load", "save"))
            np.testing.assert_array_equal(np.asarray(nib.load(written.output).dataobj), by_stage.numpy())


class TestPipelineErrors(unittest.TestCase):
    def setUp(self):
        self.img, self.aff, _ = phantom((32, 32, 24), np.eye(3), (1.0, 1.0, 1.0))
        self.pipe = _pipe(StubVista(HU))

    @parameterized.expand([
        ("unknown_name", dict(classes="livr"), "did you mean 'liver'"),
        ("id_out_of_range", dict(classes="1,200"), "out of range"),
        ("point_outside", dict(points=[[40, 3, 3]], point_labels=[1]), "outside the image"),
        ("points_without_labels", dict(points="3,3,3"), "without labels"),
        ("labels_without_points", dict(point_labels="1"), "without points"),
        ("label_count", dict(points="3,3,3;4,4,4", point_labels="1"), "2 points but 1 point labels"),
        ("bad_label", dict(points="3,3,3", point_labels="5"), "1 \\(positive\\) or 0"),
        ("two_classes_with_points", dict(points="16,16,12", point_labels="1", classes="1,3"), "at most one class"),
    ])
    def test_prompt_errors(self, _, kwargs, msg):
        with self.assertRaisesRegex(Vista3DInputError, msg):
            self.pipe(torch.from_numpy(self.img), self.aff, **kwargs)

    def test_point_in_the_air(self):
        img, aff, _ = phantom((80, 80, 24), np.eye(3), (1.0, 1.0, 1.0))  # air beyond the crop margin
        with self.assertRaisesRegex(PromptError, "outside the body"):
            self.pipe(torch.from_numpy(img), aff, points="0,0,5", point_labels="1")

    def test_constant_image(self):
        with self.assertRaisesRegex(EmptyForegroundError, "nothing to segment"):
            self.pipe(torch.full((20, 20, 20), -1000.0), np.eye(4))

    def test_output_equal_to_input_and_unwritable(self):
        with tempfile.TemporaryDirectory() as tmp:
            blocker = Path(tmp) / "a_file"
            blocker.write_text("x")
            src = Path(tmp) / "ct.nii.gz"
            nib.save(nib.Nifti1Image(self.img, self.aff), src)
            with self.assertRaisesRegex(Vista3DOutputError, "cannot create the output folder"):
                self.pipe.segment_file(src, blocker / "sub")
            with self.assertRaisesRegex(Vista3DInputError, "no such file"):
                self.pipe.segment_file(Path(tmp) / "missing.nii.gz", tmp)
        with self.assertRaisesRegex(ValueError, "sw_batch_size"):
            _pipe(StubVista(HU), sw_batch_size=0)


class RecordingStub(StubVista):
    """The stub network, keeping the point labels and window sizes it was called with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.point_labels_seen, self.windows_seen = [], []

    def forward(self, input_images, *args, point_labels=None, **kwargs):
        if point_labels is not None:
            self.point_labels_seen.append(point_labels.flatten().tolist())
        self.windows_seen.append(tuple(input_images.shape[2:]))
        return super().forward(input_images, *args, point_labels=point_labels, **kwargs)


class TestPromptsAndOptions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.img, cls.aff, _ = phantom((40, 40, 36), np.eye(3), (1.0, 1.0, 1.0))

    @parameterized.expand([
        ("special_class", "25", [3, 2]),  # a vessel / tumour class of the bundle: labels 0/1 become 2/3
        ("ordinary_class", "1", [1, 0]),
        ("no_class", None, [1, 0]),
    ])
    def test_special_classes_shift_point_labels(self, _, classes, expected):
        net = RecordingStub({1: 300.0, 25: 300.0})
        pipe = _pipe(net)
        pipe.segment(torch.from_numpy(self.img), self.aff, classes=classes, points="20,20,18;3,20,18",
                     point_labels="1,0")
        self.assertTrue(net.point_labels_seen)
        self.assertTrue(all(seen == expected for seen in net.point_labels_seen), net.point_labels_seen)

    @parameterized.expand([
        ("int", 32, (32, 32, 32)),
        ("tuple", (32, 32, 16), (32, 32, 16)),
        ("list", [16] * 3, (16,) * 3),
    ])
    def test_roi_size_forms(self, _, roi, expected):
        net = RecordingStub(HU)
        pipe = _pipe(net, roi_size=roi)
        self.assertEqual(pipe.roi_size, expected)
        pipe.segment(torch.from_numpy(self.img), self.aff, classes="liver")
        self.assertEqual(set(net.windows_seen), {expected})

    @parameterized.expand([("not_16", {"roi_size": 50}, "roi_size must be one or three positive multiples of 16"),
                           ("two_values", {"roi_size": (32, 32)}, "roi_size must be"),
                           ("embed_dim", {"network_kwargs": {"encoder_embed_dim": 7}},
                            "encoder_embed_dim must be a positive multiple of 8, got 7")])
    def test_vista3d_options_checked_up_front(self, _, kwargs, msg):
        with self.assertRaisesRegex(Vista3DInputError, msg):
            Vista3DPipeline(device="cpu", warn_random=False, **{"roi_size": 32, **kwargs})

    def test_options_object_and_keywords_agree(self):
        opts = PipelineOptions(roi_size=32, overlap=0.5, sw_batch_size=2, output_dtype="int16", per_class=True)
        by_object = _pipe(StubVista(HU), options=opts)
        by_keyword = _pipe(StubVista(HU), roi_size=32, overlap=0.5, sw_batch_size=2, output_dtype="int16",
                           per_class=True)
        for name in ("roi_size", "overlap", "sw_batch_size", "output_dtype", "per_class", "amp", "streaming"):
            self.assertEqual(getattr(by_object, name), getattr(by_keyword, name), name)
        self.assertEqual(by_object.roi_size, (32, 32, 32))
        self.assertEqual(_pipe(StubVista(HU), options=opts, overlap=0.25).overlap, 0.25)  # a keyword overrides
        with self.assertRaises(TypeError):
            _pipe(StubVista(HU), no_such_option=1)

    def test_folder_is_not_an_image(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(Vista3DInputError, "is a folder, not an image"):
                _pipe(StubVista(HU)).segment_file(tmp, Path(tmp) / "out")


class TestWindowAddFollowsTheFusedPath(unittest.TestCase):
    """The stitch's Triton window add is on for a network fused with it, and off otherwise (``--no-fuse``)."""

    @parameterized.expand([("fused", True, True), ("fused_without_add", False, False), ("module_path", None, False)])
    def test_class_path(self, _, window_add, on):
        from unittest import mock

        from monai.inferers import window_add as kernel
        from monai.networks.kernels.dispatch import FusedConfig

        model = tiny_vista3d_with_recorded_weights()
        if window_add is not None:
            model.fuse(FusedConfig(window_add=window_add))
            model._use_fused = lambda image: False  # forwards on the module path: the stitch is what is tested
        pipe = _pipe(model, roi_size=32, streaming=False, warn_random=False)
        img, aff, _ = phantom((36, 34, 30), np.eye(3), (1.0, 1.0, 1.0))
        with mock.patch.object(kernel, "add_window_supported", return_value=True):  # as on a GPU with Triton
            with mock.patch.object(kernel, "add_window", side_effect=lambda t, s, w=None: t.add_(s * w)) as spy:
                pipe.segment(torch.from_numpy(img), aff, classes=[1])
        self.assertEqual(spy.call_count > 0, on)


if __name__ == "__main__":
    unittest.main()
