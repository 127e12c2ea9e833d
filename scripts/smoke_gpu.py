"""Quick GPU smoke check of the GEMM kernels (correctness on a few shapes, two timings). The full
suites are tests/ and `python -m wgrad bench`; this exists to get a first signal cheaply."""

import sys
import time

import torch

import wgrad
from wgrad import reference
from wgrad.scales import empty_mn_major_scales, k_block_capacity, num_k_blocks


def scales(mn, kb):
    s = empty_mn_major_scales(mn, kb, "cuda")
    s.copy_(torch.exp2(torch.empty(mn, kb, device="cuda").uniform_(-8, 2)))
    return s


def fp8(rows, k, ld=None):
    ld = ld or (k + 15) // 16 * 16
    buf = torch.empty(rows, max(ld, 1), device="cuda", dtype=torch.float8_e4m3fn)
    t = buf[:, :k]
    t.copy_(torch.randn(rows, k, device="cuda"))
    return t


def padded_randn(*shape):
    """Random fp32 [..., n] whose rows start 16-byte aligned (TMA), whatever n is."""
    n = shape[-1]
    return torch.randn(*shape[:-1], (n + 3) // 4 * 4, device="cuda")[..., :n]


def rel(x, y):
    return ((x.double() - y).norm() / y.norm().clamp_min(1e-30)).item()


failures = 0


def report(name, err, tol=2e-4):
    global failures
    ok = err <= tol
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: rel err {err:.3e}", flush=True)


def dense(m, n, k):
    kb = num_k_blocks(k)
    a, b = fp8(m, k), fp8(n, k)
    sa, sb = scales(m, kb), scales(n, kb)
    out0 = padded_randn(m, n)
    out = padded_randn(m, n)
    out.copy_(out0)
    wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out)
    ref = reference.wgrad_gemm_reference(a, sa, b, sb)
    report(f"dense {m}x{n}x{k}", rel(out.double() - out0.double(), ref))


def contiguous(m, n, ks):
    kt = sum(ks)
    a, b = fp8(m, kt), fp8(n, kt)
    cap = k_block_capacity(kt, len(ks))
    sa, sb = scales(m, cap), scales(n, cap)
    out0 = padded_randn(len(ks), m, n)
    out = padded_randn(len(ks), m, n)
    out.copy_(out0)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((a, sa), (b, sb), out, torch.tensor(ks, dtype=torch.int32, device="cuda"))
    refs = reference.k_grouped_contiguous_reference(a, sa, b, sb, ks)
    for g, k in enumerate(ks):
        if k == 0:
            ok = torch.equal(out[g], out0[g])
            print(f"{'ok  ' if ok else 'FAIL'} contiguous {m}x{n} group {g} K=0 untouched", flush=True)
            globals()["failures"] += not ok
        else:
            report(f"contiguous {m}x{n} group {g} K={k}", rel(out[g].double() - out0[g].double(), refs[g]))


def contiguous_invalid(m, n, ks):
    kt = sum(ks)
    a, b = fp8(m, kt), fp8(n, kt)
    cap = k_block_capacity(kt, len(ks))
    out0 = padded_randn(len(ks), m, n)
    out = padded_randn(len(ks), m, n)
    out.copy_(out0)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt_contiguous((a, scales(m, cap)), (b, scales(n, cap)), out, torch.tensor(ks, dtype=torch.int32, device="cuda"))
    ok = torch.equal(out, out0)
    print(f"{'ok  ' if ok else 'FAIL'} contiguous sizes {ks} (not multiples of 16): out untouched", flush=True)
    globals()["failures"] += not ok


def packed(m, n, ks):
    kb = sum(num_k_blocks(k) for k in ks)
    a = torch.randn(m * sum(ks), device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n * sum(ks), device="cuda").to(torch.float8_e4m3fn)
    sa, sb = scales(m, kb), scales(n, kb)
    out0 = padded_randn(len(ks), m, n)
    out = padded_randn(len(ks), m, n)
    out.copy_(out0)
    wgrad.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out, ks)
    refs = reference.k_grouped_reference(a, sa, b, sb, ks, m, n)
    for g, k in enumerate(ks):
        if k == 0:
            ok = torch.equal(out[g], out0[g])
            print(f"{'ok  ' if ok else 'FAIL'} packed group {g} K=0 untouched", flush=True)
            globals()["failures"] += not ok
        else:
            report(f"packed {m}x{n} group {g} K={k}", rel(out[g].double() - out0[g].double(), refs[g]))


def bench(m, n, k, reps=20):
    kb = num_k_blocks(k)
    a, b = fp8(m, k), fp8(n, k)
    sa, sb = scales(m, kb), scales(n, kb)
    out = torch.zeros(m, n, device="cuda")
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    times = []
    for i in range(reps + 3):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        wgrad.wgrad_gemm_fp8_fp8_fp32_nt((a, sa), (b, sb), out)
        e1.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(e0.elapsed_time(e1))
    t = sorted(times)[len(times) // 2]
    print(f"bench {m}x{n}x{k}: {t:.3f} ms  {2 * m * n * k / t / 1e9:.0f} TFLOPS", flush=True)


CASES = {
    "dense_small": lambda: [dense(*s) for s in [(256, 304, 256), (129, 100, 144), (1, 1, 16), (1000, 33, 1008), (127, 4097, 112), (512, 1024, 8208)]],
    "dense_bn152": lambda: dense(7168, 2112, 256),
    "dense_bn160": lambda: dense(1536, 24576, 512),
    "contig_aligned": lambda: contiguous(256, 304, [128, 256]),
    "contig_tail16": lambda: contiguous(256, 304, [16, 112]),
    "contig_tails": lambda: contiguous(256, 304, [96, 32, 304]),
    "contig_mixed": lambda: contiguous(130, 150, [16, 0, 112, 1008, 304]),
    "contig_invalid": lambda: contiguous_invalid(130, 150, [16, 100, 28]),
    "packed": lambda: packed(130, 150, [16, 0, 112, 1008]),
    "bench": lambda: [bench(*s) for s in [(7168, 2112, 4096), (1536, 24576, 4096), (16384, 7168, 8192), (2048, 7168, 4096)]],
}

if __name__ == "__main__":
    import subprocess

    if len(sys.argv) > 1:
        CASES[sys.argv[1]]()
        torch.cuda.synchronize()
        sys.exit(1 if failures else 0)
    t0 = time.time()
    bad = []
    for name in CASES:
        try:
            r = subprocess.run([sys.executable, __file__, name], timeout=120)
            code = r.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        if code != 0:
            bad.append(name)
            print(f"CASE {name}: exit {code}", flush=True)
    print(f"smoke done in {time.time() - t0:.1f} s, failing cases: {bad}")
    sys.exit(1 if bad else 0)
