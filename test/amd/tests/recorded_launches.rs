//! `attn_fwd`, `attn_bwd` and `debug_dropout_mask` end to end on an AMD stream, through the Rust
//! and the C++ API, against the recording HIP double (`hip-double/`, loaded through
//! `AOTRITON_HIP_LIBRARY`): one gfx942 device that records every HIP call. Each call's recorded
//! launches are checked against expectations derived here from the inputs alone: which kernels
//! (family, functional, variant and config, in order, on the given stream), the image loaded
//! (byte-identical to the gfx942 archive's), grid, block, LDS, and every explicit kernel
//! argument's bytes in the kernarg segment HIP would build (offsets from the code object's own
//! metadata, read by the ROCm code-object manager; names and types from the archive's metadata).
//!
//! This proves what the runtime sends to HIP; it does not prove the kernels run.
//!
//! Needs: `libamd_comgr`, the gfx942 kernels embedded in `aotriton` (`AOTRITON_TARGET_ARCH`
//! including gfx942) and the gfx942 archive file (`AOTRITON_ARCHIVE_DIR`); the C++ half needs
//! the installed C++ API built with gfx942 (`AOTRITON_INSTALL_DIR`). `./test.sh` sets all of it;
//! by hand, after `AOTRITON_TARGET_ARCH="sm_90;gfx942" ./build.sh`:
//!
//! ```text
//! AOTRITON_TARGET_ARCH="sm_90;gfx942" AOTRITON_KERNEL_DIR=build/kernels AOTRITON_ARCHIVE_DIR=build/images \
//!   cargo test -p aotriton-amd-tests --test recorded_launches -- --nocapture
//! ```
//!
//! The double is built by the test itself (`cargo build -p aotriton-hip-double` into
//! `<target>/hip-double`); its logs stay in `<target>/hip-double/logs/`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;

use aotriton::archive::{Archive, Functional, KernelMeta};
use aotriton::flash::{self, Backend, BwdParams, Dropout, FwdParams, Mask, MaskAlign, Varlen, Workspace};
use aotriton::{DType, ErrorKind, Stream, TensorView};
use aotriton_amd_tests::comgr::{self, Comgr};
use aotriton_amd_tests::hip_double::{self, Log, call};
use aotriton_amd_tests::{archive_path, compile_cpp, repo_root, skip_or_fail};
use serde_json::Value;

/// What the double reports: compute units and wavefront size.
const MULTIPROCESSORS: u64 = 304;
const WAVE: u32 = 64;
/// The compiled head-dim buckets (python/rules.py HEAD_DIMS): D runs in the smallest ≥ D.
const HEAD_DIM_BUCKETS: [u64; 5] = [16, 32, 64, 128, 256];
const STREAM: u64 = 0x5000;

/// Fake device addresses, one region per tensor role (16-byte aligned, never dereferenced).
/// `cpp/recorded_launches.cpp` uses the same ones.
mod addr {
    pub const Q: u64 = 0x1000_0000;
    pub const K: u64 = 0x2000_0000;
    pub const V: u64 = 0x3000_0000;
    pub const O: u64 = 0x4000_0000;
    pub const LSE: u64 = 0x5000_0000;
    pub const DO: u64 = 0x6000_0000;
    pub const DELTA: u64 = 0x7000_0000;
    pub const DQ: u64 = 0x8000_0000;
    pub const DK: u64 = 0x9000_0000;
    pub const DV: u64 = 0xa000_0000;
    pub const BIAS: u64 = 0xb000_0000;
    pub const DBIAS: u64 = 0xc000_0000;
    pub const SEED: u64 = 0xd000_0000;
    pub const OFFSET: u64 = 0xd000_0010;
    pub const SEED_OUT: u64 = 0xd000_0020;
    pub const OFFSET_OUT: u64 = 0xd000_0030;
    pub const ALIBI: u64 = 0xd000_1000;
    pub const CU_Q: u64 = 0xe000_0000;
    pub const CU_K: u64 = 0xe000_1000;
    pub const OUT: u64 = 0xf000_0000;
    pub const WORKSPACE: u64 = 0xf800_0000;
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// Memory layout of the B×H×S×D tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Contiguous B×H×S×D.
    Bhsd,
    /// B×S×H×D memory viewed as B×H×S×D.
    Bshd,
    /// B×H×S×D with rows `n` elements apart (padding after each row).
    RowStride(i64),
}

#[derive(Debug, Clone, Copy)]
struct DropoutCase {
    p: f32,
    offset_base: u64,
    /// The forward writes the seed and offset it used.
    outputs: bool,
}

/// A packed batch: the token offsets of the sequences (`host`: the caller passes host copies).
#[derive(Debug, Clone, Copy)]
struct Packed {
    cu_q: &'static [i32],
    cu_k: &'static [i32],
    host: bool,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    dtype: DType,
    b: u64,
    hq: u64,
    hk: u64,
    sq: u64,
    sk: u64,
    d: u64,
    layout: Layout,
    mask: Mask,
    /// None: the parameters' default (1/√D).
    scale: Option<f32>,
    lse: bool,
    /// Bias sizes (contiguous), with its gradient in the backward when `dbias`.
    bias: Option<[u64; 4]>,
    dbias: bool,
    dropout: Option<DropoutCase>,
    varlen: Option<Packed>,
    tf32: bool,
    deterministic: bool,
    /// Logit soft-capping (0: off).
    softcap: f32,
    /// Rows of ALiBi slopes ([rows, Hq] fp32 at `addr::ALIBI`): 0 off, 1 shared, B per sequence.
    alibi_rows: u64,
    /// Bytes added to q's address (the generic variant must then serve the kernels reading q).
    q_offset: u64,
    stream: u64,
    backward: bool,
    /// Families expected to run their `generic` variant (all others: `aligned`).
    generic: &'static [&'static str],
}

const fn window(left: i32, right: i32, align: MaskAlign) -> Mask {
    Mask { window_left: left, window_right: right, align }
}
const NONE: Mask = window(-1, -1, MaskAlign::TopLeft);
const CAUSAL_TL: Mask = window(-1, 0, MaskAlign::TopLeft);
const CAUSAL_BR: Mask = window(-1, 0, MaskAlign::BottomRight);

const BASE: Case = Case {
    name: "",
    dtype: DType::F16,
    b: 2,
    hq: 4,
    hk: 4,
    sq: 128,
    sk: 128,
    d: 64,
    layout: Layout::Bhsd,
    mask: NONE,
    scale: Some(0.125),
    lse: true,
    bias: None,
    dbias: false,
    dropout: None,
    varlen: None,
    tf32: false,
    deterministic: false,
    softcap: 0.0,
    alibi_rows: 0,
    q_offset: 0,
    stream: STREAM,
    backward: true,
    generic: &[],
};

fn cases() -> Vec<Case> {
    use DType::{BF16, F32};
    vec![
        Case { name: "fp16-d64", ..BASE },
        Case { name: "bf16-causal-top-left", dtype: BF16, hk: 2, sq: 100, sk: 130, mask: CAUSAL_TL, ..BASE },
        Case { name: "fp16-causal-bottom-right-d32", sq: 130, sk: 100, d: 32, mask: CAUSAL_BR, scale: Some(0.2), ..BASE },
        Case {
            name: "bf16-window-bottom-right",
            dtype: BF16,
            sq: 200,
            sk: 300,
            d: 128,
            mask: window(32, 8, MaskAlign::BottomRight),
            ..BASE
        },
        Case { name: "fp16-window-clamped", sq: 77, sk: 77, d: 16, mask: window(5000, 3, MaskAlign::TopLeft), ..BASE },
        Case { name: "bf16-window-left-only", dtype: BF16, mask: window(16, -1, MaskAlign::TopLeft), ..BASE },
        Case { name: "fp16-gqa", hq: 8, hk: 2, sq: 64, sk: 256, mask: CAUSAL_BR, ..BASE },
        Case { name: "bf16-mqa", dtype: BF16, hq: 6, hk: 1, d: 128, ..BASE },
        Case { name: "fp16-d8", d: 8, sq: 33, sk: 47, ..BASE },
        Case { name: "bf16-d40", dtype: BF16, d: 40, ..BASE },
        Case { name: "fp16-d72", d: 72, mask: CAUSAL_TL, ..BASE },
        Case { name: "bf16-d200", dtype: BF16, d: 200, sq: 65, sk: 97, ..BASE },
        Case { name: "fp16-d256", d: 256, ..BASE },
        Case { name: "fp32-d64", dtype: F32, mask: CAUSAL_TL, ..BASE },
        Case { name: "fp32-tf32-d128", dtype: F32, d: 128, tf32: true, sq: 90, sk: 150, ..BASE },
        Case { name: "fp32-d256", dtype: F32, d: 256, hk: 2, ..BASE },
        Case {
            name: "fp16-dropout",
            sq: 90,
            sk: 70,
            mask: CAUSAL_TL,
            dropout: Some(DropoutCase { p: 0.2, offset_base: 12345, outputs: true }),
            ..BASE
        },
        Case {
            name: "bf16-dropout-no-outputs",
            dtype: BF16,
            d: 128,
            dropout: Some(DropoutCase { p: 0.5, offset_base: 0, outputs: false }),
            ..BASE
        },
        Case { name: "fp16-bias-full-dbias", sq: 96, sk: 80, bias: Some([2, 4, 96, 80]), dbias: true, ..BASE },
        Case {
            name: "bf16-bias-broadcast-dbias",
            dtype: BF16,
            hk: 2,
            sq: 70,
            sk: 50,
            bias: Some([1, 4, 1, 50]),
            dbias: true,
            mask: CAUSAL_BR,
            // The bias's head stride, 50 elements, is no multiple of 16 bytes.
            generic: &["attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dbias"],
            ..BASE
        },
        Case {
            name: "fp16-bias-batch-broadcast-dropout",
            bias: Some([2, 1, 128, 128]),
            dropout: Some(DropoutCase { p: 0.25, offset_base: 7, outputs: false }),
            ..BASE
        },
        Case {
            name: "fp16-varlen-host",
            hk: 2,
            mask: CAUSAL_BR,
            varlen: Some(Packed { cu_q: &[0, 30, 30, 130], cu_k: &[0, 50, 70, 71], host: true }),
            ..BASE
        },
        Case {
            name: "bf16-varlen-bias-dropout",
            dtype: BF16,
            varlen: Some(Packed { cu_q: &[0, 17, 81], cu_k: &[0, 40, 41], host: false }),
            bias: Some([2, 4, 64, 40]),
            dbias: true,
            dropout: Some(DropoutCase { p: 0.1, offset_base: 3, outputs: true }),
            ..BASE
        },
        Case { name: "fp16-deterministic", deterministic: true, mask: CAUSAL_TL, ..BASE },
        Case { name: "bf16-alibi-per-sequence-gqa", dtype: BF16, hq: 8, hk: 2, sq: 100, sk: 130, mask: CAUSAL_BR, alibi_rows: 2, ..BASE },
        Case { name: "fp16-alibi-shared-bottom-right", sq: 90, sk: 70, mask: window(-1, -1, MaskAlign::BottomRight), alibi_rows: 1, ..BASE },
        Case { name: "bf16-softcap-gqa", dtype: BF16, hq: 8, hk: 2, sq: 100, sk: 130, mask: CAUSAL_BR, softcap: 30.0, ..BASE },
        Case { name: "bf16-bshd", dtype: BF16, hk: 2, sq: 120, sk: 120, layout: Layout::Bshd, ..BASE },
        Case {
            name: "fp16-unaligned-q",
            q_offset: 2,
            generic: &["attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq"],
            ..BASE
        },
        Case {
            name: "fp16-padded-rows",
            layout: Layout::RowStride(68),
            generic: &["attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"],
            ..BASE
        },
        Case {
            name: "fp32-unaligned-q-bias",
            dtype: F32,
            q_offset: 4,
            bias: Some([1, 1, 128, 128]),
            dbias: true,
            generic: &["attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_dbias"],
            ..BASE
        },
        Case { name: "fp16-no-lse", lse: false, backward: false, ..BASE },
        Case { name: "fp16-null-stream", stream: 0, ..BASE },
        Case { name: "bf16-large-grid", dtype: BF16, b: 4, hq: 16, hk: 16, sq: 1024, sk: 1024, d: 128, ..BASE },
        Case { name: "fp16-default-scale", scale: None, d: 72, ..BASE },
    ]
}

/// The calls of the C++ program (`cpp/recorded_launches.cpp`), in its order: cases of the list
/// above, so the same expectations (and the Rust API's recorded bytes) apply.
const CPP_CALLS: &[(&str, Op)] = &[
    ("fp16-d64", Op::Fwd),
    ("fp16-d64", Op::Bwd),
    ("bf16-window-bottom-right", Op::Fwd),
    ("bf16-window-bottom-right", Op::Bwd),
    ("fp16-gqa", Op::Fwd),
    ("fp16-gqa", Op::Bwd),
    ("fp32-tf32-d128", Op::Fwd),
    ("fp32-tf32-d128", Op::Bwd),
    ("fp16-dropout", Op::Fwd),
    ("fp16-dropout", Op::Bwd),
    ("bf16-bias-broadcast-dbias", Op::Fwd),
    ("bf16-bias-broadcast-dbias", Op::Bwd),
    ("fp16-varlen-host", Op::Fwd),
    ("fp16-varlen-host", Op::Bwd),
    ("bf16-varlen-bias-dropout", Op::Fwd),
    ("bf16-varlen-bias-dropout", Op::Bwd),
    ("bf16-bshd", Op::Fwd),
    ("bf16-bshd", Op::Bwd),
    ("fp16-unaligned-q", Op::Fwd),
    ("fp16-unaligned-q", Op::Bwd),
    ("fp16-no-lse", Op::Fwd),
    ("fp16-null-stream", Op::Fwd),
    (DEBUG_MASK.name, Op::DebugMask),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Fwd,
    Bwd,
    DebugMask,
}

/// The debug_dropout_mask call: out B×H×Sq×Sk fp32 (rows padded to 72), dropout p, offset base.
struct DebugMaskCase {
    name: &'static str,
    sizes: [u64; 4],
    row_stride: i64,
    p: f32,
    offset_base: u64,
}

const DEBUG_MASK: DebugMaskCase =
    DebugMaskCase { name: "debug-dropout-mask", sizes: [2, 3, 50, 70], row_stride: 72, p: 0.3, offset_base: 99 };

// ---------------------------------------------------------------------------------------------
// The case's tensors, and the same as the API's parameters
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct T4 {
    ptr: u64,
    sizes: [u64; 4],
    strides: [i64; 4],
}

#[derive(Debug, Clone, Copy)]
struct T3 {
    ptr: u64,
    sizes: [u64; 3],
    strides: [i64; 3],
}

fn contiguous<const R: usize>(sizes: [u64; R]) -> [i64; R] {
    let mut strides = [0i64; R];
    let mut step = 1i64;
    for d in (0..R).rev() {
        strides[d] = step;
        step *= sizes[d] as i64;
    }
    strides
}

struct Tensors {
    q: T4,
    k: T4,
    v: T4,
    o: T4,
    d_o: T4,
    dq: T4,
    dk: T4,
    dv: T4,
    lse: T3,
    delta: T3,
    bias: Option<T4>,
    dbias: Option<T4>,
}

/// The kernels' view of the batch: sequences and (max) lengths.
#[derive(Debug, Clone, Copy)]
struct Dims {
    batch: u64,
    sq: u64,
    sk: u64,
}

fn max_len(cu: &[i32]) -> u64 {
    cu.windows(2).map(|w| (w[1] - w[0]) as u64).max().unwrap()
}

fn dims(c: &Case) -> Dims {
    match c.varlen {
        Some(p) => Dims { batch: p.cu_q.len() as u64 - 1, sq: max_len(p.cu_q), sk: max_len(p.cu_k) },
        None => Dims { batch: c.b, sq: c.sq, sk: c.sk },
    }
}

fn tensors(c: &Case) -> Tensors {
    // `keys`: a K/V-side tensor (Sk rows, or the packed key tokens).
    let t = |ptr: u64, keys: bool| -> T4 {
        let h = if keys { c.hk } else { c.hq };
        if let Some(p) = c.varlen {
            // total × H × D viewed as [1, H, total, D], the batch stride as a caller would leave it.
            let total = *if keys { p.cu_k } else { p.cu_q }.last().unwrap() as u64;
            let strides = [(total * h * c.d) as i64, c.d as i64, (h * c.d) as i64, 1];
            return T4 { ptr, sizes: [1, h, total, c.d], strides };
        }
        let s = if keys { c.sk } else { c.sq };
        let sizes = [c.b, h, s, c.d];
        let (h, s, d) = (h as i64, s as i64, c.d as i64);
        let strides = match c.layout {
            Layout::Bhsd => contiguous(sizes),
            Layout::Bshd => [s * h * d, d, h * d, 1],
            Layout::RowStride(rs) => [h * s * rs, s * rs, rs, 1],
        };
        T4 { ptr, sizes, strides }
    };
    let rows = |ptr: u64| -> T3 {
        let sizes = match c.varlen {
            Some(p) => [1, c.hq, *p.cu_q.last().unwrap() as u64],
            None => [c.b, c.hq, c.sq],
        };
        T3 { ptr, sizes, strides: contiguous(sizes) }
    };
    let mut q = t(addr::Q, false);
    q.ptr += c.q_offset;
    let bias = c.bias.map(|sizes| T4 { ptr: addr::BIAS, sizes, strides: contiguous(sizes) });
    let dbias = c.bias.filter(|_| c.dbias).map(|sizes| T4 { ptr: addr::DBIAS, sizes, strides: contiguous(sizes) });
    Tensors {
        q,
        k: t(addr::K, true),
        v: t(addr::V, true),
        o: t(addr::O, false),
        d_o: t(addr::DO, false),
        dq: t(addr::DQ, false),
        dk: t(addr::DK, true),
        dv: t(addr::DV, true),
        lse: rows(addr::LSE),
        delta: rows(addr::DELTA),
        bias,
        dbias,
    }
}

fn view4(t: &T4, dtype: DType) -> TensorView<4> {
    TensorView::new(t.ptr, t.sizes, t.strides, dtype)
}

fn view3(t: &T3) -> TensorView<3> {
    TensorView::new(t.ptr, t.sizes, t.strides, DType::F32)
}

fn packed(c: &Case) -> Option<Varlen<'static>> {
    c.varlen.map(|p| {
        let cu = |ptr, cu: &[i32]| TensorView::contiguous(ptr, [cu.len() as u64], DType::I32);
        let d = dims(c);
        Varlen {
            cu_seqlens_q: cu(addr::CU_Q, p.cu_q),
            cu_seqlens_k: cu(addr::CU_K, p.cu_k),
            max_seqlen_q: d.sq,
            max_seqlen_k: d.sk,
            host_cu_seqlens: p.host.then_some((p.cu_q, p.cu_k)),
            status: 0,
        }
    })
}

fn api_dropout(c: &Case, forward: bool) -> Option<Dropout> {
    c.dropout.map(|d| {
        let mut dropout = Dropout::new(d.p, addr::SEED, addr::OFFSET);
        dropout.offset_base = d.offset_base;
        if forward && d.outputs {
            dropout.seed_out = addr::SEED_OUT;
            dropout.offset_out = addr::OFFSET_OUT;
        }
        dropout
    })
}

fn alibi(c: &Case) -> Option<TensorView<2>> {
    (c.alibi_rows != 0).then(|| TensorView::contiguous(addr::ALIBI, [c.alibi_rows, c.hq], DType::F32))
}

fn fwd_params(c: &Case, t: &Tensors) -> FwdParams<'static> {
    let lse = c.lse.then(|| view3(&t.lse));
    let mut p = FwdParams::new(view4(&t.q, c.dtype), view4(&t.k, c.dtype), view4(&t.v, c.dtype), view4(&t.o, c.dtype), lse);
    if let Some(scale) = c.scale {
        p.sm_scale = scale;
    }
    p.mask = c.mask;
    p.softcap = c.softcap;
    p.alibi_slopes = alibi(c);
    p.bias = t.bias.map(|b| view4(&b, c.dtype));
    p.dropout = api_dropout(c, true);
    p.varlen = packed(c);
    p.allow_tf32 = c.tf32;
    p
}

fn bwd_params(c: &Case, t: &Tensors) -> BwdParams<'static> {
    let v = |x: &T4| view4(x, c.dtype);
    let (lse, delta) = (view3(&t.lse), view3(&t.delta));
    let mut p = BwdParams::new(v(&t.q), v(&t.k), v(&t.v), v(&t.o), v(&t.d_o), lse, delta, v(&t.dq), v(&t.dk), v(&t.dv));
    if let Some(scale) = c.scale {
        p.sm_scale = scale;
    }
    p.mask = c.mask;
    p.softcap = c.softcap;
    p.alibi_slopes = alibi(c);
    p.bias = t.bias.map(|b| v(&b));
    p.dbias = t.dbias.map(|b| v(&b));
    p.dropout = api_dropout(c, false);
    p.varlen = packed(c);
    p.allow_tf32 = c.tf32;
    p.deterministic = c.deterministic;
    p
}

// ---------------------------------------------------------------------------------------------
// Expected kernel arguments: an independent table, from the case's inputs
// ---------------------------------------------------------------------------------------------

/// One expected argument value.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    Ptr(u64),
    Int(i64),
    F32(f32),
}

type Expect = BTreeMap<&'static str, Val>;

fn int(v: impl TryInto<i64>) -> Val {
    Val::Int(v.try_into().unwrap_or_else(|_| panic!("value out of i64 range")))
}

/// The scale the kernels get: the case's, or 1/√D (the parameters' default).
fn scale(c: &Case) -> f32 {
    c.scale.unwrap_or(1.0 / (c.d as f32).sqrt())
}

/// z/h/row element strides of a B×H×S×D tensor; packed batches address sequences through
/// cu_seqlens, so the kernels take batch stride 0 whatever the view says.
fn put_strides(e: &mut Expect, names: [&'static str; 3], t: &T4, packed: bool) {
    e.insert(names[0], int(if packed { 0 } else { t.strides[0] }));
    e.insert(names[1], int(t.strides[1]));
    e.insert(names[2], int(t.strides[2]));
}

fn put_row_strides(e: &mut Expect, names: [&'static str; 2], t: Option<&T3>, packed: bool) {
    let (z, h) = t.map_or((0, 0), |t| (if packed { 0 } else { t.strides[0] }, t.strides[1]));
    e.insert(names[0], int(z));
    e.insert(names[1], int(h));
}

/// Bias-like strides: 0 in a broadcast dimension (size 1), 0 when absent.
fn put_broadcast_strides(e: &mut Expect, names: [&'static str; 3], t: Option<&T4>) {
    for (d, name) in names.into_iter().enumerate() {
        e.insert(name, int(t.map_or(0, |t| if t.sizes[d] == 1 { 0 } else { t.strides[d] })));
    }
}

/// The attention group: lengths, GQA group, the mask as a window (mask.py: unbounded sides are
/// N_CTX_Q + N_CTX_K, every side clamped to it), packing.
fn put_attention(e: &mut Expect, c: &Case) {
    let d = dims(c);
    let unbounded = (d.sq + d.sk) as i64;
    let side = |w: i32| if w < 0 { unbounded } else { (w as i64).min(unbounded) };
    e.insert("N_CTX_Q", int(d.sq));
    e.insert("N_CTX_K", int(d.sk));
    e.insert("D_HEAD", int(c.d));
    e.insert("D_HEAD_V", int(c.d)); // these cases' V has Q/K's head dim
    e.insert("GQA_GROUP", int(c.hq / c.hk));
    e.insert("WINDOW_LEFT", int(side(c.mask.window_left)));
    e.insert("WINDOW_RIGHT", int(side(c.mask.window_right)));
    e.insert("ALIGN_BOTTOM_RIGHT", int((c.mask.align == MaskAlign::BottomRight) as i64));
    e.insert("IS_VARLEN", int(c.varlen.is_some() as i64));
    e.insert("CU_SEQLENS_Q", Val::Ptr(if c.varlen.is_some() { addr::CU_Q } else { 0 }));
    e.insert("CU_SEQLENS_K", Val::Ptr(if c.varlen.is_some() { addr::CU_K } else { 0 }));
    // What bounds the offsets (varlen.py): the packed token counts; no status word is given.
    let tokens = |cu: Option<&[i32]>| int(cu.map_or(0, |cu| *cu.last().unwrap() as i64));
    e.insert("N_TOKENS_Q", tokens(c.varlen.map(|p| p.cu_q)));
    e.insert("N_TOKENS_K", tokens(c.varlen.map(|p| p.cu_k)));
    e.insert("VARLEN_STATUS", Val::Ptr(0));
    e.insert("STORE_VARLEN_STATUS", int(0));
}

/// The dropout group (dropout.py): kept iff the element's 16 bits ≥ ⌊p·2¹⁶⌋, scale 1/(1−p) rounded to
/// fp32, seed and offset by address; neutral values without dropout.
fn put_dropout(e: &mut Expect, p: f32, seed: u64, offset: u64, base: u64) {
    e.insert("DROPOUT_THRESHOLD", int((p as f64 * 65536.0).floor() as i64));
    e.insert("dropout_scale", Val::F32((1.0 / (1.0 - p as f64)) as f32));
    e.insert("PHILOX_SEED", Val::Ptr(seed));
    e.insert("PHILOX_OFFSET", Val::Ptr(offset));
    e.insert("philox_offset_base", int(base));
}

fn put_case_dropout(e: &mut Expect, c: &Case) {
    match c.dropout {
        Some(d) => put_dropout(e, d.p, addr::SEED, addr::OFFSET, d.offset_base),
        None => put_dropout(e, 0.0, 0, 0, 0),
    }
}

fn fwd_expect(c: &Case, t: &Tensors) -> Expect {
    let packed = c.varlen.is_some();
    let mut e = Expect::new();
    for (name, ptr) in [("Q", t.q.ptr), ("K", t.k.ptr), ("V", t.v.ptr), ("O", t.o.ptr)] {
        e.insert(name, Val::Ptr(ptr));
    }
    e.insert("LSE", Val::Ptr(if c.lse { t.lse.ptr } else { 0 }));
    e.insert("BIAS", Val::Ptr(t.bias.map_or(0, |b| b.ptr)));
    e.insert("sm_scale", Val::F32(scale(c)));
    e.insert("softcap", Val::F32(c.softcap));
    e.insert("ALIBI_SLOPES", Val::Ptr(if c.alibi_rows != 0 { addr::ALIBI } else { 0 }));
    e.insert("stride_az", int(if c.alibi_rows > 1 { c.hq as i64 } else { 0 }));
    put_strides(&mut e, ["stride_qz", "stride_qh", "stride_qm"], &t.q, packed);
    put_strides(&mut e, ["stride_kz", "stride_kh", "stride_kn"], &t.k, packed);
    put_strides(&mut e, ["stride_vz", "stride_vh", "stride_vn"], &t.v, packed);
    put_strides(&mut e, ["stride_oz", "stride_oh", "stride_om"], &t.o, packed);
    put_row_strides(&mut e, ["stride_lz", "stride_lh"], c.lse.then_some(&t.lse), packed);
    put_broadcast_strides(&mut e, ["stride_bz", "stride_bh", "stride_bm"], t.bias.as_ref());
    e.insert("SINKS", Val::Ptr(0));
    e.insert("STORE_LSE", int(c.lse as i64));
    put_attention(&mut e, c);
    put_case_dropout(&mut e, c);
    let outputs = c.dropout.is_some_and(|d| d.outputs);
    e.insert("PHILOX_SEED_OUT", Val::Ptr(if outputs { addr::SEED_OUT } else { 0 }));
    e.insert("PHILOX_OFFSET_OUT", Val::Ptr(if outputs { addr::OFFSET_OUT } else { 0 }));
    e.insert("STORE_PHILOX", int(outputs as i64));
    e
}

/// One table for the four backward kernels (each takes the names it declares).
fn bwd_expect(c: &Case, t: &Tensors) -> Expect {
    let packed = c.varlen.is_some();
    let mut e = Expect::new();
    let data = [("Q", &t.q), ("K", &t.k), ("V", &t.v), ("O", &t.o), ("DO", &t.d_o), ("DQ", &t.dq), ("DK", &t.dk), ("DV", &t.dv)];
    for (name, x) in data {
        e.insert(name, Val::Ptr(x.ptr));
    }
    e.insert("LSE", Val::Ptr(t.lse.ptr));
    e.insert("DELTA", Val::Ptr(t.delta.ptr));
    e.insert("BIAS", Val::Ptr(t.bias.map_or(0, |b| b.ptr)));
    e.insert("DBIAS", Val::Ptr(t.dbias.map_or(0, |b| b.ptr)));
    e.insert("sm_scale", Val::F32(scale(c)));
    e.insert("softcap", Val::F32(c.softcap));
    e.insert("ALIBI_SLOPES", Val::Ptr(if c.alibi_rows != 0 { addr::ALIBI } else { 0 }));
    e.insert("stride_az", int(if c.alibi_rows > 1 { c.hq as i64 } else { 0 }));
    put_strides(&mut e, ["stride_qz", "stride_qh", "stride_qm"], &t.q, packed);
    put_strides(&mut e, ["stride_kz", "stride_kh", "stride_kn"], &t.k, packed);
    put_strides(&mut e, ["stride_vz", "stride_vh", "stride_vn"], &t.v, packed);
    put_strides(&mut e, ["stride_oz", "stride_oh", "stride_om"], &t.o, packed);
    put_strides(&mut e, ["stride_doz", "stride_doh", "stride_dom"], &t.d_o, packed);
    put_strides(&mut e, ["stride_dqz", "stride_dqh", "stride_dqm"], &t.dq, packed);
    put_strides(&mut e, ["stride_dkz", "stride_dkh", "stride_dkn"], &t.dk, packed);
    put_strides(&mut e, ["stride_dvz", "stride_dvh", "stride_dvn"], &t.dv, packed);
    put_row_strides(&mut e, ["stride_lz", "stride_lh"], Some(&t.lse), packed);
    put_row_strides(&mut e, ["stride_deltaz", "stride_deltah"], Some(&t.delta), packed);
    put_broadcast_strides(&mut e, ["stride_bz", "stride_bh", "stride_bm"], t.bias.as_ref());
    put_broadcast_strides(&mut e, ["stride_dbz", "stride_dbh", "stride_dbm"], t.dbias.as_ref());
    if let Some(db) = &t.dbias {
        // bwd_dbias.py: the sizes of the (broadcast) bias gradient.
        e.insert("BIAS_BATCHES", int(db.sizes[0]));
        e.insert("BIAS_HEADS", int(db.sizes[1]));
        e.insert("BIAS_ROWS", int(db.sizes[2]));
    }
    e.insert("N_BATCH", int(dims(c).batch));
    e.insert("N_HEADS_Q", int(c.hq));
    put_attention(&mut e, c);
    put_case_dropout(&mut e, c);
    e
}

fn debug_mask_expect(m: &DebugMaskCase) -> (T4, Expect) {
    let [_, h, s, _] = m.sizes;
    let rs = m.row_stride;
    let out = T4 { ptr: addr::OUT, sizes: m.sizes, strides: [(h * s) as i64 * rs, s as i64 * rs, rs, 1] };
    let mut e = Expect::new();
    e.insert("OUT", Val::Ptr(out.ptr));
    put_strides(&mut e, ["stride_oz", "stride_oh", "stride_om"], &out, false);
    e.insert("N_CTX_Q", int(m.sizes[2]));
    e.insert("N_CTX_K", int(m.sizes[3]));
    e.insert("N_HEADS", int(h));
    put_dropout(&mut e, m.p, addr::SEED, addr::OFFSET, m.offset_base);
    (out, e)
}

// ---------------------------------------------------------------------------------------------
// Expected launches
// ---------------------------------------------------------------------------------------------

/// How a family's grid follows from its config (the kernels' docstrings).
#[derive(Debug, Clone, Copy)]
enum Grid {
    /// `[cdiv(rows, BLOCK_M), heads, batch]`: attn_fwd, preprocess, dq, debug_dropout_mask.
    QueryBlocks { rows: u64, heads: u64, batch: u64 },
    /// `[cdiv(keys, BLOCK_N), heads_k, batch]`: dkdv.
    KeyBlocks { keys: u64, heads: u64, batch: u64 },
    /// `[1 if BIAS_ROWS == 1 else cdiv(Sq, BLOCK_M), cdiv(Sk, BLOCK_N), BIAS_BATCHES·BIAS_HEADS]`.
    Dbias { sq: u64, sk: u64, sizes: [u64; 4] },
}

fn config(meta: &KernelMeta, key: &str) -> u64 {
    *meta.config.get(key).unwrap_or_else(|| panic!("kernel {} has no {key}", meta.id)) as u64
}

impl Grid {
    fn of(&self, meta: &KernelMeta) -> [u64; 3] {
        match *self {
            Grid::QueryBlocks { rows, heads, batch } => [rows.div_ceil(config(meta, "BLOCK_M")), heads, batch],
            Grid::KeyBlocks { keys, heads, batch } => [keys.div_ceil(config(meta, "BLOCK_N")), heads, batch],
            Grid::Dbias { sq, sk, sizes } => {
                let rows = if sizes[2] == 1 { 1 } else { sq.div_ceil(config(meta, "BLOCK_M")) };
                [rows, sk.div_ceil(config(meta, "BLOCK_N")), sizes[0] * sizes[1]]
            }
        }
    }
}

/// One launch a call must make.
struct Launch {
    family: &'static str,
    axes: Vec<(&'static str, String)>,
    grid: Grid,
    /// attn_fwd's config rule (python/rules.py): the largest BLOCK_M whose grid gives every
    /// compute unit a program, else the smallest. Other families: their first kernel.
    heuristic: bool,
    variant: &'static str,
    args: Expect,
}

fn bucket(d: u64) -> u64 {
    *HEAD_DIM_BUCKETS.iter().find(|&&b| b >= d).expect("head dim above 256")
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "fp16",
        DType::BF16 => "bf16",
        DType::F32 => "fp32",
        DType::I32 => "i32",
        DType::F8E4M3 => "fp8e4nv",
    }
}

/// The functional axes a family of the case runs with.
fn axes(c: &Case, family: &str) -> Vec<(&'static str, String)> {
    let b = |on: bool| on.to_string();
    let mut axes = vec![("dtype", dtype_name(c.dtype).to_string())];
    if family != "attn_bwd_preprocess" {
        axes.push(("tf32", b(c.tf32 && c.dtype == DType::F32)));
    }
    axes.push(("head_dim", bucket(c.d).to_string()));
    if family != "attn_bwd_preprocess" {
        axes.push(("dropout", b(c.dropout.is_some())));
    }
    if matches!(family, "attn_fwd" | "attn_bwd_dkdv" | "attn_bwd_dq") {
        axes.push(("bias", b(c.bias.is_some())));
        // An optional axis: named only when on.
        if c.softcap != 0.0 {
            axes.push(("softcap", b(true)));
        }
        if c.alibi_rows != 0 {
            axes.push(("alibi", b(true)));
        }
    }
    axes
}

fn variant(c: &Case, family: &str) -> &'static str {
    if c.generic.contains(&family) { "generic" } else { "aligned" }
}

fn fwd_launches(c: &Case, t: &Tensors) -> Vec<Launch> {
    let d = dims(c);
    vec![Launch {
        family: "attn_fwd",
        axes: axes(c, "attn_fwd"),
        grid: Grid::QueryBlocks { rows: d.sq, heads: c.hq, batch: d.batch },
        heuristic: true,
        variant: variant(c, "attn_fwd"),
        args: fwd_expect(c, t),
    }]
}

fn bwd_launches(c: &Case, t: &Tensors) -> Vec<Launch> {
    let d = dims(c);
    let args = bwd_expect(c, t);
    let launch = |family: &'static str, grid| Launch {
        family,
        axes: axes(c, family),
        grid,
        heuristic: false,
        variant: variant(c, family),
        args: args.clone(),
    };
    let mut launches = vec![
        launch("attn_bwd_preprocess", Grid::QueryBlocks { rows: d.sq, heads: c.hq, batch: d.batch }),
        launch("attn_bwd_dkdv", Grid::KeyBlocks { keys: d.sk, heads: c.hk, batch: d.batch }),
        launch("attn_bwd_dq", Grid::QueryBlocks { rows: d.sq, heads: c.hq, batch: d.batch }),
    ];
    if let Some(db) = &t.dbias {
        launches.push(launch("attn_bwd_dbias", Grid::Dbias { sq: d.sq, sk: d.sk, sizes: db.sizes }));
    }
    launches
}

fn debug_mask_launches(m: &DebugMaskCase) -> Vec<Launch> {
    let [b, h, s, _] = m.sizes;
    vec![Launch {
        family: "debug_dropout_mask",
        axes: vec![("dtype", "fp32".into())],
        grid: Grid::QueryBlocks { rows: s, heads: h, batch: b },
        heuristic: false,
        variant: "aligned",
        args: debug_mask_expect(m).1,
    }]
}

/// The launches of one call of the list, and its stream.
fn expected(op: Op, name: &str) -> (Vec<Launch>, u64) {
    if op == Op::DebugMask {
        assert_eq!(name, DEBUG_MASK.name);
        return (debug_mask_launches(&DEBUG_MASK), STREAM);
    }
    let c = cases().into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case {name}"));
    let t = tensors(&c);
    let launches = if op == Op::Fwd { fwd_launches(&c, &t) } else { bwd_launches(&c, &t) };
    (launches, c.stream)
}

// ---------------------------------------------------------------------------------------------
// Checking recorded launches
// ---------------------------------------------------------------------------------------------

fn launches_of(records: &[Value]) -> Vec<&Value> {
    records.iter().filter(|r| call(r) == "hipModuleLaunchKernel").collect()
}

/// A launch record without the function handle (which depends on load order): what must be
/// byte-identical between the Rust and the C++ API.
fn normalized(r: &Value) -> Value {
    let mut r = r.clone();
    r.as_object_mut().unwrap().remove("function");
    r
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn u64_field(r: &Value, key: &str) -> u64 {
    r[key].as_u64().unwrap_or_else(|| panic!("record without {key}: {r}"))
}

fn triple(r: &Value, key: &str) -> [u64; 3] {
    let a = r[key].as_array().unwrap_or_else(|| panic!("record without {key}: {r}"));
    [a[0].as_u64().unwrap(), a[1].as_u64().unwrap(), a[2].as_u64().unwrap()]
}

struct Checker<'a> {
    archive: &'a Archive,
    comgr: &'a Comgr,
    /// Per functional: (FNV-1a, length, code-object metadata) of each kernel's image.
    images: HashMap<usize, Vec<(u64, usize, comgr::Kernel)>>,
    /// Images whose launches were checked (FNV-1a hex).
    checked_images: HashSet<String>,
    args_checked: usize,
}

impl Checker<'_> {
    fn images(&mut self, functional: usize) -> &[(u64, usize, comgr::Kernel)] {
        let (archive, comgr) = (self.archive, self.comgr);
        self.images.entry(functional).or_insert_with(|| {
            let images = archive.load_images(functional).unwrap_or_else(|e| panic!("{e}"));
            images
                .iter()
                .map(|image| {
                    let object = comgr.read(image).unwrap_or_else(|e| panic!("comgr: {e}"));
                    assert_eq!(object.kernels.len(), 1, "one kernel per code object");
                    (fnv1a64(image), image.len(), object.kernels[0].clone())
                })
                .collect()
        })
    }

    /// The kernel the runtime must pick in `functional` for `want` (independently of its
    /// dispatcher): those whose compiled divisibility hints hold for the expected values, the
    /// `aligned` ones among them if any, then the config rule.
    fn expected_kernel(&self, f: &Functional, want: &Launch) -> usize {
        let fits = |meta: &KernelMeta| {
            meta.args.iter().all(|arg| {
                let d = arg.divisibility.max(1) as i64;
                match want.args.get(arg.name.as_str()) {
                    Some(Val::Ptr(p)) => *p % d as u64 == 0,
                    Some(Val::Int(v)) => v % d == 0,
                    Some(Val::F32(_)) => d == 1,
                    None => panic!("kernel {}: no expectation for argument {}", meta.id, arg.name),
                }
            })
        };
        let fitting: Vec<usize> = (0..f.kernels.len()).filter(|&i| fits(&f.kernels[i])).collect();
        let aligned: Vec<usize> = fitting.iter().copied().filter(|&i| f.kernels[i].variant == "aligned").collect();
        let pool = if aligned.is_empty() { fitting } else { aligned };
        assert!(!pool.is_empty(), "{}: no kernel fits", f.display_name());
        if !want.heuristic {
            return pool[0];
        }
        let block_m = |i: usize| config(&f.kernels[i], "BLOCK_M");
        let programs = |i: usize| want.grid.of(&f.kernels[i]).iter().product::<u64>();
        let filling: Vec<usize> = pool.iter().copied().filter(|&i| programs(i) >= MULTIPROCESSORS).collect();
        match filling.iter().copied().max_by_key(|&i| (block_m(i), std::cmp::Reverse(i))) {
            Some(i) => i,
            None => pool.iter().copied().min_by_key(|&i| (block_m(i), i)).unwrap(),
        }
    }

    /// Checks one recorded launch against what it must be.
    fn check(&mut self, what: &str, r: &Value, want: &Launch, stream: u64) {
        let what = format!("{what}, {}", want.family);
        assert_eq!(r["rc"], 0, "{what}: launch failed: {r}");
        assert_eq!(u64_field(r, "stream"), stream, "{what}: stream");
        let axes: Vec<(&str, &str)> = want.axes.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let functional = self
            .archive
            .find(want.family, &axes)
            .unwrap_or_else(|| panic!("{what}: the archive has no {} {axes:?}", want.family));
        let hash = r["image_fnv1a"].as_str().unwrap().to_string();
        let len = u64_field(r, "image_len") as usize;
        let index = self
            .images(functional)
            .iter()
            .position(|(h, l, _)| format!("{h:016x}") == hash && *l == len)
            .unwrap_or_else(|| {
                let name = self.archive.functionals()[functional].display_name();
                panic!("{what}: the launched image ({hash}, {len} bytes) is none of {name}'s")
            });
        let object = self.images(functional)[index].2.clone();
        let f = &self.archive.functionals()[functional];
        let meta = &f.kernels[index];
        assert_eq!(meta.variant, want.variant, "{what}: ran {}", meta.id);
        let expected = self.expected_kernel(f, want);
        let want_id = &f.kernels[expected].id;
        assert_eq!(&meta.id, want_id, "{what}: the runtime picked {} instead of {want_id}", meta.id);
        assert_eq!(r["symbol"], meta.symbol.as_str(), "{what}: symbol");
        assert_eq!(object.name, meta.symbol, "{what}: the code object's kernel");
        assert_eq!(triple(r, "grid"), want.grid.of(meta), "{what}: grid ({})", meta.id);
        assert_eq!(meta.warp_size, WAVE, "{}", meta.id);
        assert_eq!(triple(r, "block"), [(meta.num_warps * WAVE) as u64, 1, 1], "{what}: block ({})", meta.id);
        assert_eq!(u64_field(r, "shared"), meta.shared as u64, "{what}: LDS ({})", meta.id);

        // The kernarg segment: every explicit argument at the code object's offsets.
        let kernarg = unhex(r["kernarg"].as_str().unwrap());
        assert_eq!(kernarg.len(), object.kernarg_segment_size as usize, "{what}: kernarg segment size");
        let explicit: Vec<&comgr::Arg> = object.args.iter().filter(|a| !a.is_hidden()).collect();
        assert_eq!(explicit.len(), meta.args.len() + 2, "{what}: {}'s arguments + Triton's two scratch pointers", meta.id);
        for (i, slot) in explicit.iter().enumerate() {
            let bytes = &kernarg[slot.offset as usize..(slot.offset + slot.size) as usize];
            let Some(arg) = meta.args.get(i) else {
                assert_eq!((slot.size, slot.value_kind.as_str()), (8, "global_buffer"), "{what}: scratch pointer {i}");
                assert!(bytes.iter().all(|&b| b == 0), "{what}: scratch pointer {i} is not null: {bytes:02x?}");
                self.args_checked += 1;
                continue;
            };
            let ty = arg.ty.as_str();
            let (size, kind) = match ty {
                t if t.starts_with('*') => (8, "global_buffer"),
                "i64" => (8, "by_value"),
                "i32" | "u32" | "fp32" => (4, "by_value"),
                other => panic!("{what}: {} has an argument {} of type {other}", meta.id, arg.name),
            };
            let (name, in_object) = (&arg.name, (slot.size, slot.value_kind.as_str()));
            assert_eq!(in_object, (size, kind), "{what}: {name} ({ty}) in the code object");
            let le = |n| {
                let mut word = [0u8; 8];
                word[..n].copy_from_slice(&bytes[..n]);
                u64::from_le_bytes(word)
            };
            let got = match ty {
                t if t.starts_with('*') => Val::Ptr(le(8)),
                "i64" => Val::Int(le(8) as i64),
                "i32" => Val::Int(le(4) as u32 as i32 as i64),
                "u32" => Val::Int(le(4) as i64),
                _ => Val::F32(f32::from_bits(le(4) as u32)),
            };
            let expected = *want.args.get(name.as_str()).unwrap_or_else(|| panic!("{what}: no expectation for {name}"));
            let same = match (got, expected) {
                (Val::F32(a), Val::F32(b)) => a.to_bits() == b.to_bits(),
                (a, b) => a == b,
            };
            assert!(same, "{what}: {} argument {name} ({ty}) is {got:?}, expected {expected:?}", meta.id);
            self.args_checked += 1;
        }
        self.checked_images.insert(hash);
    }

    /// Checks a call's records: every call succeeded, and the launches are exactly `want`, in
    /// order. Returns the normalised launch records.
    fn check_call(&mut self, what: &str, records: &[Value], want: &[Launch], stream: u64) -> Vec<Value> {
        for r in records {
            assert_eq!(r["rc"], 0, "{what}: a HIP call failed: {r}");
        }
        let launches = launches_of(records);
        let families: Vec<&str> = want.iter().map(|l| l.family).collect();
        let symbols: Vec<&str> = launches.iter().map(|r| r["symbol"].as_str().unwrap_or("?")).collect();
        assert_eq!(launches.len(), want.len(), "{what}: launched {symbols:?}, expected {families:?}");
        for (r, w) in launches.iter().zip(want) {
            self.check(what, r, w, stream);
        }
        launches.into_iter().map(normalized).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

/// The FNV-1a hashes of the images loaded.
fn loaded_images(records: &[Value]) -> Vec<String> {
    let loads = records.iter().filter(|r| call(r) == "hipModuleLoadData");
    loads.map(|r| r["image_fnv1a"].as_str().unwrap().to_string()).collect()
}

fn records_calls(records: &[Value]) -> Vec<&str> {
    records.iter().map(call).collect()
}

#[test]
fn recorded_launches() {
    let comgr = match Comgr::load() {
        Ok(c) => c,
        Err(e) => return skip_or_fail(&e),
    };
    if !aotriton::built_archs().contains(&"gfx942") {
        return skip_or_fail("the build carries no gfx942 kernels (AOTRITON_TARGET_ARCH)");
    }
    let archive = match Archive::open(&archive_path("gfx942")) {
        Ok(a) => a,
        Err(e) => return skip_or_fail(&format!("the gfx942 archive file (AOTRITON_ARCHIVE_DIR): {e}")),
    };

    // SAFETY: before the runtime's first HIP call, while this test is the only thread of this
    // file touching the environment.
    let (double, mut log) = unsafe { hip_double::attach("rust", 1) };

    let mut checker =
        Checker { archive: &archive, comgr: &comgr, images: HashMap::new(), checked_images: HashSet::new(), args_checked: 0 };
    let mut rust_launches = 0;
    let mut recorded: HashMap<(&str, Op), Vec<Value>> = HashMap::new();
    let mut loaded: Vec<String> = Vec::new();
    let mut first = true;

    for c in cases() {
        let t = tensors(&c);
        let stream = Stream::hip(c.stream as usize);

        let what = format!("{} attn_fwd", c.name);
        flash::attn_fwd(&fwd_params(&c, &t), stream).unwrap_or_else(|e| panic!("{what}: {e}"));
        let records = log.take();
        if first {
            // The runtime's initialisation and device queries, on the first call only.
            let calls = records_calls(&records);
            let init = ["hipRuntimeGetVersion", "hipInit", "hipGetDeviceCount", "hipGetDevice", "hipGetDevicePropertiesR0600"];
            for needed in init {
                assert!(calls.contains(&needed), "{what}: no {needed} among {calls:?}");
            }
            let attributes: Vec<u64> =
                records.iter().filter(|r| call(r) == "hipDeviceGetAttribute").map(|r| u64_field(r, "attribute")).collect();
            assert_eq!(attributes, [63, 74, 87], "{what}: device attributes read");
            first = false;
        }
        if c.stream != 0 {
            let asked = records.iter().any(|r| call(r) == "hipStreamGetDevice" && u64_field(r, "stream") == c.stream);
            assert!(asked, "{what}: the device of the stream was not asked");
        }
        loaded.extend(loaded_images(&records));
        let got = checker.check_call(&what, &records, &fwd_launches(&c, &t), c.stream);
        rust_launches += got.len();
        recorded.insert((c.name, Op::Fwd), got);

        if c.backward {
            let what = format!("{} attn_bwd", c.name);
            flash::attn_bwd(&bwd_params(&c, &t), stream).unwrap_or_else(|e| panic!("{what}: {e}"));
            let records = log.take();
            loaded.extend(loaded_images(&records));
            let got = checker.check_call(&what, &records, &bwd_launches(&c, &t), c.stream);
            rust_launches += got.len();
            recorded.insert((c.name, Op::Bwd), got);
        }
    }

    // debug_dropout_mask.
    {
        let m = &DEBUG_MASK;
        let (out, _) = debug_mask_expect(m);
        let mut dropout = Dropout::new(m.p, addr::SEED, addr::OFFSET);
        dropout.offset_base = m.offset_base;
        flash::debug_dropout_mask(&view4(&out, DType::F32), &dropout, Stream::hip(STREAM as usize)).unwrap();
        let records = log.take();
        loaded.extend(loaded_images(&records));
        let got = checker.check_call(m.name, &records, &debug_mask_launches(m), STREAM);
        rust_launches += got.len();
        recorded.insert((m.name, Op::DebugMask), got);
    }

    // Backends: Auto takes the portable kernels on gfx942 even with a workspace; a forced Gluon
    // call is refused with the reason, launching nothing.
    {
        let c = cases().into_iter().find(|c| c.name == "fp16-d64").unwrap();
        let t = tensors(&c);
        let stream = Stream::hip(STREAM as usize);
        let workspace = Workspace { ptr: addr::WORKSPACE, bytes: 1 << 30 };

        let mut p = bwd_params(&c, &t);
        p.workspace = Some(workspace);
        assert_eq!(flash::attn_bwd_workspace_bytes(&p, stream).unwrap(), 0, "no Gluon workspace on gfx942");
        flash::attn_bwd(&p, stream).unwrap();
        let records = log.take();
        let got = checker.check_call("fp16-d64 attn_bwd (Auto, with a workspace)", &records, &bwd_launches(&c, &t), STREAM);
        assert_eq!(got, recorded[&(c.name, Op::Bwd)], "the workspace changes nothing on the portable path");
        rust_launches += got.len();

        let refused = |what: &str, e: aotriton::Error, reason: &[&str], records: Vec<Value>| {
            assert_eq!(e.kind(), ErrorKind::UnsupportedByBackend, "{what}: {e}");
            for part in reason {
                assert!(e.message().contains(part), "{what}: {e} does not say {part:?}");
            }
            let calls = records_calls(&records);
            assert!(!calls.iter().any(|c| *c == "hipModuleLoadData" || *c == "hipModuleLaunchKernel"), "{what}: {calls:?}");
            assert!(records.iter().all(|r| r["rc"] == 0), "{what}: {records:?}");
        };
        let mut p = fwd_params(&c, &t);
        p.backend = Backend::Gluon;
        let e = flash::attn_fwd(&p, stream).unwrap_err();
        refused("forced Gluon attn_fwd", e, &["Gluon", "sm_90 only", "gfx942"], log.take());
        let mut p = bwd_params(&c, &t);
        p.backend = Backend::Gluon;
        p.workspace = Some(workspace);
        let e = flash::attn_bwd(&p, stream).unwrap_err();
        refused("forced Gluon attn_bwd", e, &["Gluon", "sm_90 only", "gfx942"], log.take());
        // Input conditions are checked before the driver is touched: no HIP call at all.
        p.workspace = None;
        let e = flash::attn_bwd(&p, stream).unwrap_err();
        let records = log.take();
        assert!(records.is_empty(), "{records:?}");
        refused("forced Gluon attn_bwd without a workspace", e, &["workspace"], records);
        let mut p = fwd_params(&c, &t);
        p.backend = Backend::Gluon;
        p.softcap = 30.0;
        let e = flash::attn_fwd(&p, stream).unwrap_err();
        let records = log.take();
        assert!(records.is_empty(), "{records:?}");
        refused("forced Gluon attn_fwd with soft-capping", e, &["soft-capping"], records);
        // Dropout is an input the Gluon backend serves: refused by the device (sm_90 only).
        let mut p = fwd_params(&c, &t);
        p.backend = Backend::Gluon;
        p.dropout = Some(Dropout::new(0.1, addr::SEED, addr::OFFSET));
        let e = flash::attn_fwd(&p, stream).unwrap_err();
        refused("forced Gluon attn_fwd with dropout", e, &["Gluon", "sm_90 only", "gfx942"], log.take());
    }

    // Every image loaded was launched and checked.
    for hash in &loaded {
        assert!(checker.checked_images.contains(hash), "image {hash} was loaded but no checked launch ran it");
    }

    let cpp_launches = cpp_half(&hip_double::target_subdir("hip-double"), &double, &mut checker, &recorded);
    println!(
        "recorded launches checked: {rust_launches} (Rust API), {} (C++ API); kernel arguments checked: {}",
        cpp_launches.map_or("skipped".to_string(), |n| n.to_string()),
        checker.args_checked
    );
}

/// Runs `cpp/recorded_launches.cpp` through the installed C++ API against the double and checks
/// its launches: the same expectations as the Rust API's calls of the same cases, and
/// byte-identical records. Returns the launches checked, or None when skipped.
fn cpp_half(work: &Path, double: &Path, checker: &mut Checker, recorded: &HashMap<(&str, Op), Vec<Value>>) -> Option<usize> {
    let source = repo_root().join("test/amd/cpp/recorded_launches.cpp");
    let exe = match compile_cpp(&source, &work.join("cpp")) {
        Ok(exe) => exe,
        Err(e) => {
            skip_or_fail(&format!("the C++ half: {e}"));
            return None;
        }
    };
    let cpp_log = work.join(format!("logs/cpp-{}.jsonl", std::process::id()));
    let mut log = Log::new(cpp_log.clone());
    let output = Command::new(&exe)
        .env("AOTRITON_HIP_LIBRARY", double)
        .env("AOTRITON_HIP_DOUBLE_LOG", &cpp_log)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.code() == Some(77) {
        skip_or_fail(&format!("the C++ half: {}", printed.trim()));
        return None;
    }
    assert!(output.status.success() && printed.is_empty(), "{} failed ({}):\n{printed}", exe.display(), output.status);

    let records = log.take();
    for r in &records {
        assert_eq!(r["rc"], 0, "C++ API: a HIP call failed: {r}");
    }
    let launches = launches_of(&records);
    let mut at = 0;
    for &(name, op) in CPP_CALLS {
        let what = format!("C++ API: {name} {op:?}");
        let (want, stream) = expected(op, name);
        let end = at + want.len();
        assert!(launches.len() >= end, "{what}: the program launched {} kernels in all", launches.len());
        for (r, w) in launches[at..end].iter().zip(&want) {
            checker.check(&what, r, w, stream);
        }
        let got: Vec<Value> = launches[at..end].iter().map(|r| normalized(r)).collect();
        assert_eq!(got, recorded[&(name, op)], "{what}: the C++ API's launches differ from the Rust API's");
        at = end;
    }
    assert_eq!(at, launches.len(), "C++ API: {} launches beyond the expected ones", launches.len() - at);
    for hash in loaded_images(&records) {
        assert!(checker.checked_images.contains(&hash), "C++ API: image {hash} was loaded but no checked launch ran it");
    }
    Some(at)
}
