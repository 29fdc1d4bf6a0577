//! The KV-cache decode attention, `flash::attn_fwd_kvcache`, on the GPU against float64.
//!
//! Each case builds a cache (dense `[B, S_cache, Hk, D]` or a pool of pages `[N_PAGES, PAGE_SIZE,
//! Hk, D]` with a shuffled page table), fills every element of it with random values (never 0:
//! rows past a sequence's length must be ignored, not be harmless), surrounds it with a guard of
//! NaN, and runs one step: the optional append of `k_new`/`v_new`, then attention of Sq query
//! tokens, bottom-right aligned, with the case's window. Checked:
//!
//! - O and LSE against a float64 reference over the cache as the append leaves it, with the bound
//!   of the rest of this suite: `max|O − ref| ≤ 3 · max|naive − ref| + 1e-3`, the naive computation
//!   rounding P (unnormalised) and O to the input dtype; LSE by `check_lse`. Rows that see no key:
//!   O exactly 0 and LSE +inf. Outputs start as NaN; their guards must stay so.
//! - The caches afterwards, bit for bit, whole buffers: the appended rows where the page table
//!   puts them (a page boundary crossed), every other row and the guards unchanged.
//! - The status word: exactly the bits the case's out-of-range lengths and page ids imply
//!   (lengths clamped into `[0, capacity − N_NEW]`, keys on a bad page left out, their appended
//!   rows not written), 0 otherwise; entries of the page table past a sequence's keys hold bad
//!   ids, so reading them would show there.
//! - The split count: forced ones as asked (capped at the cache's chunks), the auto rule's value
//!   recomputed here from the device's SM count; the workspace it needs, NaN-filled.
//!
//! One more case gives a workspace a byte short: refused (`InvalidArgument`), nothing written.
use super::*;

#[derive(Debug, Clone)]
pub(crate) struct DecodeCase {
    dtype: Lowp,
    b: usize,
    sq: usize,
    hq: usize,
    hk: usize,
    d: usize,
    /// 0: a dense cache of `cache` rows; else the page size, with `cache` = MAX_PAGES · page.
    page: usize,
    cache: usize,
    /// Each sequence's cache_seqlens (may be out of range).
    seqlens: Vec<i32>,
    n_new: usize,
    /// (left, right), −1 unbounded; causal is (−1, 0).
    window: (i64, i64),
    /// 0: the rule's choice.
    splits: u32,
    lse: bool,
    /// Paged: sequence 1 shares sequence 0's first pages (those wholly below both lengths).
    shared: bool,
    /// Paged: page-table entries (sequence, slot) given an id outside [0, N_PAGES).
    bad_pages: Vec<(usize, usize)>,
}

pub(crate) fn cases() -> Vec<DecodeCase> {
    let c = |dtype, b, sq, hq, hk, d, page, cache, seqlens: &[i32], n_new, window, splits| DecodeCase {
        dtype,
        b,
        sq,
        hq,
        hk,
        d,
        page,
        cache,
        seqlens: seqlens.to_vec(),
        n_new,
        window,
        splits,
        lse: true,
        shared: false,
        bad_pages: Vec::new(),
    };
    use Lowp::{BF16, F16};
    const NONE: (i64, i64) = (-1, -1);
    const CAUSAL: (i64, i64) = (-1, 0);
    let mut v = vec![
        // Dense: lengths 0 and 1, a long one; MQA-free G 1, Sq 1, auto splits.
        c(F16, 3, 1, 4, 4, 64, 0, 300, &[0, 1, 257], 0, NONE, 0),
        // Dense, G 2, Sq 4, appending one token, causal, one split.
        c(BF16, 2, 4, 4, 2, 128, 0, 200, &[5, 190], 1, CAUSAL, 1),
        // Page 16, G 4, Sq 8: appends of 3 crossing a page boundary (14 → 14, 15 | 16), 3 splits.
        c(F16, 4, 8, 8, 2, 64, 16, 96, &[0, 1, 14, 40], 3, CAUSAL, 3),
        // Page 32, G 8, Sq 1, D 40 (bucket 64), a sliding window, auto splits.
        c(BF16, 3, 1, 8, 1, 40, 32, 320, &[33, 300, 31], 0, (20, 0), 0),
        // Page 64, G 1, Sq 16, D 128, a window on both sides, 7 splits.
        c(F16, 2, 16, 2, 2, 128, 64, 640, &[100, 513], 0, (50, 2), 7),
        // Page 128, G 2, Sq 4, D 256, appends of 5 crossing a boundary (126 → 126..130), 2 splits.
        c(BF16, 2, 4, 4, 2, 256, 128, 512, &[126, 3], 5, CAUSAL, 2),
        // Page 256, G 4, Sq 1, ragged lengths, one appended token, auto splits.
        c(F16, 3, 1, 8, 2, 64, 256, 1280, &[300, 1000, 0], 1, NONE, 0),
        // Dense, G 8, Sq 16: 128 rows per KV head (BLOCK_M 64, two tiles), 128 splits asked, no LSE.
        c(BF16, 1, 16, 8, 1, 32, 0, 700, &[650], 0, CAUSAL, 128),
        // Dense, G 1, Sq 16 (16 rows: BLOCK_M 16), 4 splits, rows 0..12 of the short sequence see no key.
        c(F16, 2, 16, 2, 2, 16, 0, 64, &[3, 60], 0, CAUSAL, 4),
    ];
    v[7].lse = false;
    // Shared prefix: sequences 0 and 1 share their first two pages; appends land on their own.
    let mut shared = c(BF16, 2, 4, 8, 4, 64, 32, 160, &[70, 90], 2, CAUSAL, 0);
    shared.shared = true;
    v.push(shared);
    // Out of range: lengths −3 and capacity + 5 (clamped), page ids N_PAGES and −1 inside a
    // sequence's keys (its keys left out, its appended rows skipped): status 1 | 2.
    let mut bad = c(F16, 3, 4, 4, 2, 64, 16, 64, &[-3, 69, 20], 2, NONE, 2);
    bad.bad_pages = vec![(2, 0), (1, 3)];
    v.push(bad);
    // Page 16 under D 256's 32-key blocks (two pages a block), G 2, Sq 2, one appended token.
    v.push(c(BF16, 3, 2, 4, 2, 256, 16, 160, &[17, 150, 1], 1, CAUSAL, 0));
    // Page 32 under 64-key blocks, G 4 x Sq 16 = 64 rows (BLOCK_M 64), a full cache and a ragged one.
    v.push(c(F16, 2, 16, 4, 1, 128, 32, 384, &[200, 384], 0, CAUSAL, 0));
    // Dense out of range: 400 > S_cache − N_NEW and −1, clamped, status 1.
    v.push(c(BF16, 2, 1, 4, 4, 64, 0, 100, &[400, -1], 4, CAUSAL, 0));
    v
}

impl DecodeCase {
    pub(crate) fn describe(&self) -> String {
        let cache = if self.page == 0 { format!("dense {}", self.cache) } else { format!("page {} × {}", self.page, self.cache / self.page) };
        let splits = if self.splits == 0 { "auto".to_string() } else { self.splits.to_string() };
        format!(
            "decode {} D={} B={} Sq={} Hq={} Hk={} {cache} lens {:?} new {} win {:?} splits {splits}{}{}{}",
            self.dtype.name(),
            self.d,
            self.b,
            self.sq,
            self.hq,
            self.hk,
            self.seqlens,
            self.n_new,
            self.window,
            if self.lse { "" } else { " no-LSE" },
            if self.shared { " shared-pages" } else { "" },
            if self.bad_pages.is_empty() { "" } else { " bad-pages" },
        )
    }

    /// The lengths the kernels use: clamped into [0, capacity − N_NEW].
    fn starts(&self) -> Vec<usize> {
        self.seqlens.iter().map(|&s| (s.max(0) as usize).min(self.cache - self.n_new)).collect()
    }

    fn status_expected(&self) -> i32 {
        let clamped = self.starts().iter().zip(&self.seqlens).any(|(&s, &raw)| s as i64 != raw as i64);
        (if clamped { flash::KV_SEQLEN_OUT_OF_RANGE } else { 0 }) | (if self.bad_pages.is_empty() { 0 } else { flash::KV_PAGE_OUT_OF_RANGE })
    }
}

/// Elements of NaN before a cache view (the `GUARD` after it comes from `Placement`).
const FRONT: usize = 64;

/// The page table (`[B, MAX_PAGES]`, bad ids where a sequence has no page) and the pool's page count.
fn page_table(c: &DecodeCase, rng: &mut SplitMix64) -> (Vec<i32>, usize) {
    let max_pages = c.cache / c.page;
    let lengths: Vec<usize> = c.starts().iter().map(|s| s + c.n_new).collect();
    let needed: Vec<usize> = lengths.iter().map(|l| l.div_ceil(c.page)).collect();
    let shared = if c.shared { lengths[0].min(lengths[1]).min(c.starts()[0]).min(c.starts()[1]) / c.page } else { 0 };
    let n_pages = needed.iter().sum::<usize>() - shared + 2; // two spare pages nobody references
    let mut pool: Vec<i32> = (0..n_pages as i32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    let mut next = pool.into_iter();
    let mut table = vec![-7i32; c.b * max_pages]; // past a sequence's keys: never read
    for z in 0..c.b {
        for slot in 0..needed[z] {
            table[z * max_pages + slot] = if z == 1 && slot < shared { table[slot] } else { next.next().unwrap() };
        }
    }
    for &(z, slot) in &c.bad_pages {
        table[z * max_pages + slot] = if slot % 2 == 0 { n_pages as i32 } else { -1 };
    }
    (table, n_pages)
}

pub(crate) fn run(c: &DecodeCase, rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let name = c.describe();
    let DecodeCase { dtype: t, b, sq, hq, hk, d, page, cache, n_new, .. } = *c;
    let dtype = dtype_of(t);
    let g = hq / hk;
    let paged = page > 0;
    let (table, n_pages) = if paged { page_table(c, rng) } else { (Vec::new(), 0) };
    let (outer, rows) = if paged { (n_pages, page) } else { (b, cache) };
    let mut draw = |n: usize| (0..n).map(|_| t.encode(rng.normal_in(t))).collect::<Vec<u16>>();
    let cache_sizes = [outer, rows, hk, d];
    let cache_place = Placement::new(cache_sizes, contiguous(cache_sizes).strides, FRONT);
    let k_cache = DevTensor::new(cache_place.clone(), Some(&draw(outer * rows * hk * d)), POISON16, stream)?;
    let v_cache = DevTensor::new(cache_place.clone(), Some(&draw(outer * rows * hk * d)), POISON16, stream)?;
    let q_bits = draw(b * sq * hq * d);
    let q = DevTensor::new(contiguous([b, sq, hq, d]), Some(&q_bits), POISON16, stream)?;
    let (kn_bits, vn_bits) = (draw(b * n_new * hk * d), draw(b * n_new * hk * d));
    let new_sizes = [b, n_new.max(1), hk, d];
    let k_new = DevTensor::new(contiguous(new_sizes), Some(&kn_bits), POISON16, stream)?;
    let v_new = DevTensor::new(contiguous(new_sizes), Some(&vn_bits), POISON16, stream)?;
    let o = DevTensor::<u16, 4>::new(Placement::new([b, sq, hq, d], contiguous([b, sq, hq, d]).strides, 64), None, POISON16, stream)?;
    let lse = DevTensor::<u32, 3>::new(Placement::new([b, hq, sq], contiguous([b, hq, sq]).strides, 16), None, POISON32, stream)?;
    let seqlens = DevTensor::new(contiguous([b]), Some(c.seqlens.as_slice()), -1i32, stream)?;
    let max_pages = if paged { cache / page } else { 1 };
    let table_t = DevTensor::new(contiguous([b, max_pages]), Some(if paged { table.as_slice() } else { &[0][..] }), -9i32, stream)?;
    let status = DevTensor::new(contiguous([1]), Some(&[0i32][..]), 0x5a5a_5a5ai32, stream)?;

    let mut p = flash::KvCacheParams::new(
        q.view(dtype),
        k_cache.view(dtype),
        v_cache.view(dtype),
        paged.then(|| table_t.view(DType::I32)),
        seqlens.view(DType::I32),
        o.view(dtype),
        c.lse.then(|| lse.view(DType::F32)),
    );
    if n_new > 0 {
        (p.k_new, p.v_new) = (Some(k_new.view(dtype)), Some(v_new.view(dtype)));
    }
    p.mask = match c.window {
        (-1, -1) => Mask::NONE,
        (l, r) => Mask::window(l as i32, r as i32, MaskAlign::BottomRight),
    };
    p.num_splits = c.splits;
    p.status = status.view(DType::I32).ptr;
    let api = Stream::cuda(stream as usize);
    let splits = flash::attn_fwd_kvcache_num_splits(&p, api).map_err(|e| format!("attn_fwd_kvcache_num_splits: {e}"))?;
    let ws_bytes = flash::attn_fwd_kvcache_workspace_bytes(&p, api).map_err(|e| format!("attn_fwd_kvcache_workspace_bytes: {e}"))? as usize;
    let ws = DevTensor::<u32, 1>::new(contiguous([ws_bytes.div_ceil(4).max(1)]), None, POISON32, stream)?;
    if ws_bytes > 0 {
        p.workspace = Some(flash::Workspace { ptr: ws.view(DType::F32).ptr, bytes: ws_bytes as u64 });
    }
    flash::attn_fwd_kvcache(&p, api).map_err(|e| format!("attn_fwd_kvcache: {e}"))?;
    let (o_bits, lse_bits) = (o.read(stream)?, lse.read(stream)?);
    let (k_after, v_after, status_after) = (k_cache.read(stream)?, v_cache.read(stream)?, status.read(stream)?);

    // The split count: forced ones as asked (at most the chunks of the cache, which are at least
    // cdiv(C, 128) for any compiled BLOCK_N ≤ 128); the rule's from the SM count.
    let sms = unsafe {
        result::device::get_attribute(result::device::get(0).map_err(|e| format!("{e:?}"))?, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }
    .map_err(|e| format!("{e:?}"))? as usize;
    let rows_per_head = g * sq;
    let block_m = if rows_per_head <= 16 { 16 } else { 64 };
    let programs = b * hk * rows_per_head.div_ceil(block_m);
    let splits_ok = if c.splits == 0 {
        splits as usize == (2 * sms).div_ceil(programs).clamp(1, 128.min(cache.div_ceil(256)))
    } else {
        splits <= c.splits && (splits == c.splits || splits as usize >= cache.div_ceil(128))
    };
    let ws_ok = (splits == 1) == (ws_bytes == 0);

    // The caches as the append leaves them (host model of the whole buffers).
    let starts = c.starts();
    let place_of = |z: usize, j: usize| -> Option<usize> {
        let (block, row) = if paged {
            let id = table[z * max_pages + j / page];
            if id < 0 || id as usize >= n_pages {
                return None;
            }
            (id as usize, j % page)
        } else {
            (z, j)
        };
        Some(FRONT + ((block * rows + row) * hk) * d)
    };
    let (mut k_model, mut v_model) = (k_cache.host.clone(), v_cache.host.clone());
    for (z, &start) in starts.iter().enumerate() {
        for tok in 0..n_new {
            if let Some(base) = place_of(z, start + tok) {
                for h in 0..hk {
                    for dd in 0..d {
                        let src = ((z * n_new + tok) * hk + h) * d + dd;
                        k_model[base + h * d + dd] = kn_bits[src];
                        v_model[base + h * d + dd] = vn_bits[src];
                    }
                }
            }
        }
    }
    let cache_bad = k_after.iter().zip(&k_model).filter(|(a, m)| a != m).count() + v_after.iter().zip(&v_model).filter(|(a, m)| a != m).count();

    // Reference and naive, row by row.
    let sm_scale = 1.0 / (d as f64).sqrt();
    let dec = |bits: u16| t.decode(bits) as f64;
    let (got_o, got_lse) = (o.logical(&o_bits), lse.logical(&lse_bits));
    let (mut o_got, mut o_ref, mut o_naive) = (Vec::new(), Vec::new(), Vec::new());
    let (mut l_got, mut l_ref, mut l_naive) = (Vec::new(), Vec::new(), Vec::new());
    let mut empty_ok = true;
    let mut empty_rows = 0;
    for (z, &start) in starts.iter().enumerate() {
        let length = start + n_new;
        for h in 0..hq {
            let kh = h / g;
            for tok in 0..sq {
                let pos = length as i64 - sq as i64 + tok as i64;
                let keys: Vec<usize> = (0..length)
                    .filter(|&j| {
                        let j = j as i64;
                        (c.window.0 < 0 || j >= pos - c.window.0) && (c.window.1 < 0 || j <= pos + c.window.1)
                    })
                    .filter_map(|j| place_of(z, j))
                    .collect();
                let o_row = ((z * sq + tok) * hq + h) * d;
                let l_row = (z * hq + h) * sq + tok;
                if keys.is_empty() {
                    empty_rows += 1;
                    empty_ok &= (0..d).all(|dd| got_o[o_row + dd] == 0) && (!c.lse || f32::from_bits(got_lse[l_row]) == f32::INFINITY);
                    continue;
                }
                let qv: Vec<f64> = (0..d).map(|dd| dec(q_bits[o_row + dd])).collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&base| (0..d).map(|dd| qv[dd] * dec(k_model[base + kh * d + dd])).sum::<f64>() * sm_scale)
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let pr: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f64 = pr.iter().sum();
                let p_low: Vec<f64> = pr.iter().map(|&x| t.round(x as f32) as f64).collect();
                for dd in 0..d {
                    let vj = |i: usize| dec(v_model[keys[i] + kh * d + dd]);
                    let exact = (0..keys.len()).map(|i| pr[i] * vj(i)).sum::<f64>() / l;
                    let naive = (0..keys.len()).map(|i| p_low[i] * vj(i)).sum::<f64>() / l;
                    o_ref.push(exact);
                    o_naive.push(t.round(naive as f32) as f64);
                    o_got.push(t.decode(got_o[o_row + dd]) as f64);
                }
                if c.lse {
                    l_ref.push(m + l.ln());
                    let m32 = s.iter().map(|&x| x as f32).fold(f32::MIN, f32::max);
                    let l32: f32 = s.iter().map(|&x| (x as f32 - m32).exp()).sum();
                    l_naive.push((m32 + l32.ln()) as f64);
                    l_got.push(f32::from_bits(got_lse[l_row]) as f64);
                }
            }
        }
    }
    let o_check = Bounded::new("O", &o_got, &o_ref, &o_naive, 3.0, false);
    let (lse_pass, lse_text) = if c.lse { check_lse(&l_got, &l_ref, &l_naive) } else { (true, "LSE off".to_string()) };
    let lse_untouched = c.lse || lse_bits == lse.host;
    let (stray_o, stray_lse) = (o.stray(&o_bits), lse.stray(&lse_bits));
    let status_got = status_after[0];
    let status_ok = status_got == c.status_expected() && status.stray(&status_after) == 0;
    let pass = o_check.pass() && lse_pass && lse_untouched && empty_ok && cache_bad == 0 && stray_o + stray_lse == 0 && status_ok && splits_ok && ws_ok;
    Ok(Outcome {
        pass,
        line: format!(
            "{name}  {}  {lse_text}  empty rows {empty_rows} {}  cache mismatches {cache_bad}  status {status_got} (want {})  \
             splits {splits}{} ws {ws_bytes} B  stray {stray_o}+{stray_lse}{}  {}",
            o_check.show(),
            if empty_ok { "ok" } else { "WRONG" },
            c.status_expected(),
            if splits_ok { "" } else { " (rule: WRONG)" },
            if lse_untouched { "" } else { "  LSE written though off!" },
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

/// A workspace a byte short of what the split count needs: refused before anything is launched.
pub(crate) fn short_workspace_case(rng: &mut SplitMix64, stream: sys::CUstream) -> Result<Outcome, String> {
    let (b, sq, hq, hk, d, s) = (2, 1, 4, 2, 64, 512);
    let draw = |rng: &mut SplitMix64, n: usize| (0..n).map(|_| Lowp::F16.encode(rng.normal_in(Lowp::F16))).collect::<Vec<u16>>();
    let q = DevTensor::new(contiguous([b, sq, hq, d]), Some(&draw(rng, b * sq * hq * d)), POISON16, stream)?;
    let k = DevTensor::new(contiguous([b, s, hk, d]), Some(&draw(rng, b * s * hk * d)), POISON16, stream)?;
    let v = DevTensor::new(contiguous([b, s, hk, d]), Some(&draw(rng, b * s * hk * d)), POISON16, stream)?;
    let o = DevTensor::<u16, 4>::new(contiguous([b, sq, hq, d]), None, POISON16, stream)?;
    let seqlens = DevTensor::new(contiguous([b]), Some(&[500i32, 7][..]), -1i32, stream)?;
    let mut p = flash::KvCacheParams::new(q.view(DType::F16), k.view(DType::F16), v.view(DType::F16), None, seqlens.view(DType::I32), o.view(DType::F16), None);
    p.num_splits = 4;
    let api = Stream::cuda(stream as usize);
    let bytes = flash::attn_fwd_kvcache_workspace_bytes(&p, api).map_err(|e| e.to_string())?;
    let ws = DevTensor::<u32, 1>::new(contiguous([(bytes as usize).div_ceil(4).max(1)]), None, POISON32, stream)?;
    let mut outcomes = Vec::new();
    for given in [None, Some(bytes.saturating_sub(1))] {
        p.workspace = given.map(|n| flash::Workspace { ptr: ws.view(DType::F32).ptr, bytes: n });
        let kind = flash::attn_fwd_kvcache(&p, api).err().map(|e| e.kind());
        outcomes.push(kind);
    }
    let untouched = o.read(stream)? == o.host && ws.read(stream)? == ws.host;
    let refused = bytes > 0 && outcomes.iter().all(|k| *k == Some(ErrorKind::InvalidArgument));
    let pass = refused && untouched;
    Ok(Outcome {
        pass,
        line: format!(
            "decode workspace: 4 splits need {bytes} B; none / a byte short → {outcomes:?}; outputs untouched {untouched}  {}",
            if pass { "PASS" } else { "FAIL" }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_cover_the_axes() {
        let all = cases();
        for page in [0, 16, 32, 64, 128, 256] {
            assert!(all.iter().any(|c| c.page == page), "page {page}");
        }
        for g in [1, 2, 4, 8] {
            assert!(all.iter().any(|c| c.hq / c.hk == g), "G {g}");
        }
        for sq in [1, 4, 8, 16] {
            assert!(all.iter().any(|c| c.sq == sq), "Sq {sq}");
        }
        for splits in [0, 1, 2] {
            assert!(all.iter().any(|c| c.splits == splits || (splits == 2 && c.splits > 2)), "splits {splits}");
        }
        assert!(all.iter().any(|c| c.seqlens.contains(&0)) && all.iter().any(|c| c.seqlens.contains(&1)));
        assert!(all.iter().any(|c| c.shared) && all.iter().any(|c| !c.bad_pages.is_empty()) && all.iter().any(|c| !c.lse));
        assert!(all.iter().any(|c| c.page == 0 && c.status_expected() == flash::KV_SEQLEN_OUT_OF_RANGE));
        assert!(all.iter().any(|c| c.window.0 >= 0) && all.iter().any(|c| c.window == (-1, 0)));
        // Appends crossing a page boundary.
        assert!(all.iter().any(|c| c.page > 0 && c.starts().iter().any(|&s| s / c.page != (s + c.n_new - 1) / c.page && c.n_new > 0)));
        for c in &all {
            assert_eq!(c.seqlens.len(), c.b, "{}", c.describe());
            assert_eq!(c.hq % c.hk, 0);
            assert!(c.page == 0 || c.cache % c.page == 0);
        }
    }

    #[test]
    fn page_tables_give_each_sequence_its_own_pages() {
        let mut rng = SplitMix64::new(7);
        for c in cases().iter().filter(|c| c.page > 0) {
            let (table, n_pages) = page_table(c, &mut rng);
            let max_pages = c.cache / c.page;
            let mut owner = vec![None; n_pages];
            for z in 0..c.b {
                let needed = (c.starts()[z] + c.n_new).div_ceil(c.page);
                for slot in 0..max_pages {
                    let id = table[z * max_pages + slot];
                    let bad = c.bad_pages.contains(&(z, slot));
                    if slot >= needed || bad {
                        assert!(id < 0 || id as usize >= n_pages, "{}: ({z}, {slot}) = {id}", c.describe());
                        continue;
                    }
                    let shared = c.shared && z == 1 && table[slot] == id;
                    match owner[id as usize] {
                        None => owner[id as usize] = Some(z),
                        Some(o) => assert!(shared && o == 0, "{}: page {id} of {o} and {z}", c.describe()),
                    }
                }
            }
            assert!(owner.iter().filter(|o| o.is_none()).count() >= 2, "{}: spare pages", c.describe());
        }
    }
}
