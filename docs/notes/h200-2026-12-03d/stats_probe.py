# diagnostic (not part of the repo): the statistics kernel with small parts on the GPU
import torch
from monai.networks.kernels import instance_norm as N
from monai.networks.kernels.instance_norm import _stats_kernel, as_rows, _check_rows
import triton

def run(x, add, rpp, stages, warps=4):
    rows = _check_rows(x)
    B, S, C = rows.shape
    n_parts = triton.cdiv(S, rpp)
    pm = torch.full((B, n_parts, C), float("nan"), device=x.device)
    pm2 = torch.full_like(pm, float("nan"))
    _stats_kernel[(n_parts, C // 64, B)](rows, as_rows(add) if add is not None else rows, pm, pm2, S, C, n_parts,
        HAS_ADDEND=add is not None, ROWS_PER_PART=rpp, BLOCK_S=64, BLOCK_C=64, num_warps=warps, num_stages=stages)
    torch.cuda.synchronize()
    return pm

for batch, channels, spatial, use_add in [(3, 128, (65, 2, 33), True), (3, 128, (65, 2, 33), False), (1, 64, (5, 7, 9), True), (1, 128, (65, 2, 33), False), (3, 64, (65, 2, 33), False)]:
    g = torch.Generator().manual_seed(channels)
    for rpp in (64, 128, 256, 4096):
        for stages in (1, 3):
            x = (torch.randn(batch, channels, *spatial, generator=g) * 2 + 3).half().cuda().contiguous(memory_format=torch.channels_last_3d)
            add = torch.randn(x.shape, generator=g).half().cuda().contiguous(memory_format=torch.channels_last_3d) if use_add else None
            total = (x + add) if use_add else x.clone()
            pm = run(x, add, rpp, stages)
            r = total.permute(0, 2, 3, 4, 1).reshape(batch, -1, channels).float()
            S = r.shape[1]; n_parts = pm.shape[1]
            ref = torch.stack([r[:, p * rpp:(p + 1) * rpp].mean(1) for p in range(n_parts)], 1)
            bad = ((pm - ref).abs() > 1e-2) | pm.isnan()
            badp = bad.any(2)
            print(f"b{batch} c{channels} add={use_add} rpp={rpp} stages={stages}: bad parts {badp.sum().item()}/{badp.numel()}",
                  "first bad (b, part):", badp.nonzero()[:6].tolist(), "x ok:", torch.equal(x, total), flush=True)
