# two calls on the warm machine; test_openapi.py needs schemathesis, not carried (run_h200.sh NOT_CARRIED leaves it out)
# the same warm H100, the working tree with UPSAMPLE_LAUNCH = 8 x 16 voxels, 4 warps, 2 stages (the next commit)
export PYTHONPATH=$PWD:/tmp/deps; grep -n "^UPSAMPLE_LAUNCH" monai/networks/kernels/conv_transpose3d.py
python3 -m pytest -q -p no:cacheprovider -n 12 tests/networks/kernels/test_conv_transpose3d.py tests/networks/test_vista3d_fused.py tests/networks/kernels/test_dispatch.py 2>&1 | tail -5
timeout 140 python3 -m pytest -q -p no:cacheprovider -n 12 tests/apps/vista3d -k "fuse or fused or click or session" 2>&1 | tail -4
