# call 1 (H100 80GB, torch 2.11.0+cu130, Triton 3.6; working tree at 0011927, carry .wheels)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; bash tests/benchmarks/run_h200.sh $OUT setup fused_fold 2>&1 | tail -60
# where run_h200.sh fused_fold was (0011927):
#   python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --triton-conv nofold,fold,pdl,fold+pdl --repeats 5 --json $OUT/fused_fold.json
#   python3 -m pytest -q -p no:cacheprovider tests/networks/kernels/test_conv3d_resident.py tests/networks/test_vista3d_fused.py -k "input_norm or network_48 or against_float64 or residual_is_added or dependent"   (200 s limit: 33 passed before it)
