"""CPU mirror of `benchmarks/attention_gluon_dkdv.py`'s kernel (session 13): its loops in torch,
float64, step for step (the op's `by_key_tile` lists walked full tiles first, the GQA loop, the
rows of the (B * heads * S, D) views with TMA's zero fill past the end, the partial tiles'
predicate and padding, lse2 in log2 units, dK scaled once), against autograd through the op's
torch reference. It checks the prototype's indexing and numbers, not its Gluon (barriers,
layouts, TMA): that needs the GPU. Output: gluon_dkdv_mirror.txt."""

import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import importlib.util

from turbo_dllm.kernels.block_diffusion import (
    block_diffusion_attention,
    plan_block_diffusion_attention,
)
from turbo_dllm.kernels.selftest import block_diffusion_tokens

spec = importlib.util.spec_from_file_location(
    "bda",
    str(
        __import__("pathlib").Path(__file__).resolve().parents[3]
        / "native/block_diffusion_attention/block_diffusion_attention.py"
    ),
)
bda = importlib.util.module_from_spec(spec)
sys.modules["bda"] = bda
spec.loader.exec_module(bda)
torch.manual_seed(0)
L, blk, B, H, HK, D = 200, 16, 2, 4, 2, 32
BN, BM = 128, 64
meta = block_diffusion_tokens(L, blk, B, 150)
S = 2 * L
q = torch.randn(B, H, S, D, dtype=torch.float64, requires_grad=True)
k = torch.randn(B, HK, S, D, dtype=torch.float64, requires_grad=True)
v = torch.randn(B, HK, S, D, dtype=torch.float64, requires_grad=True)
do = torch.randn(B, H, S, D, dtype=torch.float64)
plan = plan_block_diffusion_attention(*meta, *meta, backend="reference")
out, lse = block_diffusion_attention(q, k, v, plan)
(out * do).sum().backward()
scale = D**-0.5
LOG2E = 1.4426950408889634
lse2 = (lse * LOG2E).detach()
delta = (out.detach() * do).sum(-1)
sch = bda.make_schedule(*meta, *meta)
cols = sch.by_key_tile(BM, BN)
rows, Nt, Mt = cols.index.shape
PER_BATCH = int(rows > 1)
qn, qb, qd = sch.q_meta
kn, kb, kd = sch.k_meta
sqdb, skdb = bda._doc_strides(sch)
Qf = q.detach().reshape(-1, D)
DOf = do.reshape(-1, D)
Kf = k.detach().reshape(-1, D)
Vf = v.detach().reshape(-1, D)


def pad(t, n):
    return torch.cat([t, torch.zeros(n, D, dtype=t.dtype)])  # TMA zero-fills past the end


Qf, DOf, Kf, Vf = pad(Qf, BM), pad(DOf, BM), pad(Kf, BN), pad(Vf, BN)
GROUP = H // HK
dk_out = torch.zeros_like(k)
dv_out = torch.zeros_like(v)
qdf = qd.reshape(-1)
kdf = kd.reshape(-1)
for b in range(B):
    for hk in range(HK):
        for n_tile in range(Nt):
            row = b * PER_BATCH * Nt + n_tile
            n0 = n_tile * BN
            key0 = (b * HK + hk) * S + n0
            Kt, Vt = Kf[key0 : key0 + BN], Vf[key0 : key0 + BN]
            krows = n0 + torch.arange(BN)
            kok = krows < S
            kr = krows.clamp(max=S - 1)
            knv = torch.where(kok, kn[kr] != 0, torch.zeros_like(kok))
            kbv = torch.where(kok, kb[kr], 0)
            kdv = torch.where(kok, kdf[b * skdb + kr], -2)
            dk = torch.zeros(BN, D, dtype=torch.float64)
            dv = torch.zeros(BN, D, dtype=torch.float64)
            n_full, n_part = (
                int(cols.count.view(-1, 3)[row, 0]),
                int(cols.count.view(-1, 3)[row, 1]),
            )
            idx = cols.index.view(-1, Mt)[row]
            for g in range(GROUP):
                h = hk * GROUP + g
                first = (b * H + h) * S
                stat = (b * H + h) * S
                for j in range(n_full + n_part):
                    m0 = int(idx[j]) * BM
                    Qt, DOt = Qf[first + m0 : first + m0 + BM], DOf[first + m0 : first + m0 + BM]
                    offs = m0 + torch.arange(BM)
                    s_t = Kt @ Qt.T
                    if j >= n_full:
                        qok = offs < S
                        o = offs.clamp(max=S - 1)
                        l2 = torch.where(
                            qok,
                            lse2.reshape(-1)[stat + o],
                            torch.tensor(float("inf"), dtype=torch.float64),
                        )
                        p = torch.exp2(s_t * scale * LOG2E - l2[None, :])
                        qnv = torch.where(qok, qn[o] != 0, torch.zeros_like(qok))
                        qbv = torch.where(qok, qb[o], -1)
                        qdv = torch.where(qok, qdf[b * sqdb + o], -1)
                        vis = (
                            (qnv[None, :] & knv[:, None] & (qbv[None, :] == kbv[:, None]))
                            | (qnv[None, :] & ~knv[:, None] & (kbv[:, None] < qbv[None, :]))
                            | (~qnv[None, :] & ~knv[:, None] & (kbv[:, None] <= qbv[None, :]))
                        ) & (qdv[None, :] == kdv[:, None])
                        vis = vis & qok[None, :] & kok[:, None]
                        p = torch.where(vis, p, 0.0)
                        dl = torch.where(qok, delta.reshape(-1)[stat + o], 0.0)
                    else:
                        p = torch.exp2(s_t * scale * LOG2E - lse2.reshape(-1)[stat + offs][None, :])
                        dl = delta.reshape(-1)[stat + offs]
                    dv += p @ DOt
                    dp = Vt @ DOt.T
                    ds = p * (dp - dl[None, :])
                    dk += ds @ Qt
            ok = kok
            dk_out[b, hk, n0 : n0 + BN][: int(ok.sum())] = (dk * scale)[ok]
            dv_out[b, hk, n0 : n0 + BN][: int(ok.sum())] = dv[ok]
for name, got, want in (("dk", dk_out, k.grad), ("dv", dv_out, v.grad)):
    print(name, float((got - want).abs().max() / want.abs().max()))
