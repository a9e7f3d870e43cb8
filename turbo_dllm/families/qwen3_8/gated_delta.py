"""The gated delta rule (Gated DeltaNet's token mixer) with its state captured at block boundaries.

Per value head, with a state S (Dk x Dv) that starts at `initial_state` (zeros by default):

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - (exp(g_t) S_{t-1})^T k_t))^T      (decay, then delta)
    o_t = S_t^T q_t

q and k are L2-normalised per head and q is scaled by Dk^-1/2 (as fla's
`use_qk_l2norm_in_kernel`); when there are fewer key heads than value heads each key head
serves consecutive value heads. Block diffusion needs, besides the outputs, the state *before*
every block of the clean stream (`capture_every`): each noisy block restarts from it.

Three forms, one contract (`gated_delta_rule`):
- `recurrent`: the token loop above, the plain definition (tests);
- `torch`: the chunked (WY / UT-transform) form in torch, chunks of `chunk` tokens: the intra-chunk
  part as matmuls, a scan over chunks; the CPU reference and the training path without fla;
- `fla`: flash-linear-attention's Triton `chunk_gated_delta_rule` (GPU), one call per block when
  states are captured (its initial and final states are differentiable).

Gradients flow through every captured state in all three (plain autograd, or fla's backward).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from turbo_dllm.errors import DllmError

__all__ = ["KERNELS", "gated_delta_rule", "l2norm"]

KERNELS = ("torch", "fla", "recurrent")
_FLA_CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (fla's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _heads_first(q, k, v, g, beta):
    """(B, T, H, D) -> (B, H, T, D) in float32 (float64 stays), q/k normalised and repeated."""
    dtype = torch.promote_types(v.dtype, torch.float32)
    groups = v.shape[2] // k.shape[2]
    if groups > 1:  # grouped values: key head j serves value heads j*groups .. j*groups+groups-1
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).to(dtype) for x in (q, k, v, g, beta))
    q, k = l2norm(q), l2norm(k)
    return q * q.shape[-1] ** -0.5, k, v, g, beta


def _recurrent(q, k, v, g, beta, state, capture_every):
    outputs, captured = [], []
    for t in range(q.shape[2]):
        if capture_every and t % capture_every == 0:
            captured.append(state)
        state = state * g[:, :, t].exp()[..., None, None]
        remembered = (state * k[:, :, t, :, None]).sum(-2)
        delta = (v[:, :, t] - remembered) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        outputs.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outputs, 2), captured, state


def _unit_lower_inverse(strict: torch.Tensor) -> torch.Tensor:
    """(I + N)^-1 for strictly lower-triangular N: (I - N)(I + N^2)(I + N^4)... (N is nilpotent).

    log2(chunk) batched matmuls; batched LAPACK triangular solves on many small matrices are
    orders of magnitude slower on CPU.
    """
    eye = torch.eye(strict.shape[-1], dtype=strict.dtype, device=strict.device)
    inverse, power = eye - strict, strict
    for _ in range(max(strict.shape[-1] - 1, 1).bit_length() - 1):
        power = power @ power
        inverse = inverse @ (eye + power)
    return inverse


def _scan_loop(new_values, state_keys, k_decayed, chunk_decay, state):
    """The sequential part of the chunked form: the state before every chunk, and each chunk's
    corrected values (its delta-rule updates given that state); two small matmuls a chunk.
    Everything else is batched over chunks before and after, inside the compiled layer."""
    states, corrections = [], []
    for i in range(new_values.shape[2]):
        states.append(state)
        corrected = new_values[:, :, i] - state_keys[:, :, i] @ state
        corrections.append(corrected)
        state = state * chunk_decay[:, :, i] + k_decayed[:, :, i].transpose(-1, -2) @ corrected
    return torch.stack(states, 2), torch.stack(corrections, 2), state


def _scan_loop_backward(state_keys, k_decayed, chunk_decay, states, corrections, g_states,
                        g_corrections, g_final):  # fmt: skip
    """The reverse scan: gradients of (new_values, state_keys, k_decayed, chunk_decay, state)
    from those of the three outputs, walking the chunks backwards with the forward's states
    and corrections (each chunk: C = N - K S; S' = S d + Kd^T C)."""
    # contiguous (not empty_like: a size-1 dim's stride may differ between the traced and the
    # real tensor, and the compiled backward views these gradients)
    g_new, g_keys, g_kdec, g_decay = (
        x.new_empty(x.shape) for x in (corrections, state_keys, k_decayed, chunk_decay)
    )
    g_next = g_final.contiguous().clone()  # d loss / d (the state after chunk i); no alias
    for i in reversed(range(corrections.shape[2])):
        state, corrected = states[:, :, i], corrections[:, :, i]
        g_corrected = g_corrections[:, :, i] + k_decayed[:, :, i] @ g_next
        g_kdec[:, :, i] = corrected @ g_next.transpose(-1, -2)
        g_decay[:, :, i] = (state * g_next).sum((-1, -2), keepdim=True)
        g_new[:, :, i] = g_corrected
        g_keys[:, :, i] = -g_corrected @ state.transpose(-1, -2)
        g_next = (
            g_next * chunk_decay[:, :, i]
            - state_keys[:, :, i].transpose(-1, -2) @ g_corrected
            + g_states[:, :, i]
        )
    return g_new, g_keys, g_kdec, g_decay, g_next


# The scan is a custom op (forward and backward each one opaque node to torch.compile): a loop
# of T/chunk steps unrolled by dynamo compiles for minutes, and `torch.compiler.disable`, which
# kept it out before, is a graph break: inside an activation-checkpointed layer that makes
# dynamo run the whole layer eagerly.
@torch.library.custom_op("turbo_dllm::gated_delta_scan", mutates_args=())
def _scan_op(
    new_values: torch.Tensor,
    state_keys: torch.Tensor,
    k_decayed: torch.Tensor,
    chunk_decay: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    states, corrections, final = _scan_loop(new_values, state_keys, k_decayed, chunk_decay, state)
    # contiguous like the fake outputs, and never the input itself (a custom op may not alias)
    return (
        states,
        corrections.contiguous(),
        final.contiguous() if final is not state else final.clone(),
    )


@_scan_op.register_fake
def _(new_values, state_keys, k_decayed, chunk_decay, state):
    b, h, n = new_values.shape[:3]
    return (
        state.new_empty(b, h, n, *state.shape[-2:]),
        new_values.new_empty(new_values.shape),
        state.new_empty(state.shape),
    )


@torch.library.custom_op("turbo_dllm::gated_delta_scan_backward", mutates_args=())
def _scan_backward_op(
    state_keys: torch.Tensor,
    k_decayed: torch.Tensor,
    chunk_decay: torch.Tensor,
    states: torch.Tensor,
    corrections: torch.Tensor,
    g_states: torch.Tensor,
    g_corrections: torch.Tensor,
    g_final: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _scan_loop_backward(
        state_keys, k_decayed, chunk_decay, states, corrections, g_states, g_corrections, g_final
    )


@_scan_backward_op.register_fake
def _(state_keys, k_decayed, chunk_decay, states, corrections, g_states, g_corrections, g_final):
    return tuple(  # contiguous, as `_scan_loop_backward` makes them
        x.new_empty(x.shape) for x in (corrections, state_keys, k_decayed, chunk_decay, g_final)
    )


def _scan_setup(ctx, inputs, output):
    _, state_keys, k_decayed, chunk_decay, _ = inputs
    states, corrections, _ = output
    ctx.save_for_backward(state_keys, k_decayed, chunk_decay, states, corrections)


def _scan_grad(ctx, g_states, g_corrections, g_final):
    state_keys, k_decayed, chunk_decay, states, corrections = ctx.saved_tensors
    zeros = torch.zeros_like
    g_states = zeros(states) if g_states is None else g_states
    g_corrections = zeros(corrections) if g_corrections is None else g_corrections
    g_final = zeros(states[:, :, 0]) if g_final is None else g_final
    return _scan_backward_op(
        state_keys, k_decayed, chunk_decay, states, corrections, g_states, g_corrections, g_final
    )


_scan_op.register_autograd(_scan_grad, setup_context=_scan_setup)


def _scan_chunks(new_values, state_keys, k_decayed, chunk_decay, state):
    """`_scan_loop` as the custom op, its inputs in one dtype (the widest: the state's float32
    or float64, also when autocast made the matmuls' inputs bf16), so its outputs' dtypes are
    known before it runs."""
    args = (new_values, state_keys, k_decayed, chunk_decay, state)
    dtype = state.dtype
    for x in args:
        dtype = torch.promote_types(dtype, x.dtype)
    return _scan_op(*(x.to(dtype).contiguous() for x in args))


def _chunked(q, k, v, g, beta, state, capture_every, chunk):
    B, H, T, Dk = k.shape
    n = T // chunk
    q, k, v = (x.reshape(B, H, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk), beta.reshape(B, H, n, chunk)
    g = g.cumsum(-1)  # log decay from the chunk start to each position (inclusive)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # decay[i, j] = exp(g_i - g_j) for j <= i: what the state written at j has lost by i.
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    # The UT transform: the chunk's delta-rule updates as one unit lower-triangular system.
    inverse = _unit_lower_inverse(((k_beta @ k.transpose(-1, -2)) * decay).tril(-1))
    new_values = inverse @ v_beta
    state_keys = inverse @ (k_beta * g.exp()[..., None])
    k_decayed = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]
    states, corrected, state = _scan_chunks(new_values, state_keys, k_decayed, chunk_decay, state)
    # Each chunk's output: its queries read the state before it, plus the chunk's own updates.
    intra = (q @ k.transpose(-1, -2)) * decay
    out = (q * g.exp()[..., None]) @ states + intra @ corrected
    every = capture_every // chunk if capture_every else 0
    captured = list(states[:, :, ::every].unbind(2)) if every else []
    return out.reshape(B, H, T, -1), captured, state


def fla_problem(triton_version: str, capability: tuple[int, int] | None, tilelang: bool):
    """Why fla's gated-delta backward cannot run on this host, or None.

    fla (0.6) itself refuses Hopper with Triton in [3.4.0, 3.7.1) unless TileLang is installed:
    Triton miscompiles its `chunk_bwd_dqkwg` kernel there (fla issue #640). Seen on the H200 host
    (Triton 3.6.0): the first backward raised. Saying so before the first step is kinder.
    """
    from packaging.version import Version

    if capability is None or capability[0] != 9 or tilelang:
        return None
    if Version("3.4.0") <= Version(triton_version) < Version("3.7.1"):
        return (
            f"model.linear_attention 'fla' cannot train on this Hopper GPU with Triton "
            f"{triton_version}: flash-linear-attention refuses its gated backward there "
            f"(Triton >= 3.4.0, < 3.7.1 miscompiles it, fla issue #640)"
        )
    return None


def check_fla_usable(*, cuda: bool = True) -> None:
    """Raise a DllmError when fla's kernels cannot train here: no CUDA GPU, no
    flash-linear-attention package, or a Triton that fla refuses (`fla_problem`). `cuda=False`
    checks the package alone (`dllm doctor` on a SLURM login node, for the job's GPU nodes).

    Called when the model is built and by `dllm doctor`, not at the first step's forward
    (`_fla`): by then `dllm train` had made the run dir and its checkpoints/ folder, which it
    then left behind."""
    import importlib.util

    if cuda and not torch.cuda.is_available():
        raise DllmError(
            "model.linear_attention 'fla' runs on CUDA GPUs only",
            hint="set model.linear_attention: torch for CPU runs",
        )
    if importlib.util.find_spec("fla") is None:
        raise DllmError(_FLA_MISSING, hint=_FLA_MISSING_HINT)
    if not cuda:
        return
    import triton

    problem = fla_problem(
        triton.__version__,
        torch.cuda.get_device_capability(),
        importlib.util.find_spec("tilelang") is not None,
    )
    if problem:
        raise DllmError(
            problem,
            hint="set model.linear_attention: torch, or upgrade Triton to >= 3.7.1, or install "
            "tilelang (fla then uses it for that kernel)",
        )


_FLA_MISSING = "model.linear_attention 'fla' needs the flash-linear-attention package"
_FLA_MISSING_HINT = (
    "pip install 'turbo-dllm[gdn]' (flash-linear-attention), or set model.linear_attention: torch"
)


@torch.compiler.disable  # fla's autograd Functions launch their own Triton kernels
def _fla(q, k, v, g, beta, initial_state, capture_every):
    if q.device.type != "cuda":
        raise DllmError(
            "model.linear_attention 'fla' runs on CUDA GPUs only",
            hint="set model.linear_attention: torch for CPU runs",
        )
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        raise DllmError(_FLA_MISSING, hint=_FLA_MISSING_HINT) from None
    # fla >= 0.6 groups value heads over key heads itself (GVA), as transformers calls it.
    B, T, H = v.shape[:3]
    state = initial_state
    if state is None:
        state = q.new_zeros(B, H, q.shape[-1], v.shape[-1], dtype=torch.float32)
    span = capture_every or T
    outputs, captured = [], []
    for start in range(0, T, span):
        if capture_every:
            captured.append(state)
        piece = slice(start, start + span)
        out, state = chunk_gated_delta_rule(
            q[:, piece].contiguous(),
            k[:, piece].contiguous(),
            v[:, piece].contiguous(),
            g=g[:, piece].float().contiguous(),
            beta=beta[:, piece].contiguous(),
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outputs.append(out)
    return torch.cat(outputs, 1), captured, state


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    kernel: str = "torch",
    initial_state: torch.Tensor | None = None,
    capture_every: int | None = None,
    chunk: int = _FLA_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The gated delta rule over (B, T, H, D) inputs; returns (out, captured, final state).

    q, k: (B, T, Hk, Dk); v: (B, T, Hv, Dv); g (log decay, <= 0), beta: (B, T, Hv);
    initial_state: (B, Hv, Dk, Dv). With `capture_every` = b (T % b == 0), `captured` is
    (B, T / b, Hv, Dk, Dv): the state before tokens 0, b, 2b, ... (the first is the initial
    state). The output has v's dtype; states are float32 (float64 inputs stay float64).
    """
    if kernel not in KERNELS:
        raise DllmError(f"unknown linear-attention kernel {kernel!r}", hint="use torch or fla")
    T = q.shape[1]
    if capture_every is not None and T % capture_every:
        raise ValueError(f"{T} tokens are not a whole number of {capture_every}-token blocks")
    if kernel == "fla":
        out, captured, final = _fla(q, k, v, g, beta, initial_state, capture_every)
    else:
        qh, kh, vh, gh, bh = _heads_first(q, k, v, g, beta)
        B, H, _, Dk = kh.shape
        state = (
            torch.zeros(B, H, Dk, vh.shape[-1], dtype=vh.dtype, device=vh.device)
            if initial_state is None
            else initial_state.to(vh.dtype)
        )
        if kernel == "recurrent":
            out, captured, final = _recurrent(qh, kh, vh, gh, bh, state, capture_every)
        else:
            # Chunks must tile every captured block: the largest chunk <= `chunk` that does.
            size = math.gcd(chunk, capture_every) if capture_every else chunk
            pad = (size - T % size) % size
            if pad:  # zero keys and values leave the state alone, but g decays: pad g with 0
                qh, kh, vh = (F.pad(x, (0, 0, 0, pad)) for x in (qh, kh, vh))
                gh, bh = F.pad(gh, (0, pad)), F.pad(bh, (0, pad))
            out, captured, final = _chunked(qh, kh, vh, gh, bh, state, capture_every, size)
            out = out[:, :, :T]
        out = out.transpose(1, 2).to(v.dtype)
    stacked = torch.stack(captured, 1) if capture_every else None
    return out, stacked, final
