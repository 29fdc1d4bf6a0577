//! Property fuzzing of the parameter validation: `flash::attn_fwd`, `attn_bwd`,
//! `attn_bwd_workspace_bytes`, `debug_dropout_mask` and `dropout_offsets_consumed` on random and
//! edge-case inputs (sizes, strides, pointers, dtypes, windows, lengths, packed batches with and
//! without host copies, dropout, bias, backends, workspace), on streams whose runtime has no
//! device here, so nothing can launch.
//!
//! Properties: no call panics (the tests run with overflow checks); every error is one of the
//! documented kinds a call without a device can give (never `Internal`); a call built valid
//! (before any mutation) passes validation, i.e. fails only at the driver (`NoDriver`/`NoDevice`)
//! or, for a forced Gluon backend, with `UnsupportedByBackend`; `attn_bwd_workspace_bytes` and
//! `attn_bwd` report the same validation error; `dropout_offsets_consumed` gives the exact
//! product or refuses it, never a wrapped value.
//!
//! Budget and seed: see `fuzz_common` (`AOTRITON_FUZZ_SECONDS`, `AOTRITON_FUZZ_SEED`,
//! `AOTRITON_FUZZ_CASE`). The `regression_*` tests are concrete inputs that broke these properties.
mod fuzz_common;

use std::fmt::Debug;
use std::sync::OnceLock;

use aotriton::flash::{self, Backend, BwdParams, Dropout, FwdParams, Mask, MaskAlign, Varlen, Workspace};
use aotriton::{DType, ErrorKind, Stream, TensorView};
use fuzz_common::{FuzzConfig, Rng, assert_clean, fuzz_loop, no_panic, note_case, short_list};

// ---------------------------------------------------------------------------------------------
// Streams that cannot launch
// ---------------------------------------------------------------------------------------------

/// The streams the fuzzer may call with fake device pointers: those whose runtime answers a
/// valid call with `NoDriver` or `NoDevice`. A runtime with a device (or a recording double) is
/// left out, since a valid random call would launch kernels on made-up addresses.
fn usable_streams() -> &'static [Stream] {
    static STREAMS: OnceLock<Vec<Stream>> = OnceLock::new();
    STREAMS.get_or_init(|| {
        let mut usable = Vec::new();
        for stream in [Stream::null(), Stream::hip(0)] {
            // The workspace query touches the driver for a Gluon-eligible call but never launches.
            let probe = small_bwd_case(Backend::Gluon);
            match flash::attn_bwd_workspace_bytes(&probe.bwd_params(), stream) {
                Err(e) if matches!(e.kind(), ErrorKind::NoDriver | ErrorKind::NoDevice) => usable.push(stream),
                other => println!("fuzz_validation: {:?} left out: it has a device ({other:?})", stream.runtime()),
            }
        }
        usable
    })
}

fn stream_of(kind: u8) -> Option<Stream> {
    let streams = usable_streams();
    (!streams.is_empty()).then(|| streams[kind as usize % streams.len()])
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Fwd,
    Bwd,
    /// `attn_bwd_workspace_bytes`, then `attn_bwd` on the same parameters.
    WorkspaceBytes,
    DebugDropout,
}

#[derive(Clone)]
struct VarlenCase {
    cu_q: TensorView<1>,
    cu_k: TensorView<1>,
    max_q: u64,
    max_k: u64,
    host: Option<(Vec<i32>, Vec<i32>)>,
    /// Device address of the status word the kernels flag clamped offsets in (0 = none).
    status: u64,
}

impl Debug for VarlenCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = self.host.as_ref().map(|(q, k)| (short_list(q), short_list(k)));
        f.debug_struct("Varlen")
            .field("cu_q", &self.cu_q)
            .field("cu_k", &self.cu_k)
            .field("max_q", &self.max_q)
            .field("max_k", &self.max_k)
            .field("host", &host)
            .field("status", &self.status)
            .finish()
    }
}

/// Everything one call takes, owned (the host copies of a packed batch live here).
#[derive(Debug, Clone)]
struct Case {
    op: Op,
    /// Index into `usable_streams()`.
    stream: u8,
    q: TensorView<4>,
    k: TensorView<4>,
    v: TensorView<4>,
    o: TensorView<4>,
    d_o: TensorView<4>,
    dq: TensorView<4>,
    dk: TensorView<4>,
    dv: TensorView<4>,
    /// `None`: the forward does not want it; the backward gets a null view.
    lse: Option<TensorView<3>>,
    delta: TensorView<3>,
    sm_scale: f32,
    mask: Mask,
    bias: Option<TensorView<4>>,
    dbias: Option<TensorView<4>>,
    dropout: Option<Dropout>,
    varlen: Option<VarlenCase>,
    allow_tf32: bool,
    deterministic: bool,
    backend: Backend,
    workspace: Option<Workspace>,
    /// `debug_dropout_mask`'s output.
    debug_out: TensorView<4>,
    /// What was changed from the valid call that was generated first; empty: the call is valid.
    mutations: Vec<String>,
}

impl Case {
    fn varlen(&self) -> Option<Varlen<'_>> {
        self.varlen.as_ref().map(|v| Varlen {
            cu_seqlens_q: v.cu_q,
            cu_seqlens_k: v.cu_k,
            max_seqlen_q: v.max_q,
            max_seqlen_k: v.max_k,
            host_cu_seqlens: v.host.as_ref().map(|(q, k)| (q.as_slice(), k.as_slice())),
            status: v.status,
        })
    }

    fn fwd_params(&self) -> FwdParams<'_> {
        let mut p = FwdParams::new(self.q, self.k, self.v, self.o, self.lse);
        p.sm_scale = self.sm_scale;
        p.mask = self.mask;
        p.bias = self.bias;
        p.dropout = self.dropout;
        p.varlen = self.varlen();
        p.allow_tf32 = self.allow_tf32;
        p.backend = self.backend;
        p
    }

    fn bwd_params(&self) -> BwdParams<'_> {
        let lse = self.lse.unwrap_or(TensorView::new(0, self.delta.sizes, self.delta.strides, DType::F32));
        let mut p = BwdParams::new(self.q, self.k, self.v, self.o, self.d_o, lse, self.delta, self.dq, self.dk, self.dv);
        p.sm_scale = self.sm_scale;
        p.mask = self.mask;
        p.bias = self.bias;
        p.dbias = self.dbias;
        p.dropout = self.dropout;
        p.varlen = self.varlen();
        p.allow_tf32 = self.allow_tf32;
        p.deterministic = self.deterministic;
        p.backend = self.backend;
        p.workspace = self.workspace;
        p
    }
}

/// Device addresses of made-up, disjoint regions (64 GiB apart), so a valid call never aliases.
fn region(i: u64) -> u64 {
    0x7000_0000_0000 + (i << 36)
}

/// A view in B×H×S×D (`bshd` false) or B×S×H×D memory order (`bshd` true), always with a unit last stride.
fn view4(ptr: u64, sizes: [u64; 4], dtype: DType, bshd: bool) -> TensorView<4> {
    if !bshd {
        return TensorView::contiguous(ptr, sizes, dtype);
    }
    let [_, h, s, d] = sizes;
    TensorView::new(ptr, sizes, [(s * h * d) as i64, d as i64, (h * d) as i64, 1], dtype)
}

/// A small valid backward call (the probe of `usable_streams`).
fn small_bwd_case(backend: Backend) -> Case {
    let t = |i, s| TensorView::contiguous(region(i), [1, 1, s, 64], DType::F16);
    let rows = |i| TensorView::contiguous(region(i), [1, 1, 128], DType::F32);
    Case {
        op: Op::Bwd,
        stream: 0,
        q: t(0, 128),
        k: t(1, 128),
        v: t(2, 128),
        o: t(3, 128),
        d_o: t(4, 128),
        dq: t(5, 128),
        dk: t(6, 128),
        dv: t(7, 128),
        lse: Some(rows(8)),
        delta: rows(9),
        sm_scale: 0.125,
        mask: Mask::NONE,
        bias: None,
        dbias: None,
        dropout: None,
        varlen: None,
        allow_tf32: false,
        deterministic: false,
        backend,
        workspace: None,
        debug_out: TensorView::contiguous(region(19), [1, 1, 128, 128], DType::F32),
        mutations: Vec::new(),
    }
}

fn seq_len(rng: &mut Rng) -> u64 {
    match rng.below(4) {
        0 => rng.pick(&[1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129]),
        1 => rng.range(1, 4096),
        _ => rng.range(1, 300),
    }
}

/// A call that every documented rule accepts: consistent shapes, unit last strides, aligned
/// disjoint pointers, head dim a multiple of 8 up to 256, lengths far from every limit.
fn valid_case(rng: &mut Rng) -> Case {
    let op = rng.pick(&[Op::Fwd, Op::Fwd, Op::Bwd, Op::WorkspaceBytes, Op::DebugDropout]);
    let dtype = rng.pick(&[DType::F16, DType::BF16, DType::F32]);
    let heads_k = if rng.one_in(2) { rng.pick(&[1, 2, 4]) } else { rng.range(1, 16) };
    let heads_q = heads_k * rng.pick(&[1, 1, 2, 4]);
    let head_dim = if rng.one_in(2) { rng.pick(&[8, 16, 64, 72, 128, 136, 256]) } else { 8 * rng.range(1, 32) };
    let bshd = rng.one_in(2);
    let packed = rng.one_in(4);
    let batch = if rng.one_in(2) { 1 } else { rng.range(1, 6) };
    let (varlen, tensor_batch, tokens_q, tokens_k, seqlen_q, seqlen_k) = if packed {
        let lengths = |rng: &mut Rng| (0..batch).map(|_| rng.range(1, 200) as i32).collect::<Vec<i32>>();
        let (lens_q, lens_k) = (lengths(rng), lengths(rng));
        let offsets = |lens: &[i32]| std::iter::once(0).chain(lens.iter().scan(0, |sum, &l| { *sum += l; Some(*sum) })).collect::<Vec<i32>>();
        let (cu_q, cu_k) = (offsets(&lens_q), offsets(&lens_k));
        // Spare tokens after the last sequence are allowed; max lengths at or above the longest.
        let tokens_q = *cu_q.last().unwrap() as u64 + rng.pick(&[0, 0, 5]);
        let tokens_k = *cu_k.last().unwrap() as u64 + rng.pick(&[0, 0, 3]);
        let max_q = *lens_q.iter().max().unwrap() as u64 + rng.pick(&[0, 0, 1]);
        let max_k = *lens_k.iter().max().unwrap() as u64 + rng.pick(&[0, 0, 1]);
        let cu = |i| TensorView::contiguous(region(i), [batch + 1], DType::I32);
        let host = if rng.one_in(2) { Some((cu_q, cu_k)) } else { None };
        let status = if rng.one_in(2) { region(20) } else { 0 };
        (Some(VarlenCase { cu_q: cu(12), cu_k: cu(13), max_q, max_k, host, status }), 1, tokens_q, tokens_k, max_q, max_k)
    } else {
        let (sq, sk) = (seq_len(rng), seq_len(rng));
        (None, batch, sq, sk, sq, sk)
    };
    let qs = [tensor_batch, heads_q, tokens_q, head_dim];
    let ks = [tensor_batch, heads_k, tokens_k, head_dim];
    let t = |i, sizes| view4(region(i), sizes, dtype, bshd);
    let rows = |i| TensorView::contiguous(region(i), [tensor_batch, heads_q, tokens_q], DType::F32);
    let mask = match rng.below(4) {
        0 => Mask::NONE,
        1 => Mask::causal(rng.pick(&[MaskAlign::TopLeft, MaskAlign::BottomRight])),
        2 => Mask::window(rng.range(0, 64) as i32, rng.range(0, 64) as i32, MaskAlign::BottomRight),
        _ => Mask::window(rng.pick(&[-1, 0, 3]), rng.pick(&[-1, 0, 5]), MaskAlign::TopLeft),
    };
    let bias = (op != Op::DebugDropout && rng.one_in(4)).then(|| {
        let sizes = [
            if rng.one_in(2) { 1 } else { batch },
            if rng.one_in(2) { 1 } else { heads_q },
            if rng.one_in(2) { 1 } else { seqlen_q },
            seqlen_k,
        ];
        TensorView::contiguous(region(10), sizes, dtype)
    });
    let dbias = bias.filter(|_| rng.one_in(2)).map(|b| TensorView { ptr: region(11), ..b });
    let dropout = (op == Op::DebugDropout || rng.one_in(4)).then(|| {
        let mut d = Dropout::new(rng.below(1000) as f32 / 1000.0, region(14), region(15));
        d.offset_base = rng.pick(&[0, 1, 1 << 40]);
        if rng.one_in(2) {
            d.seed_out = region(16);
            d.offset_out = region(17);
        }
        d
    });
    let workspace = rng.one_in(2).then(|| Workspace { ptr: region(18), bytes: rng.pick(&[0, 1 << 20, 1 << 34]) });
    let debug_heads = if rng.one_in(2) { heads_q } else { rng.range(1, 8) };
    Case {
        op,
        stream: rng.below(2) as u8,
        q: t(0, qs),
        k: t(1, ks),
        v: t(2, ks),
        o: t(3, qs),
        d_o: t(4, qs),
        dq: t(5, qs),
        dk: t(6, ks),
        dv: t(7, ks),
        lse: (op != Op::Fwd || rng.below(4) != 0).then(|| rows(8)),
        delta: rows(9),
        sm_scale: if rng.one_in(4) { rng.pick(&[0.0, -0.5, 1.0, 8.0, 1e-3]) } else { 1.0 / (head_dim as f32).sqrt() },
        mask,
        bias,
        dbias,
        dropout,
        varlen,
        allow_tf32: dtype == DType::F32 && rng.one_in(2),
        deterministic: rng.one_in(2),
        backend: rng.pick(&[Backend::Auto, Backend::Auto, Backend::Portable, Backend::Gluon]),
        workspace,
        debug_out: TensorView::contiguous(region(19), [batch, debug_heads, seqlen_q, seqlen_k], DType::F32),
        mutations: Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// Mutations: one field set to an edge value
// ---------------------------------------------------------------------------------------------

const SIZE_EDGES: &[u64] = &[
    0, 1, 2, 3, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 257, 264, 4096, 65535, 65536, 1 << 24, (1 << 24) + 1,
    (1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1, 1 << 31, 1 << 32, (1 << 32) + 8, 1 << 40, 1 << 62, 1 << 63,
    u64::MAX / 2, u64::MAX - 1, u64::MAX,
];
const STRIDE_EDGES: &[i64] = &[
    i64::MIN, -(1 << 40), -65536, -8, -1, 0, 1, 2, 7, 8, 16, 64, 4096, 1 << 20, i32::MAX as i64, 1 << 31, 1 << 32,
    1 << 40, 1 << 62, i64::MAX - 1, i64::MAX,
];
const POINTER_EDGES: &[u64] = &[
    0, 1, 2, 3, 4, 6, 8, 12, 15, 16, 0x1000, 1 << 47, 1 << 63, u64::MAX - 15, u64::MAX - 7, u64::MAX - 3, u64::MAX - 1,
    u64::MAX,
];
const LENGTH_EDGES: &[u64] = &[
    0, 1, 2, 65535, 65536, 1 << 24, (1 << 30) - 1, 1 << 30, (1 << 30) + 1, (1 << 31) - 1, 1 << 31, (1 << 31) + 1, 1 << 32,
    u64::MAX,
];
const WINDOW_EDGES: &[i32] = &[i32::MIN, -65536, -2, -1, 0, 1, 2, 127, 128, 1 << 30, i32::MAX - 1, i32::MAX];
const OFFSET_EDGES: &[i32] = &[i32::MIN, -2, -1, 0, 1, 2, 65535, 1 << 30, i32::MAX - 1, i32::MAX];
const P_EDGES: &[f32] = &[
    f32::NAN, -f32::NAN, -0.0, 0.0, 1e-45, -1e-45, 1e-7, 0.5, 0.999_999_94, 1.0, 1.000_000_1, 2.0, -1.0, f32::INFINITY,
    f32::NEG_INFINITY, f32::MAX,
];
const SCALE_EDGES: &[f32] = &[
    f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, -f32::MAX, f32::MIN_POSITIVE, 1e-45, 0.0, -0.0, 1e30, -1.0,
];
const WORKSPACE_EDGES: &[u64] = &[0, 1, 15, 16, 1 << 20, 1 << 40, u64::MAX - 15, u64::MAX];
const DTYPES: &[DType] = &[DType::F16, DType::BF16, DType::F32, DType::I32];

fn edge_size(rng: &mut Rng) -> u64 {
    if rng.one_in(8) { rng.next_u64() >> rng.below(64) } else { rng.pick(SIZE_EDGES) }
}
fn edge_stride(rng: &mut Rng) -> i64 {
    if rng.one_in(8) { (rng.next_u64() as i64) >> rng.below(64) } else { rng.pick(STRIDE_EDGES) }
}
fn edge_pointer(rng: &mut Rng) -> u64 {
    match rng.below(8) {
        0 => rng.next_u64(),
        1 => region(rng.below(20)) + rng.pick(&[1, 2, 4, 8, 16]),
        2 => region(0),
        _ => rng.pick(POINTER_EDGES),
    }
}
fn edge_window(rng: &mut Rng) -> i32 {
    if rng.one_in(4) { (rng.range(0, i32::MAX as u64 + 2) as i64 - 2) as i32 } else { rng.pick(WINDOW_EDGES) }
}

/// The 4-D views of a case, by name.
fn views4(c: &mut Case) -> [(&'static str, &mut TensorView<4>); 9] {
    [
        ("q", &mut c.q),
        ("k", &mut c.k),
        ("v", &mut c.v),
        ("o", &mut c.o),
        ("d_o", &mut c.d_o),
        ("dq", &mut c.dq),
        ("dk", &mut c.dk),
        ("dv", &mut c.dv),
        ("debug_out", &mut c.debug_out),
    ]
}

/// Applies one random mutation to `c` and records what it did.
fn mutate(c: &mut Case, rng: &mut Rng) {
    let what = match rng.below(18) {
        0 => {
            // One size of one tensor.
            let (dim, size) = (rng.index(4), edge_size(rng));
            match rng.below(12) {
                9 => with_opt4(&mut c.bias, "bias", dim, |t| t.sizes[dim] = size),
                10 => with_opt4(&mut c.dbias, "dbias", dim, |t| t.sizes[dim] = size),
                11 => {
                    let rows = if rng.one_in(2) { c.lse.as_mut() } else { Some(&mut c.delta) };
                    match rows {
                        Some(t) => {
                            t.sizes[dim % 3] = size;
                            format!("lse/delta.sizes[{}] = {size}", dim % 3)
                        }
                        None => "no lse".into(),
                    }
                }
                i => {
                    let mut views = views4(c);
                    let (name, t) = &mut views[i as usize];
                    t.sizes[dim] = size;
                    format!("{name}.sizes[{dim}] = {size}")
                }
            }
        }
        1 | 2 => resize_consistently(c, rng),
        17 => resize_large(c, rng),
        3 => {
            let (dim, stride) = (rng.index(4), edge_stride(rng));
            match rng.below(11) {
                9 => with_opt4(&mut c.bias, "bias", dim, |t| t.strides[dim] = stride),
                10 => {
                    let d = dim % 3;
                    c.delta.strides[d] = stride;
                    format!("delta.strides[{d}] = {stride}")
                }
                i => {
                    let mut views = views4(c);
                    let (name, t) = &mut views[i as usize];
                    t.strides[dim] = stride;
                    format!("{name}.strides[{dim}] = {stride}")
                }
            }
        }
        4 => {
            let ptr = edge_pointer(rng);
            match rng.below(16) {
                9 => {
                    c.delta.ptr = ptr;
                    format!("delta.ptr = {ptr:#x}")
                }
                10 => match c.lse.as_mut() {
                    Some(l) => {
                        l.ptr = ptr;
                        format!("lse.ptr = {ptr:#x}")
                    }
                    None => "no lse".into(),
                },
                11 => with_opt4(&mut c.bias, "bias", 0, |t| t.ptr = ptr),
                12 => match c.dropout.as_mut() {
                    Some(d) => {
                        let field = rng.below(4);
                        *[&mut d.seed, &mut d.offset, &mut d.seed_out, &mut d.offset_out][field as usize] = ptr;
                        format!("dropout pointer {field} = {ptr:#x}")
                    }
                    None => "no dropout".into(),
                },
                13 => match c.varlen.as_mut() {
                    Some(v) => {
                        v.cu_q.ptr = ptr;
                        format!("cu_seqlens_q.ptr = {ptr:#x}")
                    }
                    None => "no varlen".into(),
                },
                14 => {
                    // Aliasing: an output on an input.
                    c.o.ptr = c.q.ptr;
                    c.dq.ptr = c.dk.ptr;
                    "o.ptr = q.ptr, dq.ptr = dk.ptr".into()
                }
                15 => match c.workspace.as_mut() {
                    Some(w) => {
                        w.ptr = ptr;
                        format!("workspace.ptr = {ptr:#x}")
                    }
                    None => "no workspace".into(),
                },
                i => {
                    let mut views = views4(c);
                    let (name, t) = &mut views[i as usize];
                    t.ptr = ptr;
                    format!("{name}.ptr = {ptr:#x}")
                }
            }
        }
        5 => {
            let dtype = rng.pick(DTYPES);
            match rng.below(12) {
                9 => {
                    for (_, t) in views4(c).into_iter().take(8) {
                        t.dtype = dtype;
                    }
                    format!("every input/output dtype = {dtype:?}")
                }
                10 => with_opt4(&mut c.bias, "bias", 0, |t| t.dtype = dtype),
                11 => {
                    c.delta.dtype = dtype;
                    format!("delta.dtype = {dtype:?}")
                }
                i => {
                    let mut views = views4(c);
                    let (name, t) = &mut views[i as usize];
                    t.dtype = dtype;
                    format!("{name}.dtype = {dtype:?}")
                }
            }
        }
        6 => {
            c.mask.window_left = edge_window(rng);
            c.mask.window_right = edge_window(rng);
            c.mask.align = rng.pick(&[MaskAlign::TopLeft, MaskAlign::BottomRight]);
            format!("mask = {:?}", c.mask)
        }
        7 | 8 => mutate_varlen(c, rng),
        9 => match c.dropout.as_mut() {
            Some(d) if !rng.one_in(4) => match rng.below(3) {
                0 => {
                    let random = rng.next_u64();
                    d.offset_base = rng.pick(&[u64::MAX, 1 << 63, random]);
                    format!("dropout.offset_base = {}", d.offset_base)
                }
                1 => {
                    d.seed_out = rng.pick(&[0, region(16)]);
                    d.offset_out = rng.pick(&[0, region(17)]);
                    format!("dropout seed_out/offset_out = {:#x}/{:#x}", d.seed_out, d.offset_out)
                }
                _ => {
                    d.p = rng.pick(P_EDGES);
                    format!("dropout.p = {:?}", d.p)
                }
            },
            _ => {
                c.dropout = Some(Dropout::new(rng.pick(P_EDGES), edge_pointer(rng), edge_pointer(rng)));
                format!("dropout = {:?}", c.dropout)
            }
        },
        10 => {
            c.sm_scale = rng.pick(SCALE_EDGES);
            format!("sm_scale = {:?}", c.sm_scale)
        }
        11 => match rng.below(4) {
            0 => {
                c.bias = None;
                "bias = None (dbias kept)".into()
            }
            1 => {
                let sizes = [edge_size(rng), edge_size(rng), edge_size(rng), edge_size(rng)];
                c.bias = Some(TensorView::contiguous(region(10), sizes, c.q.dtype));
                format!("bias.sizes = {sizes:?}")
            }
            2 => {
                c.dbias = c.bias.map(|b| TensorView { ptr: region(11), ..b });
                "dbias like bias".into()
            }
            _ => {
                let sizes = [c.q.sizes[0], c.q.sizes[1], c.q.sizes[2], c.k.sizes[2]];
                c.bias = Some(TensorView::contiguous(region(10), sizes, c.q.dtype));
                c.dbias = rng.one_in(2).then(|| TensorView::contiguous(region(11), sizes, c.q.dtype));
                format!("full bias and dbias {sizes:?}")
            }
        },
        12 => {
            c.backend = rng.pick(&[Backend::Auto, Backend::Portable, Backend::Gluon]);
            format!("backend = {:?}", c.backend)
        }
        13 => {
            c.workspace = (!rng.one_in(4)).then(|| Workspace { ptr: edge_pointer(rng), bytes: rng.pick(WORKSPACE_EDGES) });
            format!("workspace = {:?}", c.workspace)
        }
        14 => {
            c.lse = None;
            "lse = None".into()
        }
        15 => {
            c.allow_tf32 = !c.allow_tf32;
            c.deterministic = !c.deterministic;
            format!("allow_tf32 = {}, deterministic = {}", c.allow_tf32, c.deterministic)
        }
        _ => {
            c.op = rng.pick(&[Op::Fwd, Op::Bwd, Op::WorkspaceBytes, Op::DebugDropout]);
            format!("op = {:?}", c.op)
        }
    };
    c.mutations.push(what);
}

fn with_opt4(t: &mut Option<TensorView<4>>, name: &str, dim: usize, edit: impl FnOnce(&mut TensorView<4>)) -> String {
    match t.as_mut() {
        Some(t) => {
            edit(t);
            format!("{name} edited (dim {dim}): {t:?}")
        }
        None => format!("no {name}"),
    }
}

/// Sets one dimension (batch, heads, Sq, Sk or head dim) of every tensor it appears in, so
/// shapes keep agreeing and validation goes deeper; strides follow in half the cases.
fn resize_consistently(c: &mut Case, rng: &mut Rng) -> String {
    let size = edge_size(rng);
    let restride = rng.one_in(2);
    let dim = rng.below(5);
    set_dimension(c, dim, size, restride);
    let name = ["batch", "heads", "Sq", "Sk", "head dim"][dim as usize];
    format!("{name} = {size} everywhere{}", if restride { ", contiguous strides" } else { "" })
}

/// Sets dimension `dim` (0 batch, 1 query heads, 2 Sq, 3 Sk, 4 head dim, 5 K/V heads) to `size`
/// in every tensor that has it (a broadcast bias dimension of 1 stays 1).
fn set_dimension(c: &mut Case, dim: u64, size: u64, restride: bool) {
    let set = |t: &mut TensorView<4>, d: usize| {
        t.sizes[d] = size;
        if restride {
            *t = TensorView::contiguous(t.ptr, t.sizes, t.dtype);
        }
    };
    let (is_q, is_k) = (|name: &str| matches!(name, "q" | "o" | "d_o" | "dq"), |name: &str| matches!(name, "k" | "v" | "dk" | "dv"));
    for (name, t) in views4(c) {
        match dim {
            0 => set(t, 0),
            1 if is_q(name) || name == "debug_out" => set(t, 1),
            2 if is_q(name) || name == "debug_out" => set(t, 2),
            3 if is_k(name) => set(t, 2),
            3 if name == "debug_out" => set(t, 3),
            4 if is_q(name) || is_k(name) => set(t, 3),
            5 if is_k(name) => set(t, 1),
            _ => {}
        }
    }
    let rows = |t: &mut TensorView<3>| {
        if dim < 3 {
            t.sizes[dim as usize] = size;
            if restride {
                *t = TensorView::contiguous(t.ptr, t.sizes, t.dtype);
            }
        }
    };
    rows(&mut c.delta);
    if let Some(lse) = c.lse.as_mut() {
        rows(lse);
    }
    for b in [c.bias.as_mut(), c.dbias.as_mut()].into_iter().flatten() {
        if dim < 4 && (dim == 3 || b.sizes[dim as usize] != 1) {
            set(b, dim as usize);
        }
    }
}

/// Batch, heads and Sq set large together with the strides kept (small, so every tensor stays
/// TMA-addressable, overlapping): the shapes where products of sizes overflow. F5 needed
/// B = Hq = 65535 and Sq = 2^24 at once, which single-dimension edits almost never reach.
fn resize_large(c: &mut Case, rng: &mut Rng) -> String {
    let mut done = Vec::new();
    for (dim, name) in [(0, "batch"), (1, "heads"), (2, "Sq"), (3, "Sk")] {
        if !rng.one_in(4) {
            let size = rng.pick(&[65535, 65536, 1 << 24, (1 << 24) + 1, 1 << 28]);
            set_dimension(c, dim, size, false);
            done.push(format!("{name} = {size}"));
        }
    }
    if rng.one_in(2) {
        set_dimension(c, 5, 1, false);
        done.push("Hk = 1".into());
    }
    format!("{} everywhere, strides kept", done.join(", "))
}

/// Packed-batch edits: max lengths, malformed host copies, offset tensors, packing turned on.
fn mutate_varlen(c: &mut Case, rng: &mut Rng) -> String {
    let Some(v) = c.varlen.as_mut() else {
        // Packing on a call built dense: batch 1 views keep it consistent half the time.
        let batch = rng.range(1, 4);
        let cu = |i| TensorView::contiguous(region(i), [batch + 1], DType::I32);
        let host = rng.one_in(2).then(|| {
            let offsets = |tokens: u64| (0..=batch).map(|b| (b as u128 * tokens as u128 / batch as u128) as i32).collect::<Vec<i32>>();
            (offsets(c.q.sizes[2]), offsets(c.k.sizes[2]))
        });
        let (max_q, max_k) = (rng.pick(LENGTH_EDGES), rng.pick(LENGTH_EDGES));
        c.varlen = Some(VarlenCase { cu_q: cu(12), cu_k: cu(13), max_q, max_k, host, status: 0 });
        return format!("varlen added: {:?}", c.varlen);
    };
    match rng.below(8) {
        0 => {
            v.max_q = rng.pick(LENGTH_EDGES);
            v.max_k = if rng.one_in(2) { v.max_q } else { rng.pick(LENGTH_EDGES) };
            format!("max_seqlen_q/k = {}/{}", v.max_q, v.max_k)
        }
        1 => {
            v.host = None;
            "host copies dropped".into()
        }
        2 if rng.one_in(2) => {
            // The status word: unaligned, on an input, or anywhere.
            let anywhere = edge_pointer(rng);
            v.status = rng.pick(&[1, 2, region(12), region(0), u64::MAX - 3, anywhere]);
            format!("varlen status = {:#x}", v.status)
        }
        2 => {
            let size = rng.pick(&[0, 1, 2, 65536, 65537, 1 << 31, u64::MAX]);
            v.cu_q.sizes[0] = size;
            if rng.one_in(2) {
                v.cu_k.sizes[0] = size;
            }
            format!("cu_seqlens sizes = {}/{}", v.cu_q.sizes[0], v.cu_k.sizes[0])
        }
        3 => {
            v.cu_k.dtype = rng.pick(DTYPES);
            v.cu_q.strides[0] = edge_stride(rng);
            format!("cu_seqlens_k.dtype = {:?}, cu_seqlens_q.strides = {:?}", v.cu_k.dtype, v.cu_q.strides)
        }
        _ => {
            let Some((host_q, host_k)) = v.host.as_mut() else {
                return "no host copies to edit".into();
            };
            let host = if rng.one_in(2) { host_q } else { host_k };
            match rng.below(5) {
                0 => {
                    if rng.one_in(2) {
                        host.pop();
                    } else {
                        host.push(*host.last().unwrap_or(&0));
                    }
                    format!("host copy length {}", host.len())
                }
                1 if host.len() > 1 => {
                    // Decreasing at one point.
                    let i = rng.range(1, host.len() as u64 - 1) as usize;
                    host[i] = host[i - 1].saturating_sub(rng.range(1, 1000) as i32);
                    format!("host[{i}] decreases: {}", short_list(host))
                }
                2 if !host.is_empty() => {
                    // Past the end of the packed tensor.
                    let last = host.len() - 1;
                    host[last] = host[last].saturating_add(rng.pick(&[1, 1000, i32::MAX]));
                    format!("host ends past the tokens: {}", short_list(host))
                }
                _ if !host.is_empty() => {
                    let i = rng.index(host.len());
                    host[i] = rng.pick(OFFSET_EDGES);
                    format!("host[{i}] = {}", host[i])
                }
                _ => "empty host copy".into(),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Running a case and its properties
// ---------------------------------------------------------------------------------------------

/// Kinds a call may return on a runtime without a device: the argument errors, the backend's
/// refusal, and the driver's absence. `Internal` is a bug; `Driver`, `UnsupportedGpu`,
/// `KernelNotFound` and `BadArchive` need a device (or a broken build) to be reached.
fn documented_without_device(kind: ErrorKind) -> bool {
    use ErrorKind::*;
    matches!(
        kind,
        InvalidArgument
            | DTypeMismatch
            | ShapeMismatch
            | BadStrides
            | UnsupportedHeadDim
            | NullPointer
            | MisalignedPointer
            | EmptyInput
            | UnsupportedDType
            | TooLarge
            | UnsupportedByBackend
            | NoDriver
            | NoDevice
    )
}

fn at_the_driver(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::NoDriver | ErrorKind::NoDevice)
}

/// Checks one call's result against the properties; `valid` says the case was built valid.
/// How often each outcome occurred (an error kind, or `Ok`), for the summary: it shows how many
/// cases got through validation to the driver.
static OUTCOMES: std::sync::Mutex<std::collections::BTreeMap<String, u64>> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn count_outcome<T>(result: &aotriton::Result<T>) {
    let key = match result {
        Ok(_) => "Ok".to_string(),
        Err(e) => format!("{:?}", e.kind()),
    };
    *OUTCOMES.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default() += 1;
}

fn check_result<T: Debug + PartialEq + Default>(what: &str, result: &aotriton::Result<T>, valid: bool, gluon: bool) -> Result<(), String> {
    count_outcome(result);
    match result {
        Ok(value) if *value == T::default() && what == "attn_bwd_workspace_bytes" => Ok(()),
        Ok(value) => Err(format!("{what} returned Ok({value:?}) on a runtime without a device")),
        Err(e) if !documented_without_device(e.kind()) => Err(format!("{what}: undocumented error kind here: {e}")),
        Err(e) if valid && !(at_the_driver(e.kind()) || gluon && e.kind() == ErrorKind::UnsupportedByBackend) => {
            Err(format!("{what} refused a valid call: {e}"))
        }
        Err(_) => Ok(()),
    }
}

fn run_case(c: &Case) -> Result<(), String> {
    let Some(stream) = stream_of(c.stream) else { return Ok(()) };
    let valid = c.mutations.is_empty();
    let gluon = c.backend == Backend::Gluon;
    match c.op {
        Op::Fwd => check_result("attn_fwd", &flash::attn_fwd(&c.fwd_params(), stream), valid, gluon),
        Op::Bwd => check_result("attn_bwd", &flash::attn_bwd(&c.bwd_params(), stream), valid, gluon),
        Op::WorkspaceBytes => {
            let bytes = flash::attn_bwd_workspace_bytes(&c.bwd_params(), stream);
            check_result("attn_bwd_workspace_bytes", &bytes, valid, gluon)?;
            let bwd = flash::attn_bwd(&c.bwd_params(), stream);
            check_result("attn_bwd", &bwd, valid, gluon)?;
            // Both run the same validation first, so an argument error must be the same.
            if let Err(e) = &bytes
                && !at_the_driver(e.kind())
                && e.kind() != ErrorKind::UnsupportedByBackend
                && bwd.as_ref().err().map(|b| b.kind()) != Some(e.kind())
            {
                return Err(format!("attn_bwd_workspace_bytes says {e} but attn_bwd says {bwd:?}"));
            }
            Ok(())
        }
        Op::DebugDropout => {
            let dropout = c.dropout.unwrap_or(Dropout::new(0.5, region(14), region(15)));
            check_result("debug_dropout_mask", &flash::debug_dropout_mask(&c.debug_out, &dropout, stream), valid, false)
        }
    }
}

/// `dropout_offsets_consumed` must give the exact count or refuse it: its result, whatever its
/// type (a plain `u64`, an `Option` or a `Result`), is read through its Debug text.
fn check_offsets_consumed(args: [u64; 4]) -> Result<(), String> {
    let [b, h, sq, sk] = args;
    let text = no_panic(|| debug_text(flash::dropout_offsets_consumed(b, h, sq, sk)))
        .map_err(|panic| format!("dropout_offsets_consumed{args:?} panicked: {panic}"))?;
    let factors = [b as u128, h as u128, sq.div_ceil(16) as u128 * 8, sk.div_ceil(16) as u128 * 4];
    let exact = if factors.contains(&0) {
        Some(0)
    } else {
        factors.iter().try_fold(1u128, |acc, &f| acc.checked_mul(f)).filter(|&n| n <= u64::MAX as u128)
    };
    let number = text.trim_start_matches("Some(").trim_start_matches("Ok(").trim_end_matches(')').parse::<u64>().ok();
    match (exact, number) {
        (Some(exact), Some(n)) if n as u128 == exact => Ok(()),
        // Saturation is a refusal a caller can see.
        (None, Some(u64::MAX)) => Ok(()),
        (None, None) if text == "None" || text.contains("TooLarge") => Ok(()),
        _ => Err(format!("dropout_offsets_consumed{args:?} = {text}, exact {exact:?} (a u64 product that wraps or is refused wrongly)")),
    }
}

fn debug_text<T: Debug>(value: T) -> String {
    format!("{value:?}")
}

fn offsets_args(rng: &mut Rng) -> [u64; 4] {
    [0; 4].map(|_| match rng.below(3) {
        0 => rng.pick(&[0, 1, 4, 65535, 65536, 1 << 30, 1 << 31, 1 << 32, 1 << 62, u64::MAX]),
        1 => rng.range(1, 1 << 20),
        _ => rng.next_u64() >> rng.below(64),
    })
}

#[test]
fn fuzz_validation() {
    let config = FuzzConfig::from_env();
    if usable_streams().is_empty() {
        println!("fuzz_validation: every runtime here has a device: only dropout_offsets_consumed is fuzzed");
    }
    let report = fuzz_loop("fuzz_validation", &config, |_, rng| {
        if rng.one_in(16) {
            let args = offsets_args(rng);
            note_case(|| format!("dropout_offsets_consumed{args:?}"));
            return check_offsets_consumed(args);
        }
        let mut case = valid_case(rng);
        let mutations = if rng.one_in(5) { 0 } else { rng.range(1, 4) };
        for _ in 0..mutations {
            mutate(&mut case, rng);
        }
        note_case(|| format!("{case:?}"));
        run_case(&case).map_err(|problem| format!("{problem}\n    the case: {case:?}"))
    });
    println!("fuzz_validation: outcomes {:?}", OUTCOMES.lock().unwrap_or_else(|e| e.into_inner()));
    assert_clean("fuzz_validation", &config, &report);
}

// ---------------------------------------------------------------------------------------------
// Regression cases: inputs that broke the properties (reliability review, issue 14)
// ---------------------------------------------------------------------------------------------

/// A call on every usable stream; `None` when there is none (a device everywhere).
fn on_usable_streams(mut call: impl FnMut(Stream) -> Result<(), String>) -> Result<(), String> {
    if usable_streams().is_empty() {
        println!("skipped: every runtime here has a device");
    }
    for &stream in usable_streams() {
        no_panic(|| call(stream)).map_err(|panic| format!("{:?} stream: PANIC {panic}", stream.runtime()))??;
    }
    Ok(())
}

fn expect_kind<T: Debug>(what: &str, result: aotriton::Result<T>, allowed: &[ErrorKind]) -> Result<(), String> {
    match result {
        Err(e) if allowed.contains(&e.kind()) => Ok(()),
        other => Err(format!("{what}: expected one of {allowed:?}, got {other:?}")),
    }
}

/// F5: the Gluon workspace size B·Hq·SQ_PAD·(HD+2)·4 overflowed u64 (a panic with overflow
/// checks) for B = Hq = 65535, Sq = 2^24 with 16-byte strides, all accepted by validation.
#[test]
fn regression_f5_gluon_workspace_product() {
    let (b, h, sq, sk, d) = (65535, 65535, 1 << 24, 128, 64);
    let t = |i, s| TensorView::new(region(i), [b, h, s, d], [8, 8, 8, 1], DType::F16);
    let rows = |i| TensorView::contiguous(region(i), [b, h, sq], DType::F32);
    on_usable_streams(|stream| {
        for backend in [Backend::Auto, Backend::Gluon] {
            let mut p = BwdParams::new(t(0, sq), t(1, sk), t(2, sk), t(3, sq), t(4, sq), rows(8), rows(9), t(5, sq), t(6, sk), t(7, sk));
            p.backend = backend;
            // The outputs overlap (the only way to keep every stride TMA-addressable at these
            // sizes), which validation may refuse first: any argument error will do, a panic not.
            match flash::attn_bwd_workspace_bytes(&p, stream) {
                Ok(0) if backend == Backend::Auto => {}
                Err(e) if documented_without_device(e.kind()) => {}
                other => return Err(format!("attn_bwd_workspace_bytes ({backend:?}): {other:?}")),
            }
            p.workspace = Some(Workspace { ptr: region(18), bytes: u64::MAX });
            match flash::attn_bwd(&p, stream) {
                Err(e) if documented_without_device(e.kind()) => {}
                other => return Err(format!("attn_bwd ({backend:?}): {other:?}")),
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// F6: `dropout_offsets_consumed` was an unchecked u64 product (a panic with overflow checks, 0
/// after wrapping in release, so torch's generator stopped advancing).
#[test]
fn regression_f6_dropout_offsets_consumed() {
    let mut failures = Vec::new();
    for args in [[65535, 65535, 1 << 30, 1 << 30], [1 << 62, 8, 1, 4], [u64::MAX, u64::MAX, u64::MAX, u64::MAX], [2, 3, 5, 9]] {
        if let Err(e) = check_offsets_consumed(args) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// F3: max lengths of 2^30 each (accepted) made the kernels' int32 window bounds wrap: every row
/// saw no key (O = 0, LSE = +inf) with no error. They must be refused as too large.
#[test]
fn regression_f3_lengths_that_wrap_the_window() {
    let d = 64;
    let t = |i, h, s| TensorView::contiguous(region(i), [1, h, s, d], DType::F16);
    let cu = |i| TensorView::contiguous(region(i), [3], DType::I32);
    let host = [0, 512, 1024];
    on_usable_streams(|stream| {
        for (max_q, max_k) in [(1u64 << 30, 1u64 << 30), ((1 << 30) - 1, 1 << 30)] {
            for with_host in [false, true] {
                for mask in [Mask::NONE, Mask::causal(MaskAlign::TopLeft)] {
                    let varlen = Varlen {
                        cu_seqlens_q: cu(12),
                        cu_seqlens_k: cu(13),
                        max_seqlen_q: max_q,
                        max_seqlen_k: max_k,
                        host_cu_seqlens: with_host.then_some((&host[..], &host[..])),
                        status: 0,
                    };
                    let lse = TensorView::contiguous(region(8), [1, 2, 1024], DType::F32);
                    let mut p = FwdParams::new(t(0, 2, 1024), t(1, 2, 1024), t(2, 2, 1024), t(3, 2, 1024), Some(lse));
                    p.varlen = Some(varlen);
                    p.mask = mask;
                    let what = format!("attn_fwd max lengths ({max_q}, {max_k}), host copies {with_host}, {mask:?}");
                    expect_kind(&what, flash::attn_fwd(&p, stream), &[ErrorKind::TooLarge])?;
                }
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// F7: the dBias launch grid was not validated, so `attn_bwd` could fail at the fourth launch
/// after three kernels were enqueued. Grids over the launch limits must be refused before the
/// driver: z = B·Hq = 65536 with a full bias, and y = ⌈Sk / BLOCK_N⌉ > 65535 with Sk = 2^23.
#[test]
fn regression_f7_dbias_grid_over_the_limits() {
    on_usable_streams(|stream| {
        for (b, h, sq, sk, bias_sizes) in
            [(256u64, 256u64, 16u64, 16u64, None), (1, 1, 16, 1 << 23, Some([1, 1, 1, 1 << 23]))]
        {
            let d = 64;
            let t = |i, s| TensorView::contiguous(region(i), [b, h, s, d], DType::F16);
            let rows = |i| TensorView::contiguous(region(i), [b, h, sq], DType::F32);
            let bias_sizes = bias_sizes.unwrap_or([b, h, sq, sk]);
            let mut p = BwdParams::new(t(0, sq), t(1, sk), t(2, sk), t(3, sq), t(4, sq), rows(8), rows(9), t(5, sq), t(6, sk), t(7, sk));
            p.bias = Some(TensorView::contiguous(region(10), bias_sizes, DType::F16));
            p.dbias = Some(TensorView::contiguous(region(11), bias_sizes, DType::F16));
            let what = format!("attn_bwd B = {b}, Hq = {h}, Sk = {sk}, dbias {bias_sizes:?}");
            expect_kind(&what, flash::attn_bwd(&p, stream), &[ErrorKind::TooLarge])?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// F9: validation passed inputs whose results are undefined: an output aliasing an input, an
/// output with zero strides (racy writes), a tensor whose extent wraps the address space, and
/// `sm_scale = f32::MAX` (inf·log2e gives NaN). Each must be refused before the driver.
#[test]
fn regression_f9_undefined_inputs_are_refused() {
    let (b, h, s, d) = (2, 4, 128, 64);
    let t = |i| TensorView::contiguous(region(i), [b, h, s, d], DType::F16);
    let valid = || FwdParams::new(t(0), t(1), t(2), t(3), None);
    let mut cases: Vec<(&str, FwdParams<'static>)> = Vec::new();
    let mut p = valid();
    p.o = t(0);
    cases.push(("o = q", p));
    let mut p = valid();
    p.o.strides = [0, 0, 0, 1];
    cases.push(("o with zero strides", p));
    let mut p = valid();
    p.q.ptr = u64::MAX - 1;
    cases.push(("q at u64::MAX - 1", p));
    let mut p = valid();
    p.k.strides[0] = i64::MAX;
    cases.push(("k.strides[0] = i64::MAX", p));
    let mut p = valid();
    p.sm_scale = f32::MAX;
    cases.push(("sm_scale = f32::MAX", p));
    on_usable_streams(|stream| {
        let mut failures = Vec::new();
        for (what, p) in &cases {
            match flash::attn_fwd(p, stream) {
                Err(e) if documented_without_device(e.kind()) && !at_the_driver(e.kind()) => {}
                other => failures.push(format!("{what}: expected an argument error, got {other:?}")),
            }
        }
        if failures.is_empty() { Ok(()) } else { Err(failures.join("\n")) }
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Found by this fuzzer (seed 0x18ed70ed0cd09b92, case 1039 and 171): the extent of a view with
/// huge sizes and strides overflowed i128 in the address-range check (tensor.rs `byte_range`,
/// "attempt to multiply with overflow" / "attempt to add with overflow"). A bias is checked for
/// its extent before its shape, so these reach it.
#[test]
fn regression_fuzz_extent_of_huge_views() {
    let (b, h, s, d) = (2, 4, 128, 64);
    let t = |i| TensorView::contiguous(region(i), [b, h, s, d], DType::F16);
    let biases = [
        TensorView::new(region(10), [u64::MAX, 1, 1, 8], [i64::MAX, 8, 8, 1], DType::F16),
        TensorView::new(region(10), [u64::MAX, 1, 1 << 62, 3], [i64::MAX, i64::MAX, 3, 1], DType::F32),
        TensorView::new(region(10), [u64::MAX; 4], [i64::MAX, i64::MAX, i64::MAX, 1], DType::F16),
        // Found by the CI fuzz run (seed 0x18ed79574ab88901, case 2027540): the offset of the
        // last element is exactly i128::MAX, so "+ 1 element" overflowed (a panic in checked
        // builds, a wrap in release).
        TensorView::new(region(10), [u64::MAX, u64::MAX, 2, 1], [i64::MAX, 2, 1, 1], DType::F16),
    ];
    on_usable_streams(|stream| {
        for bias in biases {
            let mut p = FwdParams::new(t(0), t(1), t(2), t(3), None);
            p.bias = Some(bias);
            match flash::attn_fwd(&p, stream) {
                Err(e) if documented_without_device(e.kind()) && !at_the_driver(e.kind()) => {}
                other => return Err(format!("attn_fwd with bias {bias:?}: expected an argument error, got {other:?}")),
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Found by this fuzzer (seed 0x18ed70ed0cd09b92, case 316): with a zero factor the count is 0,
/// but the checked product overflowed on the factors before it and reported `TooLarge`.
#[test]
fn regression_fuzz_dropout_offsets_consumed_with_a_zero_factor() {
    for args in [[65535, 807317, 145173402730603709, 0], [u64::MAX, u64::MAX, 0, 8], [0, u64::MAX, u64::MAX, u64::MAX]] {
        check_offsets_consumed(args).unwrap_or_else(|e| panic!("{e}"));
    }
}
