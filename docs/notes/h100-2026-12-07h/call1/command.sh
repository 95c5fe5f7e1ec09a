# the whole unit suite on the GPU (H100), the working tree at 6e53fff (monai/ as at c488e50; the device's own
# `git log` printed 2fa7a18, its copy's history, not the tree's)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name,driver_version --format=csv; git log --oneline -1
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu 2>&1 | tail -60
