# One device call at main fc931c1 (the house move; issues 46, 48 goals 1-4, 49 merged), 2026-12-06, asked as nvidia-h200,
# given an NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130, Triton 3.6.0); .wheels carried (upstream monai 1.6.1 etc.)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bash tests/benchmarks/run_h200.sh $OUT setup >/dev/null 2>&1; export PYTHONPATH=$PWD:/tmp/deps
# the whole suite on the GPU, 12 xdist workers; the DICOM tests (CPU-only readers, their wheels not carried) left out
timeout 300 python3 -m pytest tests -q -p no:cacheprovider -n 12 --ignore=tests/apps/vista3d/test_dicom_read.py \
    --ignore=tests/apps/vista3d/test_dicom_outputs.py > $OUT/pytest_gpu.txt 2>&1
# labels of the fused path, the module path and upstream 1.6.1 on a VISTA3D trained on the phantom
timeout 330 python3 tests/benchmarks/vista3d_trained_agreement.py --device cuda --upstream /tmp/up \
    --checkpoint /tmp/trained_vista3d.pt --steps 560 --train-seconds 200 --json $OUT/trained_agreement.json \
    > $OUT/trained_agreement.txt 2>&1
