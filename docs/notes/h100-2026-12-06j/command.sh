# H100 80GB HBM3 (run kind nvidia-h200 or none, either card; carry .wheels), 2026-12-06, one call per folder.
export PYTHONPATH=$PWD:/tmp/deps
# call1 (main at b42e0bf): the label map's slab copies (1af1d56) against d28beda, rapidgzip's chunk sizes, file to
# file against the bundle, the suite on the GPU
BASE_REV=d28beda bash tests/benchmarks/run_h200.sh $OUT setup label_map_transfer end_to_end startup_profile startup_base pytest_gpu
# call2 (main at e677477: rapidgzip chunks sized to the file 766f374, the staged CUDA load 1541d3c, label slabs into
# pinned memory 29567dc, reverted after this call): the GPU tests of the I/O, the forms in one process, file to file,
# fresh-process timelines against b42e0bf
BASE_REV=b42e0bf bash tests/benchmarks/run_h200.sh $OUT setup label_map_transfer
python3 -m pytest -q -p no:cacheprovider -n 8 tests/apps/vista3d/test_io.py tests/apps/vista3d/test_batch_workers.py tests/apps/vista3d/test_dicom_outputs.py tests/apps/vista3d/test_gzip_readers.py > $OUT/extra.txt 2>&1
BASE_REV=b42e0bf bash tests/benchmarks/run_h200.sh $OUT end_to_end startup_profile startup_base
