# the same warm H100, 6e53fff: up4w2s against the default at 20 repeats. up_ab.txt: a list naming a choice twice
# (the script stops at the second; the one-window rows came before it); up_ab2.txt: each once, up4w2s first
export PYTHONPATH=$PWD:/tmp/deps; mkdir -p $OUT
python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 1,14 --triton-conv default,up4w2s,up2s,default,up4w2s --repeats 20 --json $OUT/up_ab.json 2>&1 | tee $OUT/up_ab.txt
python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --triton-conv up4w2s,default --repeats 20 --json $OUT/up_ab2.json 2>&1 | tee $OUT/up_ab2.txt
