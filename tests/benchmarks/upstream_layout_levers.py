# Copyright (c) MONAI Consortium
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#     http://www.apache.org/licenses/LICENSE-2.0
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Layout and normalisation levers on upstream's ``vista3d132`` window batch (run with upstream on PYTHONPATH).

Variants: instance norms computed as fp32 statistics + one fp16 ``addcmul`` (instead of autocast's fp32
``instance_norm``), the whole model and input in ``channels_last_3d``, ``cudnn.benchmark``; then a CUDA
profile of the last variant by kernel.

    PYTHONPATH=/tmp/up python3 tests/benchmarks/upstream_layout_levers.py 14
"""
import sys
import torch
from monai.networks.nets import vista3d132
torch.manual_seed(0)
dev = torch.device("cuda")
net = vista3d132().to(dev).eval()
B = int(sys.argv[1]) if len(sys.argv) > 1 else 14
x = torch.rand(B, 1, 128, 128, 128, device=dev)
cv = torch.arange(1, 118, device=dev).view(-1, 1)
def run(cl=False):
    xx = x.contiguous(memory_format=torch.channels_last_3d) if cl else x
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        return net(xx, class_vector=cv, transpose=True)
def timed(fn, reps=3):
    fn(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record(); o = fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts)//2], o
res = {}
t, ref = timed(run); ref = ref.float(); res["fp16 baseline"] = (t, 0.0)
orig = {}
def fast_norm_forward(m):
    def f(x):
        dt = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled() else x.dtype
        xh = x.to(dt)
        var, mean = torch.var_mean(xh, dim=(2, 3, 4), keepdim=True, unbiased=False, dtype=torch.float32) if False else torch.var_mean(xh.float(), dim=(2, 3, 4), keepdim=True, unbiased=False)
        rstd = torch.rsqrt(var + m.eps)
        if m.weight is not None:
            scale = rstd * m.weight.view(1, -1, 1, 1, 1)
            shift = m.bias.view(1, -1, 1, 1, 1) - mean * scale
        else:
            scale, shift = rstd, -mean * rstd
        return torch.addcmul(shift.to(dt), xh, scale.to(dt))
    return f
norms = [m for m in net.modules() if isinstance(m, torch.nn.InstanceNorm3d)]
for m in norms:
    orig[m] = m.forward
    m.forward = fast_norm_forward(m)
t, o = timed(run); res[f"fp16 + fp16 instance norm ({len(norms)} norms)"] = (t, (o.float() - ref).abs().max().item()); del o
net.to(memory_format=torch.channels_last_3d)
t, o = timed(lambda: run(True)); res["+ channels_last_3d model and input"] = (t, (o.float() - ref).abs().max().item()); del o
for m in norms: m.forward = orig[m]
t, o = timed(lambda: run(True)); res["channels_last_3d, stock norms"] = (t, (o.float() - ref).abs().max().item()); del o
net.to(memory_format=torch.contiguous_format)
torch.backends.cudnn.benchmark = True
t, o = timed(run); res["stock + cudnn.benchmark"] = (t, (o.float() - ref).abs().max().item()); del o
for m in norms: m.forward = fast_norm_forward(m)
net.to(memory_format=torch.channels_last_3d)
t, o = timed(lambda: run(True)); res["fp16 norms + channels_last + cudnn.benchmark"] = (t, (o.float() - ref).abs().max().item()); del o
# profile the best variant by op
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    run(True); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
print(f"batch {B}")
for k, (t, d) in res.items():
    print(f"{k:50s} {t:8.1f} ms {t/B:7.2f} ms/window  max|dlogit| {d:.4f}")
