# the upsampling kernel by launch, then the forward with the launch candidates and their pairs (H100, 6e53fff)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv
bash tests/benchmarks/run_h200.sh $OUT setup upsample_launches 2>&1 | tail -120
