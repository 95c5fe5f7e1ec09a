"""load_image of an uncompressed 512x512x200 int16 .nii, warm page cache: best of 5 per form."""
import sys, time, numpy as np, nibabel as nib, torch
from monai.apps.vista3d.io.nifti import load_image
p = "/tmp/bench/ct.nii"
nib.save(nib.Nifti1Image(np.random.default_rng(0).integers(-1000, 2000, (512, 512, 200), dtype=np.int16), np.eye(4)), p)
torch.set_num_threads(1)
for name, kw in (("float32 C order", {}), ("float32 file order", {"contiguous": False}), ("stored int16", {"dtype": None, "contiguous": False})):
    best = min((lambda t: (load_image(p, **kw), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(5))
    print(f"{name}: {best:.3f} s")
