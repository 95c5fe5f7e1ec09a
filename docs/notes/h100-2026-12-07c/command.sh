# call 1 (H100 80GB, torch 2.11.0+cu130, Triton 3.6; working tree at d7ef186 + the voxel-rows experiment, carry .wheels)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv,noheader; bash tests/benchmarks/run_h200.sh $OUT setup mma_forms fused_idle voxel_rows 2>&1 | tail -120
# where the runs were:
#   mma_forms:  python3 tests/benchmarks/experiments/gluon_conv3d/mma_forms.py
#   fused_idle: python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1,14
#   voxel_rows: python3 tests/benchmarks/experiments/gluon_conv3d/voxel_rows.py
