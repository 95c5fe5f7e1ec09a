# HEAD's package (base_head/) against the working tree with the upsampling variants, and the GPU tests, in one call
set -u
R=$PWD
B="python3 $R/tests/benchmarks/vista3d_fused.py --device cuda --forward --repeats 5"
(cd /tmp && PYTHONPATH=$R/base_head:$R python3 -c "import monai; print('base monai:', monai.__file__)")
echo "=== new: variants"
PYTHONPATH=$R timeout 300 $B --sw-batch-sizes 14,1 --triton-conv default,upcudnn,up16x16,up4w,up128 --json $OUT/new.json 2>&1 | grep -v Warn | grep "bs\|vs\|Error" 
echo "=== base (HEAD)"
PYTHONPATH=$R/base_head:$R timeout 200 $B --sw-batch-sizes 14,1 --json $OUT/base.json 2>&1 | grep -v Warn | grep "bs\|vs\|Error"
echo "=== new default again"
PYTHONPATH=$R timeout 200 $B --sw-batch-sizes 14,1 --json $OUT/new2.json 2>&1 | grep -v Warn | grep "bs\|vs\|Error"
echo "=== GPU tests"
pip install -q --no-index --no-deps --target /tmp/deps .wheels/parameterized-*.whl 2>&1 | tail -1
PYTHONPATH=$R:/tmp/deps timeout 240 python3 -m pytest -q -p no:cacheprovider -x tests/networks/kernels/test_conv_transpose3d.py tests/networks/kernels/test_dispatch.py tests/networks/test_vista3d_fused.py 2>&1 | tail -5
