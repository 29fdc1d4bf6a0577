//! Mutation fuzzing of the archive reader: the archive the build made (`AOTRITON_ARCHIVE_DIR`,
//! which test.sh exports; without it the fuzz loop is skipped) and a small archive repacked from
//! it, mutated by bit flips, truncations, appended bytes, header edits, byte edits of the index
//! (as stored: xz-compressed from format version 5 on) and byte and structural edits of its JSON
//! with the CRC fixed up, corrupted xz streams with their CRC fixed up, and
//! consistent size inflations; each parsed with `Archive::parse` (and now and then written to a
//! file and read with `Archive::open`), then exercised with `find` and `load_images`.
//!
//! Properties: no panic; no hang (a per-case limit, see `fuzz_common`); every error names the
//! archive; `find` finds every functional the parser accepted; loaded images match the index's
//! sizes; `open` of the bytes accepts what `parse` accepts; and no single allocation request above
//! 2 GiB whatever sizes the file declares (a counting global allocator refuses and records it).
//!
//! Budget and seed: see `fuzz_common` (`AOTRITON_FUZZ_SECONDS`, `AOTRITON_FUZZ_SEED`,
//! `AOTRITON_FUZZ_CASE`). The `regression_*` tests need no archive: they build their own.
mod fuzz_common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use aotriton::archive::{Archive, ArchiveWriter, KernelArg, KernelMeta, TensorDescMeta, index_json, stream_key};
use fuzz_common::{FuzzConfig, Rng, assert_clean, fuzz_loop, no_panic, note_case};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// An allocator that refuses huge requests and remembers the largest one
// ---------------------------------------------------------------------------------------------

/// The largest single allocation the reader may ask for, whatever the file declares.
const ALLOCATION_CAP: usize = 2 << 30;

thread_local! {
    /// The largest request of this thread since the last `take_largest_request`.
    static LARGEST_REQUEST: Cell<usize> = const { Cell::new(0) };
}

struct CappedAllocator;

/// Records a request; false when it is above the cap (then it is refused, as a system without
/// that much memory would, so the shared machine stays up).
fn admit(size: usize) -> bool {
    let _ = LARGEST_REQUEST.try_with(|largest| largest.set(largest.get().max(size)));
    if size <= ALLOCATION_CAP {
        return true;
    }
    // An infallible allocation aborts after this; say which case it was, without allocating.
    use std::io::Write;
    let mut buffer = [0u8; 200];
    let mut rest: &mut [u8] = &mut buffer;
    let _ = match fuzz_common::running_case() {
        Some((seed, case)) => writeln!(rest, "fuzz_archive: refused a {size}-byte allocation in case {case} of seed {seed:#x}"),
        None => writeln!(rest, "fuzz_archive: refused a {size}-byte allocation"),
    };
    let written = 200 - rest.len();
    let _ = std::io::stderr().write_all(&buffer[..written]);
    false
}

fn take_largest_request() -> usize {
    LARGEST_REQUEST.with(|largest| largest.replace(0))
}

// SAFETY: forwards to the system allocator; a refused request returns null, which every caller
// of `GlobalAlloc` handles (fallible APIs report it, infallible ones abort).
unsafe impl GlobalAlloc for CappedAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if admit(layout.size()) { unsafe { System.alloc(layout) } } else { std::ptr::null_mut() }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if admit(layout.size()) { unsafe { System.alloc_zeroed(layout) } } else { std::ptr::null_mut() }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if admit(new_size) { unsafe { System.realloc(ptr, layout, new_size) } } else { std::ptr::null_mut() }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CappedAllocator = CappedAllocator;

// ---------------------------------------------------------------------------------------------
// Base archives and their layout
// ---------------------------------------------------------------------------------------------

const HEADER_LEN: usize = 20;

/// A well-formed archive to mutate, with its index parsed once.
struct Base {
    what: String,
    bytes: Vec<u8>,
    version: u32,
    index: Value,
    /// (payload offset, compressed size) per xz stream.
    streams: Vec<(usize, usize)>,
    /// The stream of each functional.
    stream_of: Vec<usize>,
}

impl Base {
    fn new(what: impl Into<String>, bytes: Vec<u8>) -> Base {
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let (version, index_len) = (u32_at(8), u32_at(12) as usize);
        let json = index_json(version, &bytes[HEADER_LEN..HEADER_LEN + index_len]).expect("the base archive's index");
        let index: Value = serde_json::from_slice(&json).expect("the base archive's index");
        let streams = index["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["offset"].as_u64().unwrap() as usize, s["compressed_size"].as_u64().unwrap() as usize))
            .collect();
        let stream_of = index["functionals"].as_array().unwrap().iter().map(|f| f["stream"].as_u64().unwrap() as usize).collect();
        Base { what: what.into(), bytes, version, index, streams, stream_of }
    }
    fn index_len(&self) -> usize {
        u32::from_le_bytes(self.bytes[12..16].try_into().unwrap()) as usize
    }
    fn payload_start(&self) -> usize {
        HEADER_LEN + self.index_len()
    }
    fn payload(&self) -> &[u8] {
        &self.bytes[self.payload_start()..]
    }
    /// The xz stream that holds byte `at` of the file, if any.
    fn stream_at(&self, at: usize) -> Option<usize> {
        let offset = at.checked_sub(self.payload_start())?;
        self.streams.iter().position(|&(start, size)| (start..start + size).contains(&offset))
    }
    /// The functionals whose images stream `stream` holds, in index order.
    fn functionals_of(&self, stream: usize) -> Vec<usize> {
        (0..self.stream_of.len()).filter(|&f| self.stream_of[f] == stream).collect()
    }
}

/// An archive file from header fields, the index JSON and a payload: the index stored as
/// `version` stores it (xz from version 5 on; a fast preset, which the reader does not see), its
/// CRC computed.
fn assemble(version: u32, json: &[u8], payload: &[u8]) -> Vec<u8> {
    if version < 5 {
        return assemble_stored(version, json, payload);
    }
    assemble_stored(version, &liblzma::encode_all(json, 1).unwrap(), payload)
}

/// An archive file from header fields, the index bytes as stored and a payload (the CRC computed).
fn assemble_stored(version: u32, index: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + index.len() + payload.len());
    bytes.extend_from_slice(b"AOTRIMG\0");
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&(index.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(index).to_le_bytes());
    bytes.extend_from_slice(index);
    bytes.extend_from_slice(payload);
    bytes
}

/// The build's archive: `$AOTRITON_ARCHIVE_DIR/aotriton-sm_90.images`, else the first
/// `*.images` there. `None` when the variable is unset.
fn build_archive() -> Option<&'static (String, Vec<u8>)> {
    static ARCHIVE: OnceLock<Option<(String, Vec<u8>)>> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            let dir = PathBuf::from(std::env::var_os("AOTRITON_ARCHIVE_DIR").filter(|d| !d.is_empty())?);
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("AOTRITON_ARCHIVE_DIR={}: {e}", dir.display()))
                .filter_map(|entry| Some(entry.ok()?.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "images"))
                .collect();
            files.sort_by_key(|p| (!p.ends_with("aotriton-sm_90.images"), p.clone()));
            let path = files.first().unwrap_or_else(|| panic!("AOTRITON_ARCHIVE_DIR={} holds no *.images", dir.display()));
            let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Some((path.display().to_string(), bytes))
        })
        .as_ref()
}

/// A small archive of real kernels: per family the functional with the fewest image bytes, the
/// six smallest of those plus the smallest one with TMA descriptor arguments and the first one's
/// dtype sibling (sharing its stream), at most two kernels each. Small enough for thousands of cases per second.
fn repack_small(real: &Archive) -> Vec<u8> {
    let functionals = real.functionals();
    let mut smallest: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, f) in functionals.iter().enumerate() {
        let entry = smallest.entry(f.family.as_str()).or_insert(i);
        if f.uncompressed_size() < functionals[*entry].uncompressed_size() {
            *entry = i;
        }
    }
    let mut chosen: Vec<usize> = smallest.into_values().collect();
    chosen.sort_by_key(|&i| functionals[i].uncompressed_size());
    chosen.truncate(6);
    let has_tensordesc = |i: &usize| functionals[*i].kernels.iter().any(|k| k.args.iter().any(|a| a.tensordesc.is_some()));
    if !chosen.iter().any(has_tensordesc)
        && let Some(i) = (0..functionals.len()).filter(has_tensordesc).min_by_key(|&i| functionals[i].uncompressed_size())
    {
        chosen.push(i);
    }
    // And a functional sharing a stream with the smallest one that shares one (its fp16/bf16 or
    // TF32 sibling), so that one stream holds two functionals.
    let key = |i: usize| stream_key(&functionals[i].family, &functionals[i].axes);
    let sibling_of = |f: usize| (0..functionals.len()).find(|&i| i != f && key(i) == key(f));
    if let Some(sibling) = chosen.iter().find_map(|&f| sibling_of(f)) {
        chosen.push(sibling);
    }
    let mut writer = ArchiveWriter::new(real.arch(), real.triton_version(), real.target().clone());
    for i in chosen {
        let f = &functionals[i];
        let images = real.load_images(i).expect("the build's archive loads");
        let axes: Vec<(&str, &str)> = f.axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (meta, image) in f.kernels.iter().zip(images).take(2) {
            writer.add(&f.family, &axes, meta.clone(), image).expect("repacking");
        }
    }
    writer.to_bytes().expect("repacking")
}

/// A synthetic archive (no build needed): two functionals of two kernels with random images, one
/// kernel with a TMA descriptor argument (format version 2).
fn synthetic_archive() -> Vec<u8> {
    let mut rng = Rng::new(14);
    let arg = |name: &str, ty: &str| KernelArg { name: name.into(), ty: ty.into(), divisibility: 16, tensordesc: None };
    let meta = |id: &str, args: Vec<KernelArg>| KernelMeta {
        id: id.into(),
        symbol: id.into(),
        variant: "aligned".into(),
        config: BTreeMap::from([("BLOCK_M".to_string(), 64), ("num_warps".to_string(), 4)]),
        args,
        shared: 1024,
        num_warps: 4,
        warp_size: 32,
        num_ctas: 1,
        global_scratch_size: 0,
        global_scratch_align: 1,
        profile_scratch_size: 0,
        profile_scratch_align: 1,
        tuned_for: Vec::new(),
        tuned_only: false,
        portable_for: Vec::new(),
    };
    let descriptor = KernelArg {
        name: "desc_q".into(),
        ty: "tensordesc<fp16[64, 64]>".into(),
        divisibility: 1,
        tensordesc: Some(TensorDescMeta { block_size: vec![64, 64], swizzle: 3, elem_type: 6, elem_size: 2, fp4_padded: false }),
    };
    let mut image = |n: usize| (0..n).map(|i| if i % 7 == 0 { rng.next_u64() as u8 } else { (i / 64) as u8 }).collect::<Vec<u8>>();
    let target = json!({"backend": "cuda", "arch": 90, "warp_size": 32});
    let mut writer = ArchiveWriter::new("sm_90", "3.6.0", target);
    for (family, dtype, ids) in [("attn_fwd", "fp16", ["a1", "a2"]), ("attn_fwd_gluon", "bf16", ["g1", "g2"])] {
        for (k, id) in ids.iter().enumerate() {
            let mut args = vec![arg("Q", "*fp16"), arg("sm_scale", "fp32"), arg("N_CTX", "i32")];
            if family.ends_with("gluon") && k == 0 {
                args.push(descriptor.clone());
            }
            writer.add(family, &[("dtype", dtype), ("head_dim", "64")], meta(id, args), image(4096 + 1000 * k)).unwrap();
        }
    }
    writer.to_bytes().unwrap()
}

fn bases() -> Option<&'static [Base]> {
    static BASES: OnceLock<Option<Vec<Base>>> = OnceLock::new();
    BASES
        .get_or_init(|| {
            let (path, bytes) = build_archive()?;
            let real = Archive::parse(path, Cow::Owned(bytes.clone())).unwrap_or_else(|e| panic!("the build's archive: {e}"));
            let small = repack_small(&real);
            Some(vec![Base::new(format!("small repack of {path}"), small), Base::new(path.clone(), bytes.clone())])
        })
        .as_deref()
}

// ---------------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------------

/// A mutation, printed with a failing case (its fields are read through Debug only).
#[allow(dead_code)]
#[derive(Debug, Clone)]
enum Mutation {
    /// (byte, bit) pairs flipped anywhere in the file.
    BitFlips(Vec<(usize, u8)>),
    /// A header field (8 version, 12 index length, 16 index CRC) set to a value.
    HeaderField { at: usize, value: u32 },
    Truncate(usize),
    Append(Vec<u8>),
    /// A byte of the index replaced (of its JSON, or of the bytes as stored), the CRC fixed up.
    IndexByte { at: usize, byte: u8, in_json: bool },
    /// A structural edit of the index JSON (a node at `pointer`), the CRC fixed up.
    IndexEdit { pointer: String, edit: String },
    /// A byte of an xz stream replaced, its CRC in the index fixed up (so liblzma and the
    /// per-image CRCs see the damage).
    StreamByte { stream: usize, at: usize, byte: u8 },
    /// A stream's `uncompressed_size` and the `image_size` of its last image grown together (the
    /// layout stays consistent; aimed at allocations sized from the index).
    Inflate { stream: usize, by: u64 },
    /// One key's values swapped between two functionals (`functionals`) or two streams.
    SwapField { of: &'static str, a: usize, b: usize, key: &'static str },
}

const NUMBER_EDGES: &[i128] = &[
    0, 1, 2, -1, 15, 16, 17, 255, 4096, 65535, 65536, u32::MAX as i128, u32::MAX as i128 + 1, (1 << 31) - 1, 1 << 31,
    (1 << 53) + 1, 1 << 62, i64::MAX as i128, i64::MAX as i128 + 1, u64::MAX as i128, i64::MIN as i128,
];

/// A structural edit of `index`; returns its description, or `None` when the chosen node does not
/// take the chosen edit.
fn edit_index(index: &mut Value, rng: &mut Rng) -> Option<(String, String)> {
    // A functional's subtree most of the time (the real index has ~300 of them), else the top.
    let functionals = index["functionals"].as_array().map_or(0, |f| f.len());
    let root = if functionals > 0 && !rng.one_in(8) { format!("/functionals/{}", rng.index(functionals)) } else { String::new() };
    let mut pointers = Vec::new();
    collect_pointers(index.pointer(&root)?, &root, &mut pointers);
    let pointer = pointers[rng.index(pointers.len())].clone();
    let (parent, key) = match pointer.rsplit_once('/') {
        Some((parent, key)) => (parent.to_string(), key.to_string()),
        None => (String::new(), String::new()),
    };
    let edit = match rng.below(8) {
        0 | 1 => {
            let n = rng.pick(NUMBER_EDGES);
            *index.pointer_mut(&pointer)? = number(n);
            format!("= {n}")
        }
        2 => {
            let node = index.pointer_mut(&pointer)?;
            let n = node.as_u64()? as i128;
            let nudged = rng.pick(&[n + 1, n - 1, n * 2, n + (1 << 31), n + (1 << 32), n << 20]);
            *node = number(nudged);
            format!("{n} -> {nudged}")
        }
        3 => {
            let replacement = match rng.below(8) {
                0 => Value::Null,
                1 => json!(true),
                2 => json!(""),
                3 => json!("x".repeat(10_000)),
                4 => json!([]),
                5 => json!({}),
                6 => json!("\u{0}é∂\u{10ffff}"),
                _ => json!(1.5),
            };
            let text = replacement.to_string().chars().take(40).collect::<String>();
            *index.pointer_mut(&pointer)? = replacement;
            format!("= {text}")
        }
        4 => match index.pointer_mut(&parent)? {
            Value::Object(map) => {
                map.remove(&key)?;
                "removed".into()
            }
            Value::Array(items) => {
                let i: usize = key.parse().ok()?;
                if rng.one_in(2) {
                    items.remove(i);
                    "removed".into()
                } else if i + 1 < items.len() {
                    items.swap(i, i + 1);
                    "swapped with the next".into()
                } else {
                    let copy = items[i].clone();
                    items.push(copy);
                    "duplicated".into()
                }
            }
            _ => return None,
        },
        5 => {
            let map = index.pointer_mut(&pointer)?.as_object_mut()?;
            if map.contains_key("divisibility") && rng.one_in(2) {
                // An argument: a TMA descriptor with edge values.
                let rank = rng.below(8) as usize;
                let descriptor = json!({
                    "block_size": (0..rank).map(|_| number(rng.pick(NUMBER_EDGES))).collect::<Vec<_>>(),
                    "swizzle": number(rng.pick(NUMBER_EDGES)),
                    "elem_type": rng.below(16),
                    "elem_size": number(rng.pick(NUMBER_EDGES)),
                    "fp4_padded": rng.one_in(2),
                });
                let text = descriptor.to_string();
                map.insert("tensordesc".into(), descriptor);
                if rng.one_in(2) {
                    map.insert("type".into(), json!("tensordesc<fp16[64, 64]>"));
                }
                format!("+ tensordesc {text}")
            } else {
                map.insert("zz_unknown".into(), json!({"a": [1, 2]}));
                "+ an unknown key".into()
            }
        }
        6 => {
            let node = index.pointer_mut(&pointer)?;
            let s = node.as_str()?.to_string();
            let edited = match rng.below(4) {
                0 => String::new(),
                1 => format!("{s}x"),
                2 => s.to_uppercase(),
                _ => format!("../{s}"),
            };
            *node = json!(edited);
            format!("{s:?} -> {edited:?}")
        }
        _ => {
            // Another node's value copied here.
            let other = pointers[rng.index(pointers.len())].clone();
            let value = index.pointer(&other)?.clone();
            if value.to_string().len() > 100_000 {
                return None;
            }
            *index.pointer_mut(&pointer)? = value;
            format!("= the value of {other}")
        }
    };
    Some((pointer, edit))
}

fn number(n: i128) -> Value {
    if let Ok(u) = u64::try_from(n) {
        json!(u)
    } else if let Ok(i) = i64::try_from(n) {
        json!(i)
    } else {
        json!(n as f64)
    }
}

/// JSON pointers of `node` and every node under it.
fn collect_pointers(node: &Value, at: &str, out: &mut Vec<String>) {
    out.push(at.to_string());
    match node {
        Value::Object(map) => {
            for (k, v) in map {
                collect_pointers(v, &format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect_pointers(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Picks and applies a mutation to `base`: the mutated bytes, the mutation, and the functionals
/// it touched (those are loaded if the archive parses).
fn mutate(base: &Base, rng: &mut Rng) -> (Vec<u8>, Mutation, Vec<usize>) {
    let len = base.bytes.len();
    let (functionals, streams) = (base.stream_of.len(), base.streams.len());
    // Edits that re-serialize the index cost ~0.05 s on the build's 0.4 MB index (debug build):
    // there they are one mutation in six instead of one in two.
    let large = base.index_len() > 1 << 18;
    loop {
        let mut bytes = base.bytes.clone();
        let mut kind = rng.below(12);
        if large && kind >= 6 && !rng.one_in(3) {
            kind = rng.below(6);
        }
        let mutation = match kind {
            0 | 1 => {
                let flips: Vec<(usize, u8)> = (0..rng.range(1, 8)).map(|_| (rng.index(len), rng.below(8) as u8)).collect();
                for &(at, bit) in &flips {
                    bytes[at] ^= 1 << bit;
                }
                Mutation::BitFlips(flips)
            }
            2 => {
                let at = rng.pick(&[8, 12, 16]);
                let current = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                let value = rng.pick(&[0, 1, 2, 3, u32::MAX, current.wrapping_add(1), current.wrapping_sub(1), current ^ 0x8000_0000]);
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
                Mutation::HeaderField { at, value }
            }
            3 => {
                let keep = match rng.below(4) {
                    0 => rng.index(HEADER_LEN + 1),
                    1 => base.payload_start() + rng.index(3) - 1,
                    2 => len - rng.range(1, 16) as usize,
                    _ => rng.index(len),
                };
                bytes.truncate(keep);
                Mutation::Truncate(keep)
            }
            4 => {
                let extra: Vec<u8> = match rng.below(3) {
                    0 => vec![0],
                    1 => base.bytes[base.payload_start()..][..base.streams[0].1.min(64)].to_vec(),
                    _ => (0..rng.range(1, 4096)).map(|_| rng.next_u64() as u8).collect(),
                };
                bytes.extend_from_slice(&extra);
                Mutation::Append(extra)
            }
            5 => {
                // A byte of the index as stored (from version 5 on: of its xz stream), or of
                // its JSON.
                let stored = &base.bytes[HEADER_LEN..base.payload_start()];
                let in_json = base.version >= 5 && rng.one_in(2);
                let json = serde_json::to_vec(&base.index).unwrap();
                let mut edited = if in_json { json } else { stored.to_vec() };
                let at = rng.index(edited.len());
                let random = rng.next_u64() as u8;
                let byte = rng.pick(&[b'0', b'9', b'-', b'"', b'{', b'}', b',', b' ', b'e', 0, 0xff, random]);
                edited[at] = byte;
                bytes = if in_json {
                    assemble(base.version, &edited, base.payload())
                } else {
                    assemble_stored(base.version, &edited, base.payload())
                };
                Mutation::IndexByte { at, byte, in_json }
            }
            6..=8 => {
                let mut index = base.index.clone();
                let Some((pointer, edit)) = edit_index(&mut index, rng) else { continue };
                bytes = assemble(base.version, &serde_json::to_vec(&index).unwrap(), base.payload());
                let touched = pointer.strip_prefix("/functionals/").and_then(|p| p.split('/').next()?.parse().ok());
                return (bytes, Mutation::IndexEdit { pointer, edit }, touched.into_iter().collect());
            }
            9 => {
                let stream = rng.index(streams);
                let (start, size) = base.streams[stream];
                let at = base.payload_start() + start + rng.index(size);
                let byte = bytes[at] ^ (rng.range(1, 255) as u8);
                let mut payload = base.payload().to_vec();
                payload[at - base.payload_start()] = byte;
                let mut index = base.index.clone();
                index["streams"][stream]["crc32"] = json!(crc32fast::hash(&payload[start..start + size]));
                bytes = assemble(base.version, &serde_json::to_vec(&index).unwrap(), &payload);
                Mutation::StreamByte { stream, at, byte }
            }
            10 => {
                let stream = rng.index(streams);
                let Some(&functional) = base.functionals_of(stream).last() else { continue };
                let mut index = base.index.clone();
                let uncompressed = index["streams"][stream]["uncompressed_size"].as_u64().unwrap();
                let by = rng.pick(&[1, 4096, 1 << 30, 1 << 31, 3 << 30, 1 << 32, 1 << 40, 1 << 62, u64::MAX - uncompressed]);
                index["streams"][stream]["uncompressed_size"] = json!(uncompressed.saturating_add(by));
                let f = &mut index["functionals"][functional];
                let Some(last) = f["kernels"].as_array().and_then(|k| k.len().checked_sub(1)) else { continue };
                let image = f["kernels"][last]["image_size"].as_u64().unwrap();
                f["kernels"][last]["image_size"] = json!(image.saturating_add(by));
                bytes = assemble(base.version, &serde_json::to_vec(&index).unwrap(), base.payload());
                return (bytes, Mutation::Inflate { stream, by }, base.functionals_of(stream));
            }
            _ => {
                let (of, count, keys): (&str, usize, &[&str]) = if rng.one_in(2) {
                    ("functionals", functionals, &["kernels", "axes", "family", "stream"])
                } else {
                    ("streams", streams, &["crc32", "compressed_size", "uncompressed_size", "offset"])
                };
                let (a, b) = (rng.index(count), rng.index(count));
                let key = rng.pick(keys);
                let mut index = base.index.clone();
                let value_a = index[of][a][key].take();
                let value_b = std::mem::replace(&mut index[of][b][key], value_a);
                index[of][a][key] = value_b;
                bytes = assemble(base.version, &serde_json::to_vec(&index).unwrap(), base.payload());
                let touched = if of == "streams" { [base.functionals_of(a), base.functionals_of(b)].concat() } else { vec![a, b] };
                return (bytes, Mutation::SwapField { of, a, b, key }, touched);
            }
        };
        let touched = match &mutation {
            Mutation::BitFlips(flips) => flips.iter().filter_map(|&(at, _)| base.stream_at(at)).flat_map(|s| base.functionals_of(s)).collect(),
            Mutation::StreamByte { stream, .. } => base.functionals_of(*stream),
            _ => Vec::new(),
        };
        return (bytes, mutation, touched);
    }
}

// ---------------------------------------------------------------------------------------------
// One case
// ---------------------------------------------------------------------------------------------

/// Where `open` reads its file from: one per process and thread.
fn scratch_file() -> PathBuf {
    let thread = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_ascii_alphanumeric(), "");
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-archive-{}-{thread}.images", std::process::id()))
}

const NAME: &str = "fuzzed.images";

/// Parses `bytes` (and, with `through_file`, opens them from a file too) and exercises what
/// parses. Errors are the properties that failed.
fn check_archive(bytes: Vec<u8>, touched: &[usize], through_file: bool, rng: &mut Rng) -> Result<(), String> {
    let from_file = if through_file {
        let path = scratch_file();
        std::fs::write(&path, &bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        // Compared with `parse` by outcome (functional count or refusal): the messages may word
        // a refusal differently (`open` checks the file's size before reading it).
        let opened = Archive::open(&path).map(|a| a.functionals().len()).map_err(|e| e.problem);
        let _ = std::fs::remove_file(&path);
        Some(opened)
    } else {
        None
    };
    let parsed = Archive::parse(NAME, Cow::Owned(bytes));
    if let Some(opened) = from_file
        && opened.as_ref().ok() != parsed.as_ref().ok().map(|a| a.functionals().len()).as_ref()
    {
        return Err(format!("open and parse disagree: {opened:?} vs {:?}", parsed.map(|a| a.functionals().len())));
    }
    let archive = match parsed {
        Err(e) if e.file == NAME => return Ok(()),
        Err(e) => return Err(format!("the error names {:?}, not the archive: {e}", e.file)),
        Ok(archive) => archive,
    };
    let _ = (archive.name(), archive.arch(), archive.triton_version(), archive.target(), format!("{archive:?}"));
    let functionals = archive.functionals();
    let mut checked: Vec<usize> = touched.iter().copied().filter(|&i| i < functionals.len()).collect();
    if !functionals.is_empty() {
        checked.push(rng.index(functionals.len()));
    }
    for _ in 0..6.min(functionals.len()) {
        let i = rng.index(functionals.len());
        let f = &functionals[i];
        let axes: Vec<(&str, &str)> = f.axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        if archive.find(&f.family, &axes) != Some(i) {
            return Err(format!("find does not find functional {i} ({})", f.display_name()));
        }
        let mut doubled = axes.clone();
        doubled.push(doubled.first().copied().unwrap_or(("dtype", "fp16")));
        doubled.push(doubled[0]);
        if archive.find(&f.family, &doubled).is_some() {
            return Err(format!("find matched a query naming a key twice: {doubled:?}"));
        }
        let _ = (f.display_name(), archive.stream_sizes(f.stream()), f.uncompressed_size(), f.image_size(usize::MAX));
    }
    let _ = archive.find("", &[]);
    if archive.load_images(usize::MAX).is_ok() {
        return Err("load_images(usize::MAX) succeeded".into());
    }
    for i in checked {
        match archive.load_images(i) {
            Err(e) if e.file != NAME => return Err(format!("load_images({i}): the error names {:?}: {e}", e.file)),
            Err(_) => {}
            Ok(images) => {
                let f = &functionals[i];
                if images.len() != f.kernels.len() {
                    return Err(format!("load_images({i}) gave {} images for {} kernels", images.len(), f.kernels.len()));
                }
                for (k, image) in images.iter().enumerate() {
                    if Some(image.len() as u64) != f.image_size(k) {
                        return Err(format!("load_images({i}): image {k} has {} bytes, the index says {:?}", image.len(), f.image_size(k)));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Shortens a long Debug text (an edit may hold a 10 kB string).
fn shorten(text: String) -> String {
    if text.len() <= 400 { text } else { format!("{}... ({} bytes)", &text[..text.char_indices().nth(400).map_or(text.len(), |(i, _)| i)], text.len()) }
}

#[test]
fn fuzz_archive() {
    let config = FuzzConfig::from_env();
    let Some(bases) = bases() else {
        println!("skipped: no archive (set AOTRITON_ARCHIVE_DIR)");
        return;
    };
    for base in bases {
        println!("fuzz_archive: base {} ({} bytes, {} functionals, {} streams)", base.what, base.bytes.len(), base.stream_of.len(), base.streams.len());
    }
    let mut per_base = [0u64; 2];
    let report = fuzz_loop("fuzz_archive", &config, |_, rng| {
        // The build's archive in one case of 32: parsing its 0.4 MB index makes a case ~25×
        // slower than one on the small repack (~2 ms).
        let which = if rng.one_in(32) { 1 } else { 0 };
        per_base[which] += 1;
        let base = &bases[which];
        let (bytes, mutation, touched) = mutate(base, rng);
        note_case(|| shorten(format!("{}: {mutation:?}", base.what)));
        let through_file = rng.one_in(if which == 0 { 16 } else { 64 });
        take_largest_request();
        let outcome = check_archive(bytes, &touched, through_file, rng);
        let largest = take_largest_request();
        let outcome = outcome.and_then(|()| {
            if largest > ALLOCATION_CAP {
                Err(format!("asked the allocator for {largest} bytes in one request (cap {ALLOCATION_CAP})"))
            } else {
                Ok(())
            }
        });
        outcome.map_err(|problem| shorten(format!("{problem}\n    the case: {}: {mutation:?}", base.what)))
    });
    println!("fuzz_archive: {} cases on the small repack, {} on the build's archive", per_base[0], per_base[1]);
    assert_clean("fuzz_archive", &config, &report);
}

// ---------------------------------------------------------------------------------------------
// Regression cases
// ---------------------------------------------------------------------------------------------

/// F14: `load_images` reserved the index's `uncompressed_size` up front, so an index that grows
/// it (with the last image, keeping the layout consistent) made one request of any size. The
/// declared sizes must be capped before anything is allocated from them.
#[test]
fn regression_f14_declared_sizes_do_not_size_allocations() {
    let base = Base::new("synthetic", synthetic_archive());
    let mut failures = Vec::new();
    for by in [3u64 << 30, 1 << 32, 1 << 40, 1 << 62] {
        for functional in 0..base.stream_of.len() {
            // The functional's stream, and its last image (of the stream's last functional).
            let stream = base.stream_of[functional];
            let owner = *base.functionals_of(stream).last().unwrap();
            let mut index = base.index.clone();
            let s = &mut index["streams"][stream];
            s["uncompressed_size"] = json!(s["uncompressed_size"].as_u64().unwrap() + by);
            let f = &mut index["functionals"][owner];
            let last = f["kernels"].as_array().unwrap().len() - 1;
            f["kernels"][last]["image_size"] = json!(f["kernels"][last]["image_size"].as_u64().unwrap() + by);
            let bytes = assemble(base.version, &serde_json::to_vec(&index).unwrap(), base.payload());
            take_largest_request();
            let outcome = no_panic(|| {
                let archive = Archive::parse(NAME, Cow::Owned(bytes)).map_err(|e| e.problem)?;
                archive.load_images(functional).map(|_| ()).map_err(|e| e.problem)
            });
            let largest = take_largest_request();
            match outcome {
                Ok(Ok(())) => failures.push(format!("+{by} on functional {functional}: loaded")),
                Err(panic) => failures.push(format!("+{by} on functional {functional}: PANIC {panic}")),
                Ok(Err(_)) if largest > ALLOCATION_CAP => {
                    failures.push(format!("+{by} on functional {functional}: one request of {largest} bytes"))
                }
                Ok(Err(_)) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// F1: `Archive::open` read the whole file before looking at it, so an 8 GiB file was read into
/// memory to find a bad magic. A file larger than its header and index declare must be refused
/// without reading it (here: a valid archive made 3 GiB longer, sparse on disk).
#[test]
fn regression_f1_open_does_not_read_an_oversized_file() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-archive-oversized-{}.images", std::process::id()));
    let bytes = synthetic_archive();
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(bytes.len() as u64 + (3 << 30)).unwrap();
    drop(file);
    take_largest_request();
    let outcome = no_panic(|| Archive::open(&path).map(|_| ()));
    let largest = take_largest_request();
    let _ = std::fs::remove_file(&path);
    match outcome {
        Ok(Err(e)) if largest <= ALLOCATION_CAP => assert!(e.file.contains("fuzz-archive-oversized"), "{e}"),
        other => panic!("open of a 3 GiB file: {other:?}, largest single request {largest} bytes (cap {ALLOCATION_CAP})"),
    }
}

/// The synthetic archive itself parses and loads (the regression cases above start from it).
#[test]
fn the_synthetic_archive_is_valid() {
    let archive = Archive::parse(NAME, Cow::Owned(synthetic_archive())).unwrap();
    assert_eq!(archive.functionals().len(), 2);
    for i in 0..2 {
        assert_eq!(archive.load_images(i).unwrap().len(), 2);
    }
}
