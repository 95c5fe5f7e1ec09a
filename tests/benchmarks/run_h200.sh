#!/usr/bin/env bash
# The H200 measurements recorded in docs/benchmarks.md, one run per name (named by what it measures).
# Usage (on the GPU machine, from the repository root): bash tests/benchmarks/run_h200.sh OUTDIR RUN [RUN ...]
#   everything            fork (fused path) vs upstream everything-segmentation, full logits, sw_batch_size 1,4,14,auto
#   everything_stitch     the same at sw_batch_size 14 and auto only, without the logit comparison (quicker)
#   everything_bench      the same with cudnn.benchmark on in both (upstream's best with cuDNN's own autotuning)
#   fused                 the fused forward vs the module path and its cuDNN variant (bs 1,2,14), its kernels, kernel profiles (bs 1, 14)
#   fused_variants        the fused forward with each choice of Triton convolutions (bs 1, 14) and a kernel profile
#   fused_resident        the fused forward with and without the resident-weight Gluon convolution, and on cuDNN (bs 1, 2, 14), profiles (bs 1, 14)
#   fused_loads           the fused forward with the resident kernel's slab loads (where this Triton builds them) and its patch loads (bs 1, 14)
#   mma_forms             the tensor cores' rate for a 48 -> 48 channel tap in each operand form: the resident kernel's 64-padded
#                         shared-memory form against 32 + 16 output channels with the voxels in registers (experiments/gluon_conv3d)
#   overlap_taps          the resident convolution with its weights K-major, the taps' rows overlapping (126 KB instead of
#                         166 KB), 4 or 3 slabs in flight and a staging buffer per plane, checked against float64 and
#                         timed beside the resident kernel (experiments/gluon_conv3d/overlap_taps.py; issue 50, item 4)
#   voxel_rows            the resident convolution with voxels as the MMA's rows (no padding channels multiplied), checked
#                         against float64 and timed beside the resident kernel (~200 s)
#   fused_idle            kernel profiles of the fused forward at 1 and 14 windows: the idle GPU before each kind of kernel, and
#                         the forward's time without the profiler (issue 50, item 4: the idle GPU at one window)
#   fused_idle_eager      the same at 1 window without CUDA graphs (the torch profiler's overhead sets the pace there)
#   quartered96           a 96-channel convolution as four resident 48-channel ones against the Triton kernel, 64^3
#                         at 14 and 1 windows (experiments/gluon_conv3d/quartered96.py)
#   apply_bandwidth       the norm's apply pass in GB/s by launch at the forward's two widest shapes (experiments/)
#   upsample_launches     the top level's upsampling kernel by launch (one to three programs per SM) against
#                         cuDNN and the add, 14 windows (experiments/); then the forward with its two candidates and the
#                         96-channel convolutions' two launches of two programs per SM (96w4s2, 96x8x8), and the four pairs
#   fused_candidates      the forward at 14 and 1 windows with the class features' norm as its own pass (normpass), the 96-channel
#                         convolutions as four resident ones (resident96) and their launch candidates, beside the default
#   graph_launch          a replayed graph's idle GPU before its first kernel by its size, and with cuDNN's or cuBLAS's memset
#                         nodes in it (experiments/graph_launch.py; the 190 us before one window's graph)
#   graph_start           the forward's own graph: its nodes by type (DOT), the copy and replays timed, one replay's trace
#   ncu_conv              Nsight Compute sections of the Triton convolution forms (tests/benchmarks/ncu_conv3d.py)
#   ncu_resident          Nsight Compute sections (incl. warp stalls) of the resident-weight convolution
#   fused_memory          the allocator's history of one 14-window fused forward (memory_snapshot.pickle; peak per window)
#   fused_conv            the Triton convolution (padded, real-channel, norm folded in) against cuDNN, 48 and 96 ch
#   fused_cudnn_bench     the fused forward with cudnn.benchmark on (cuDNN times its algorithms per shape)
#   fused_kernels         single kernels at 14 x 48 x 128^3: cuDNN convolutions, the norm's statistics and apply passes
#   fused_batches         the fused forward at window batches 8, 14 and 20 (where the fork's best batch lies)
#   fused_graphs14        the fused forward at 14 windows replayed as a CUDA graph (the default stops at 4)
#   gluon_resident        the resident-weight Gluon convolution against float64 and the Triton kernel (experiments/gluon_conv3d)
#   pytest_fused          the fused kernels' and the fused network's tests on the GPU (pytest_kernels + pytest_fused_net)
#   pytest_kernels        the kernels' tests alone (tests/networks/kernels);  pytest_fused_net: the fused network's
#   trained_agreement     labels of the fused path, the module path and upstream on a VISTA3D trained on the phantom
#                         (sw_batch_size 14, then the same weights at 1)
#   streaming512_fused    512^3, 117 classes, the fused network: float32 accumulators at bs 1, 2; fp16 at 14
#   clicks                click latency on the 512x512x200 phantom: 1 click and a 5-click session, fused vs module
#                         vs upstream (issue 26); clicks_trained: the same with the phantom-trained weights
#   clicks_profile        the fused 5-click sequence with its second click under torch.profiler (issue 50, item 3)
#   click_agreement       click results (5 organs, negatives, special class, edit, sequence) fused vs module vs
#                         upstream on the phantom-trained network (trains it first, as trained_agreement, if needed)
#   pytest_clicks         the clicks' fused tests and the session's on the GPU
#   serve                 vista3d serve over the socket, 1/4/16 concurrent clients, the published-size network
#                         (issue 36); needs the 'serve' extra's wheels (fastapi, uvicorn, httpx, ...) in .wheels/
#   slicer_clicks         3D Slicer's MONAI Label clicks over the socket (upload, then 5-click sequences) against the
#                         in-process Vista3DSession, the published-size network (issue 49); the serve wheels too
#   class_head            the broadcast class head against upstream's loop (PR 01)
#   class_memory          peak memory of class-only, point-only and mixed prompts (PR 02)
#   sw_timing             the sliding-window stage timings (PR 03)
#   pipeline              `python -m monai.apps.vista3d benchmark` (file -> label map, per stage)
#   streaming256          streamed label maps at 256^3, 117 and 1 classes
#   streaming512          streamed label maps at 512^3, 117 classes
#   streaming512_117      512^3, 117 classes, fp16 accumulators, sw_batch_size 2,4,14, 20 runs
#   streaming512_1        512^3, 1 class, sw_batch_size 2,14, 20 runs
#   streaming256_bs2      256^3, 117 and 1 classes at sw_batch_size 2, 20 runs
#   streaming512_fp32     512^3, 117 classes, float32 accumulators, sw_batch_size 1,2, 20 runs
#   streaming512_cap80    512^3 on an 80 GiB card (allocator capped), fp16 accumulators
#   streaming512_cap80_acc  the same with float32 and fp16 accumulators
#   streaming512_masks    512^3, 117 classes, fused: label map alone vs with per-class masks, peak and time (issue 26)
#   forward_batch         network forward cost per window at several window batches
#   batch_1gpu            batch throughput (volumes per minute) of run_batch on one GPU
#   batch_scaling         the README's folder command over 1, 2 and 4 processes (torchrun; those the GPUs allow), fresh
#                         commands, volumes per minute and percent of linear (issue 50, item 6; SCALING_VOLUMES, default 96)
#   batch_agreement       how far upstream's own label map moves with sw_batch_size alone
#   setup                 only the installs (then run a script by hand with PYTHONPATH=$PWD:/tmp/deps)
#   pytest_gpu_apps       the app's tests and the fused network's on the GPU, 12 xdist workers
#   pytest_gpu            the whole unit suite on the GPU, 12 pytest-xdist workers (the image has xdist; Triton
#                         compiles on the host's cores: ~250 s where the tests' kernels were compiled before, over 330 s
#                         where they compile), bar the tests of SimpleITK and schemathesis (NOT_CARRIED);  pytest_gpu_quick: without the slow tests
#   end_to_end            file in, label map out: the fork against the bundle's pipeline on two CTs (issue 15)
#   startup_profile       the vista3d command's steps in fresh processes (experiments/process_timeline.py), then
#                         under cProfile, fused and --no-fuse, bytecode and kernel cache warm (issue 50, item 2)
#   startup_auto          startup_profile's timelines, each beside one of the command with --sw-batch-size auto
#   startup_base          startup_profile at the commit BASE_REV (a git worktree), beside startup_profile in one call
#   windows_gpu_busy      after startup_profile: the command's streamed pass under torch.profiler, how busy the GPU is after
#                         the first window (experiments/windows_gpu_busy.py)
#   weights_to_gpu        after startup_profile: the checkpoint's copy to the GPU in fresh processes, serial, on threads,
#                         through one pinned buffer (experiments/weights_to_gpu.py)
#   placeholder_window    the timelines of startup_profile, each beside one where a placeholder network of the same width
#                         runs one window while the checkpoint loads (experiments/placeholder_window.py)
#   startup_graphs        the timelines of startup_profile, each beside one with CUDA graphs for the one CT's windows
#   cold_start            the vista3d command in fresh processes: cold and warm kernel caches, --no-fuse, auto, six CTs,
#                         against the bundle's one-shot process and a bare torch start (issue 24)
#   clicks_across_processes  the slicer benchmark's in-process clicks in fresh processes, cuDNN autotuning on and
#                         off: do the masks repeat across processes? (issue 50, item 3)
#   network_beside_load   the network's build from its checkpoint alone and beside the CT's load and the weights' hash
#   cold_quick            cold_start's warm rows only (baseline, package, warm, --no-fuse, auto), taking turns, 5 each
#                         (COLD_REPEATS): issue 50's goal 2
#   nifti_io              NIfTI load/save against nibabel's defaults on the host's cores (issue 15)
#   dicom_statistics      117 structures' statistics and the preview of a 512x512x300 label map on the GPU (issue 48)
#   nifti_load_stages     where loading a 512x512x480 CT goes: read, inflate (isal; rapidgzip 1-16 threads), load_image CPU/GPU
#   label_map_transfer    a GPU label map saved by one serial host copy or by slabs on the compressing threads; rapidgzip's
#                         chunk sizes, load_image to the GPU staged or through a whole-volume buffer, the bare copies,
#                         on a 512x512x200 CT (experiments/label_map_transfer.py, issue 50, item 5)
# Expects the wheels of upstream MONAI 1.6.1, nibabel, parameterized, isal and rapidgzip in .wheels/ (no registry);
# scikit-image and lazy_loader too for upstream's click paths (without them the click benchmarks give upstream a
# scipy stand-in for its component labelling, and say so).
set -u
if [ $# -lt 2 ]; then sed -n '2,97p' "$0"; exit 2; fi
out=$1; shift; mkdir -p "$out"
pip install -q --no-deps --no-index --target /tmp/up .wheels/monai-1.6.1-py3-none-any.whl >/dev/null 2>&1
pip install -q --no-deps --no-index --target /tmp/deps .wheels/nibabel-*.whl .wheels/parameterized-*.whl >/dev/null 2>&1
pip install -q --no-deps --no-index --target /tmp/deps .wheels/isal-*.whl >/dev/null 2>&1  # else zlib (slower gzip)
pip install -q --no-deps --no-index --target /tmp/deps .wheels/rapidgzip-*.whl >/dev/null 2>&1  # else one inflate thread
pip install -q --no-deps --no-index --target /tmp/deps .wheels/scikit_image-*.whl .wheels/lazy_loader-*.whl >/dev/null 2>&1
pip install -q --no-index --find-links .wheels --target /tmp/deps fastapi uvicorn httpx python-multipart >/dev/null 2>&1  # serve
pip install -q --no-deps --no-index --target /tmp/deps .wheels/pynrrd-*.whl >/dev/null 2>&1  # NRRD images (the image has numpy)
pip install -q --no-deps --no-index --target /tmp/deps .wheels/pydicom-*.whl .wheels/highdicom-*.whl .wheels/pyjpegls-*.whl .wheels/pillow-*.whl >/dev/null 2>&1  # dicom
export PYTHONPATH=$PWD:/tmp/deps
step() { name=$1; lim=$2; shift 2; echo "=== $name: $*" | tee -a "$out/log.txt"; s=$(date +%s)
  timeout "$lim" "$@" > "$out/$name.txt" 2>&1; echo "rc=$? $(( $(date +%s) - s )) s" | tee -a "$out/log.txt"; tail -n 25 "$out/$name.txt"; }
UP="--device cuda --upstream /tmp/up"
S512="--sizes 512x512x512 --acc-dtypes float16 --full-repeats 1 --full-sw-batch-size 14"
STREAM="python3 tests/benchmarks/vista3d_streaming.py $UP"
# what needs wheels too large to travel beside the others (SimpleITK 53 MB; schemathesis and its tree): CPU-only checks
NOT_CARRIED="--ignore=tests/apps/vista3d/server/test_openapi.py --deselect tests/apps/vista3d/test_dicom_read.py::TestDicomRead::test_same_volume_as_nifti_and_simpleitk --deselect tests/apps/vista3d/test_dicom_read.py::TestDicomRead::test_more_slices_and_rows_than_a_tile --deselect tests/apps/vista3d/test_dicom_read.py::TestDicomRead::test_rescale_of_each_slice --deselect tests/benchmarks/test_benchmark_scripts.py::TestBenchmarkScriptsRun::test_runs_6_dicom_read --deselect tests/apps/vista3d/test_nrrd_write.py::TestSaveNrrd::test_read_by_simpleitk_as_3d_slicer_reads_it"
KTESTS="python3 -m pytest -q -p no:cacheprovider tests/networks/kernels"
NTESTS="python3 -m pytest -q -p no:cacheprovider tests/networks/test_vista3d_fused.py"
for run in "$@"; do
  case "$run" in
  everything) step everything 240 python3 tests/benchmarks/vista3d_everything.py $UP --sw-batch-sizes 1,4,14,auto --compare-logits --json "$out/everything.json" ;;
  everything_stitch) step everything_stitch 150 python3 tests/benchmarks/vista3d_everything.py $UP --sw-batch-sizes 14,auto --json "$out/everything_stitch.json" ;;
  everything_bench) step everything_bench 240 python3 tests/benchmarks/vista3d_everything.py $UP --sw-batch-sizes 1,4,14,auto --cudnn-benchmark --json "$out/everything_bench.json" ;;
  class_head) step class_head 60 python3 tests/benchmarks/vista3d_class_head.py --device cuda --size 128 --json "$out/class_head.json" ;;
  class_memory) step class_memory 60 python3 tests/benchmarks/vista3d_class_only_memory.py --device cuda --size 128 --modes class,points,mixed --json "$out/class_memory.json" ;;
  sw_timing) step sw_timing 90 python3 tests/benchmarks/sliding_window_timing.py --device cuda --json "$out/sw_timing.json" ;;
  fused) step fused 240 python3 tests/benchmarks/vista3d_fused.py --device cuda --kernels --forward --sw-batch-sizes 1,2,14 --triton-conv default,cudnn --profile 1,14 --json "$out/fused.json" ;;
  fused_cudnn_bench) step fused_cudnn_bench 200 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --cudnn-benchmark --sw-batch-sizes 1,2,14 --profile 1 --json "$out/fused_cudnn_bench.json" ;;
  fused_kernels) step fused_kernels 120 python3 tests/benchmarks/vista3d_fused.py --device cuda --kernels --json "$out/fused_kernels.json" ;;
  fused_batches) step fused_batches 200 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 8,14,20 --triton-conv default --json "$out/fused_batches.json" ;;
  fused_graphs14) step fused_graphs14 200 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --graph-max-windows 14 --sw-batch-sizes 14 --profile 14 --json "$out/fused_graphs14.json" ;;
  mma_forms) step mma_forms 120 python3 tests/benchmarks/experiments/gluon_conv3d/mma_forms.py ;;
  fused_idle) step fused_idle 120 python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1,14 ;;
  fused_idle_eager) step fused_idle_eager 90 python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1 --graph-max-windows 0 ;;
  fused_candidates) step fused_candidates 300 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --triton-conv default,normpass,resident96,96p2,96p2s2,96x8s4 --repeats 5 --json "$out/fused_candidates.json" ;;
  fused_loads) step fused_loads 240 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 1,14 --triton-conv default,patches --json "$out/fused_loads.json" ;;
  fused_resident) step fused_resident 300 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 1,2,14 --triton-conv default,noresident,cudnn --profile 1,14 --json "$out/fused_resident.json" ;;
  fused_variants) step fused_variants 300 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 1,14 --triton-conv default,cudnn,64s2+128s,64s2w8+128s,64s2x16+128s,64s4+128s,64s2w8+128s2 --profile 14 --json "$out/fused_variants.json" ;;
  ncu_resident) step ncu_resident 240 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats -k regex:_resident_conv --launch-skip 1 --launch-count 3 python3 tests/benchmarks/ncu_conv3d.py --resident ;;
  ncu_conv) step ncu_conv 200 ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:_conv_kernel python3 tests/benchmarks/ncu_conv3d.py ;;
  fused_memory) step fused_memory 120 python3 tests/benchmarks/vista3d_fused.py --device cuda --sw-batch-sizes 14 --memory-snapshot "$out/memory_snapshot.pickle" ;;
  fused_conv) step fused_conv 400 python3 tests/benchmarks/vista3d_fused.py --device cuda --conv --json "$out/fused_conv.json" ;;
  streaming512_fused) step streaming512_fused 300 $STREAM --fuse --sizes 512x512x512 --classes 117 --sw-batch-size 1,2,14 --acc-dtypes float32 --repeats 3 --full-repeats 1 --full-sw-batch-size 14 --json "$out/streaming512_fused.json" ;;
  clicks) step clicks 400 python3 tests/benchmarks/vista3d_clicks.py $UP --repeats 10 --clicks 5 --json "$out/clicks.json" ;;
  clicks_profile) step clicks_profile 200 python3 tests/benchmarks/vista3d_clicks.py --device cuda --repeats 3 --clicks 5 --profile-click 2 --json "$out/clicks_profile.json" ;;
  clicks_trained) [ -f /tmp/trained_vista3d.pt ] || { echo "clicks_trained: run trained_agreement first (it writes /tmp/trained_vista3d.pt)"; continue; }
    step clicks_trained 400 python3 tests/benchmarks/vista3d_clicks.py $UP --checkpoint /tmp/trained_vista3d.pt --json "$out/clicks_trained.json" ;;
  click_agreement) CA="python3 tests/benchmarks/vista3d_click_agreement.py $UP"
    [ -f /tmp/trained_vista3d.pt ] || step trained_agreement 400 python3 tests/benchmarks/vista3d_trained_agreement.py $UP --checkpoint /tmp/trained_vista3d.pt --steps 560 --train-seconds 200 --json "$out/trained_agreement.json"
    step click_agreement 500 $CA --checkpoint /tmp/trained_vista3d.pt --point-steps 400 --train-seconds 150 --json "$out/click_agreement.json" ;;
  serve) step serve 570 python3 tests/benchmarks/vista3d_serve.py --device cuda --weights-size published --json "$out/serve.json" ;;
  slicer_clicks) step slicer_clicks 570 python3 tests/benchmarks/vista3d_slicer_clicks.py --device cuda --weights-size published --json "$out/slicer_clicks.json" ;;
  pytest_clicks) step pytest_clicks 300 python3 -m pytest -q -p no:cacheprovider tests/networks/test_vista3d_fused.py tests/apps/vista3d/test_session.py tests/networks/kernels/test_graph_cache.py ;;
  graph_launch) step graph_launch 60 python3 tests/benchmarks/experiments/graph_launch.py ;;
  graph_start) step graph_start 90 python3 tests/benchmarks/experiments/graph_start.py --out "$out" ;;
  quartered96) step quartered96 120 bash -c "python3 tests/benchmarks/experiments/gluon_conv3d/quartered96.py --batch 14 && python3 tests/benchmarks/experiments/gluon_conv3d/quartered96.py --batch 1" ;;
  apply_bandwidth) step apply_bandwidth 120 python3 tests/benchmarks/experiments/apply_bandwidth.py --batch 14 ;;
  upsample_launches) step upsample_launches 150 python3 tests/benchmarks/experiments/upsample_launches.py --batch 14
    step upsample_forward 300 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --triton-conv default,up4w2s,up8x8,96w4s2,96x8x8,up4w2s+96w4s2,up4w2s+96x8x8,up8x8+96w4s2,up8x8+96x8x8 --repeats 5 --json "$out/upsample_forward.json" ;;
  overlap_taps) step overlap_taps 300 python3 tests/benchmarks/experiments/gluon_conv3d/overlap_taps.py ;;
  voxel_rows) step voxel_rows 240 python3 tests/benchmarks/experiments/gluon_conv3d/voxel_rows.py ;;
  gluon_resident) step gluon_resident 200 python3 tests/benchmarks/experiments/gluon_conv3d/resident_weights.py ;;
  pytest_fused) step pytest_kernels 450 $KTESTS; step pytest_fused_net 200 $NTESTS ;;
  pytest_kernels) step pytest_kernels 450 $KTESTS ;;
  pytest_fused_net) step pytest_fused_net 200 $NTESTS ;;
  trained_agreement) TA="python3 tests/benchmarks/vista3d_trained_agreement.py $UP --checkpoint /tmp/trained_vista3d.pt"
    step trained_agreement 400 $TA --steps 560 --train-seconds 200 --json "$out/trained_agreement.json"
    step trained_agreement_bs1 200 $TA --steps 0 --sw-batch-size 1 --json "$out/trained_agreement_bs1.json" ;;
  pipeline) step pipeline 90 python3 -m monai.apps.vista3d benchmark --device cuda --json "$out/pipeline.json" ;;
  streaming256) step streaming256 130 $STREAM --sizes 256x256x256 --classes 117,1 --repeats 20 --json "$out/streaming256.json" ;;
  streaming512) step streaming512 120 $STREAM --sizes 512x512x512 --classes 117 --repeats 5 --full-repeats 1 --acc-dtypes float16 --json "$out/streaming512.json" ;;
  streaming512_117) step streaming512_117 480 $STREAM $S512 --classes 117 --sw-batch-size 2,4,14 --repeats 20 --json "$out/streaming512_117.json" ;;
  streaming512_1) step streaming512_1 280 $STREAM $S512 --classes 1 --sw-batch-size 2,14 --repeats 20 --json "$out/streaming512_1.json" ;;
  streaming256_bs2) step streaming256_bs2 120 $STREAM --sizes 256x256x256 --classes 117,1 --acc-dtypes float16 --sw-batch-size 2 --full-sw-batch-size 14 --repeats 20 --json "$out/streaming256_bs2.json" ;;
  streaming512_fp32) step streaming512_fp32 480 $STREAM $S512 --classes 117 --sw-batch-size 1,2 --repeats 20 --acc-dtypes float32 --no-fork-full --json "$out/streaming512_fp32.json" ;;
  streaming512_cap80) step streaming512_cap80 400 $STREAM $S512 --classes 117 --sw-batch-size 2 --repeats 3 --no-fork-full --memory-cap-gib 80 --json "$out/streaming512_cap80.json" ;;
  streaming512_masks) step streaming512_masks 540 python3 tests/benchmarks/vista3d_streaming.py --device cuda --fuse --sizes 512x512x512 --classes 117 --sw-batch-size 1,2,14 --acc-dtypes float32,float16 --repeats 2 --no-fork-full --per-class --json "$out/streaming512_masks.json" ;;
  streaming512_cap80_acc) step streaming512_cap80_acc 400 $STREAM $S512 --classes 117 --sw-batch-size 2 --repeats 1 --acc-dtypes float32,float16 --no-fork-full --memory-cap-gib 80 --json "$out/streaming512_cap80_acc.json" ;;
  forward_batch) step forward_batch 90 python3 tests/benchmarks/vista3d_forward_batch.py --device cuda --sw-batch-sizes 1,2,4,8,14 --profile 1,4 --json "$out/forward_batch.json" ;;
  batch_1gpu) step batch_1gpu 120 python3 tests/benchmarks/batch_throughput.py --volumes 16 --size 256,256,176 --device cuda --workdir /tmp/bt --json "$out/batch_1gpu.json" ;;
  batch_scaling) step batch_scaling 570 python3 tests/benchmarks/batch_scaling.py --ranks 1,2,4 --volumes ${SCALING_VOLUMES:-96} --workdir /tmp/scal$$ --json "$out/batch_scaling.json" ;;
  batch_agreement) PYTHONPATH=/tmp/up:$PYTHONPATH step batch_agreement 240 python3 tests/benchmarks/vista3d_batch_agreement.py --device cuda --sizes 256x256x256,512x512x512 --sw-batch-sizes 14,1,2 --json "$out/batch_agreement.json" ;;
  end_to_end) step end_to_end 570 python3 tests/benchmarks/vista3d_end_to_end.py $UP --repeats 3 --workdir /tmp/e2e --json "$out/end_to_end.json" ;;
  startup_profile) step startup_profile 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --timeline 3 --workdir /tmp/sp$$ --out "$out/startup_prof" ;;
  startup_auto) step startup_auto 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --timeline 3 --timeline-flags="--sw-batch-size auto" --workdir /tmp/spa$$ --out "$out/startup_auto_prof" ;;
  startup_base) wt=/tmp/base$$; git worktree add -f "$wt" "${BASE_REV:?set BASE_REV to the commit to compare with}" >/dev/null 2>&1 || { echo "startup_base: no worktree of $BASE_REV"; continue; }
    (cd "$wt" && export PYTHONPATH=$wt:/tmp/deps && step startup_base 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --timeline 3 --workdir /tmp/spb$$ --out "$out/startup_base_prof") ;;
  windows_gpu_busy) [ -f /tmp/sp$$/model.pt ] || { echo "windows_gpu_busy: run startup_profile first in this call (its inputs and kernel cache)"; continue; }
    TRITON_CACHE_DIR=/tmp/sp$$/triton_cache step windows_gpu_busy 120 python3 tests/benchmarks/experiments/windows_gpu_busy.py -- -i /tmp/sp$$/cts/ct0.nii.gz -o /tmp/sp$$/out_busy --weights /tmp/sp$$/model.pt --device cuda --overwrite ;;
  weights_to_gpu) [ -f /tmp/sp$$/model.pt ] || { echo "weights_to_gpu: run startup_profile first in this call (its checkpoint)"; continue; }
    step weights_to_gpu 150 python3 tests/benchmarks/experiments/weights_to_gpu.py --weights /tmp/sp$$/model.pt --repeats 3 ;;
  placeholder_window) step placeholder_window 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --timeline 3 --timeline-script placeholder_window.py --workdir /tmp/spw$$ --out "$out/placeholder_window_prof" ;;
  startup_graphs) step startup_graphs 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --timeline 3 --timeline-config graph_max_windows=4 --workdir /tmp/sg$$ --out "$out/startup_graphs_prof" ;;
  cold_start) step cold_start 570 python3 tests/benchmarks/vista3d_cold_start.py $UP --repeats 3 --workdir /tmp/cold$$ --json "$out/cold_start.json" ;;
  clicks_across_processes) step clicks_across_processes 300 python3 tests/benchmarks/experiments/clicks_across_processes.py --device cuda --processes 2 ;;
  cuda_init_beside_imports) step cuda_init_beside_imports 120 python3 tests/benchmarks/experiments/cuda_init_beside_imports.py --repeats 3 ;;
  network_beside_load) step network_beside_load 120 python3 tests/benchmarks/experiments/network_beside_load.py --workdir /tmp/nbl$$ ;;
  cold_quick) step cold_quick 300 python3 tests/benchmarks/vista3d_cold_start.py --device cuda --quick --repeats ${COLD_REPEATS:-5} --workdir /tmp/coldq$$ --json "$out/cold_quick.json" ;;
  nifti_io) step nifti_io 570 python3 tests/benchmarks/nifti_io.py --repeat 5 --json "$out/nifti_io.json" ;;
  label_map_transfer) step label_map_transfer 150 python3 tests/benchmarks/experiments/label_map_transfer.py --repeats 7 ;;
  nifti_load_stages) step nifti_load_stages 300 python3 tests/benchmarks/nifti_load_stages.py --repeat 5 --device cuda --json "$out/nifti_load_stages.json" ;;
  dicom_statistics) step dicom_statistics 90 python3 -m tests.benchmarks.dicom_read --device cuda --skip-readers --repeats 3 ;;
  setup) echo "installed the wheels of .wheels/ (upstream under /tmp/up, the rest under /tmp/deps)" ;;
  pytest_gpu_apps) step pytest_gpu_apps 300 python3 -m pytest tests/apps tests/networks/test_vista3d_fused.py -q -p no:cacheprovider -n 12 ;;
  pytest_gpu) step pytest_gpu 480 python3 -m pytest tests -q -p no:cacheprovider -n 12 --durations=20 $NOT_CARRIED ;;
  pytest_gpu_quick) step pytest_gpu_quick 45 python3 -m pytest tests -q -x -p no:cacheprovider -m "not slow" ;;
  *) echo "run_h200.sh: unknown run '$run' (see the list at the top of this script)" >&2; exit 2 ;;
  esac
done
# the device returns at most 8 files from $out: the profiles' .prof files (their tables are in each run's .txt) go
rm -rf "$out"/*_prof
