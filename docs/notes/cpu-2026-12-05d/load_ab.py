"""Load one CT with the io of a given source tree: python load_ab.py TREE CT.nii.gz (the CT: make_ct below).

Run for two trees alternately (git worktree add /tmp/wt_io4 67c48dd; the checkout at HEAD):
    python load_ab.py --make /tmp/ct200.nii.gz
    for t in /tmp/wt_io4 . /tmp/wt_io4 .; do python load_ab.py $t /tmp/ct200.nii.gz; done
"""
import sys
import time


def make_ct(path):
    import nibabel as nib
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = np.meshgrid(np.arange(512), np.arange(512), indexing="ij")
    body = ((x - 256) ** 2 + (y - 256) ** 2) < 200**2
    z = np.stack([np.where(body, 40 + rng.integers(-30, 30, (512, 512)), -1000) for _ in range(200)], -1)
    nib.save(nib.Nifti1Image(z.astype(np.int16), np.diag([0.78, 0.78, 2.0, 1.0])), path)


if sys.argv[1] == "--make":
    make_ct(sys.argv[2])
    sys.exit(0)
tree, path = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
from monai.apps.vista3d.io import load_image  # noqa: E402

best = {}
for name, kw in (("float32 C order", {}), ("int16 file order", {"dtype": None, "contiguous": False})):
    times = []
    for _ in range(5):
        t = time.perf_counter()
        load_image(path, **kw)
        times.append(time.perf_counter() - t)
    best[name] = round(min(times), 3)
print(tree, best)
