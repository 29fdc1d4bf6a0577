//! The kernel archive: every compiled kernel image of one GPU arch in one file.
//!
//! The compile driver (`python/compile.py`) leaves a directory of `<id>.json` metadata files and
//! `.cubin`/`.hsaco` images. [`pack_dir`] turns that directory into one archive per arch (e.g.
//! `aotriton-sm_90.images`); the runtime opens it with [`Archive::open`] (or [`Archive::parse`]
//! on embedded bytes), looks a functional up with [`Archive::find`] and decompresses only the
//! functionals it actually launches with [`Archive::load_images`].
//!
//! # Byte layout (all integers little-endian)
//!
//! ```text
//! offset  size  field
//! 0       8     magic  b"AOTRIMG\0"
//! 8       4     u32    format version (1 to 5)
//! 12      4     u32    index length L (as stored)
//! 16      4     u32    CRC32 of the index bytes as stored
//! 20      L     index  UTF-8 JSON (below); from version 5 on, one xz stream of that JSON
//! 20+L    P     payload: xz streams back to back (one per functional before version 4)
//! ```
//!
//! The file ends exactly at `20 + L + P`, where `P` is the index's `payload_size`. The reader
//! caps what an archive may declare ([`MAX_INDEX_LEN`], [`MAX_PAYLOAD_SIZE`],
//! [`MAX_UNCOMPRESSED_SIZE`] and [`MAX_COMPRESSION_RATIO`] per stream), and [`Archive::open`]
//! checks the header against the file's size before reading on, so a crafted file cannot make
//! it read or allocate more than the caps.
//!
//! The index (its JSON):
//!
//! ```text
//! { "format_version": 5, "arch": "sm_90", "triton_version": "3.6.0",
//!   "target": {...as in the manifest...}, "payload_size": P,
//!   "arg_lists": [                   // version 4 on: the distinct argument lists
//!     [{"name": "Q", "type": "*fp16", "divisibility": 16},
//!      // version 2 on: a host-side TMA descriptor argument
//!      {"name": "desc_q", "type": "tensordesc<bf16[1, 1, 64, 128],...>",
//!       "divisibility": 1,
//!       "tensordesc": {"block_size": [1, 1, 64, 64], "swizzle": 3,
//!                      "elem_type": 10, "elem_size": 2, "fp4_padded": false}}, ...], ...],
//!   "streams": [                     // version 4 on: the payload's xz streams
//!     { "offset": 0,                 // relative to the payload start
//!       "compressed_size": C, "uncompressed_size": U,
//!       "crc32": X }, ...],          // of the C compressed bytes
//!   "functionals": [
//!     { "family": "attn_fwd", "axes": {"causal": "false", "dtype": "fp16", "head_dim": "64"},
//!       "stream": 0,                 // version 4; before, the four stream fields are here
//!       "kernels": [
//!         { "id": ..., "symbol": ..., "variant": ..., "config": {"BLOCK_M": 128, ...},
//!           "args": 0,                   // index into arg_lists (before version 4: the list)
//!           "shared": ..., "num_warps": ..., "warp_size": ..., "num_ctas": ...,
//!           "global_scratch_size": ..., "global_scratch_align": ...,
//!           "profile_scratch_size": ..., "profile_scratch_align": ...,
//!           "image_offset": O, "image_size": S,   // inside its stream's U decompressed bytes
//!           "image_crc32": Y } ] } ] }
//! ```
//!
//! A functional is (family, functional axes). A stream is the concatenation of the images of
//! the functionals with the same [`stream_key`] (a family's functionals of one head dim, fp16
//! and bf16 alike, fp32 with and without TF32 alike, every feature axis alike: nearly the same
//! machine code), functionals in index order and their kernels by id, so a stream
//! decompresses independently of all others and only when one of its functionals is launched,
//! and then only up to that functional's last image.
//! Functionals are sorted by (family, axes), streams numbered in the order of their first
//! functional, streams and images laid out contiguously in that order, and the writer is
//! deterministic, so rebuilding from the same inputs gives a byte-identical file. The reader
//! insists on exactly that layout, so any inconsistency in an index is reported instead of being
//! half-trusted.
//!
//! # Versions
//!
//! The header's version and the index's `format_version` are equal. Policy: a change an older
//! reader would misread or silently drop (a new meaning, or a new field the launch depends on)
//! bumps the version; the reader reads every version from [`MIN_FORMAT_VERSION`] to
//! [`FORMAT_VERSION`] and refuses newer ones by name; the writer writes the *oldest* version that
//! can hold what was added (version 5 at least, see below), so archives without the newer
//! features stay readable by older runtimes. Purely informative additions (an extra `config` key)
//! need no bump.
//!
//! * 1: the base format.
//! * 2: an argument may carry `tensordesc` (the TMA box `block_size`, outermost first, already
//!   split for the swizzle width; `swizzle` 0..3; `elem_type`, Triton's *device* TMA data-type
//!   enum; `elem_size` in bytes; `fp4_padded`), and its `type` then starts with `tensordesc`.
//!   A version-1 index with a `tensordesc` is refused.
//! * 3: a kernel may carry `tuned_for`, the tuning-database cells it won (python/tuning.py):
//!   `[{"mask": "none"|"causal", "seqlen_q": [lo, hi], "seqlen_k": [lo, hi]}]`, lengths in
//!   `[lo, hi)`, `hi` null for no upper bound; dispatch takes that kernel for calls in a cell.
//!   `tuned_only: true` marks a kernel compiled only because the database names it (dispatch's
//!   heuristic leaves it out); `portable_for` (a Gluon kernel; cells as `tuned_for`) the cells
//!   where its operator measured faster on the portable backend. An older index with any of
//!   them is refused.
//! * 4: sharing. Kernels share argument lists: `arg_lists` holds each distinct list once, in the
//!   order of first use, every list used; a kernel's `args` is its list's position (the sm_90
//!   index went from 1.9 MB to 0.4 MB: 46 distinct lists served 624 kernels). Functionals share
//!   streams: `streams` lists them, a functional's `stream` names its own (the sm_90 payload went
//!   from 9.7 MB in 318 streams to 7.9 MB in 162). This changes how every archive is written, so
//!   the reader still reads versions 1-3 (inline lists, a stream per functional) and refuses
//!   `arg_lists` and `streams` in them.
//! * 5: the index is stored as one xz stream of its JSON (preset 9, extreme; decoded to at most
//!   [`MAX_INDEX_LEN`] bytes), the header's length and CRC those of the stored bytes: the sm_90
//!   index went from 803 KB to 29 KB (decoding it takes ~2 ms, parsing the JSON ~6 ms). This
//!   too changes how every archive is written, so the writer writes version 5 whatever it holds;
//!   [`index_json`] gives any version's JSON.
//!
//! This file is self-contained (only `std`, `liblzma`, `crc32fast`, `serde_json`): the build
//! script includes it by path to pack images at build time, so the same code writes and reads the
//! format. Nothing here panics on bad input; every problem is an [`ArchiveError`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use liblzma::stream::{Action, Check, Filters, LzmaOptions, Status, Stream};
use serde_json::{Map, Value, json};

/// The SHA-256 manifest installed beside the archives (sha256sum format: `<hex>  <file name>` per
/// line): the build writes it, the runtime trusts the archives it lists (src/images.rs).
pub const DIGEST_MANIFEST: &str = "aotriton-images.sha256";
/// First eight bytes of every archive.
pub const MAGIC: [u8; 8] = *b"AOTRIMG\0";
/// The newest format version this code reads and writes (see "Versions" above).
pub const FORMAT_VERSION: u32 = 5;
/// The oldest format version this code reads.
pub const MIN_FORMAT_VERSION: u32 = 1;
/// The first format version with `tensordesc` arguments.
const TENSORDESC_VERSION: u32 = 2;
/// The first format version with `tuned_for` cells.
const TUNED_VERSION: u32 = 3;
/// The first format version whose kernels share argument lists (`arg_lists`) and whose
/// functionals share streams (`streams`).
const SHARED_VERSION: u32 = 4;
/// The first format version whose index is stored xz-compressed; the writer writes no older
/// version.
const COMPRESSED_INDEX_VERSION: u32 = 5;

/// The functionals with equal keys share one xz stream (version 4 on): the same family, head dim
/// and dtype class, with fp16 and bf16 counting as one dtype, TF32 on and off as one, and every
/// feature axis (dropout, bias, the optional axes softcap, alibi, sinks and V's head dim, the KV
/// cache's paging, the Gluon kernels' packed batches) on and off as one. Their kernels are
/// near-identical machine code, which one stream compresses much smaller than many (sm_90:
/// 11.38 MB in a stream per fp16/bf16 pair of functionals, 10.52 MB so); a 16-bit call decodes no
/// fp32 code (sharing across all three dtypes saved only 2 % more). Inside a stream the functionals lie in index order, which puts the
/// features' off values first, and a load decodes only the stream's prefix up to the images it
/// needs ([`Archive::load_images`]): the plain kernels' first use decodes what it did before.
pub fn stream_key(family: &str, axes: &BTreeMap<String, String>) -> (String, BTreeMap<String, String>) {
    let mut key = axes.clone();
    if let Some(dtype) = key.get_mut("dtype")
        && (dtype == "fp16" || dtype == "bf16")
    {
        *dtype = "fp16|bf16".into();
    }
    for axis in ["tf32", "dropout", "bias", "softcap", "alibi", "sinks", "head_dim_v", "paged", "varlen"] {
        key.remove(axis);
    }
    (family.to_string(), key)
}
/// Most dimensions of a TMA descriptor.
pub const MAX_TENSORDESC_RANK: usize = 5;

/// magic + version + index length + index CRC.
const HEADER_LEN: usize = 20;
/// xz preset used for every functional's stream.
const XZ_PRESET: u32 = 9;
/// Largest dictionary the writer uses (that of preset 9). The writer shrinks the dictionary to
/// the blob size, as `xz` does for files of known size, so decoding small blobs stays cheap.
const MAX_DICT_SIZE: u32 = 64 << 20;
/// liblzma's smallest allowed dictionary.
const MIN_DICT_SIZE: u32 = 4096;
/// Decoder memory limit: enough for the largest dictionary the writer produces plus decoder
/// state, so a corrupt or hostile stream header cannot make the decoder allocate without bound.
const DECODER_MEMLIMIT: u64 = 128 << 20;
/// Caps on the sizes an archive declares, checked before anything of that size is allocated or
/// read, so a crafted file cannot make the reader take gigabytes. Each is far above what the
/// build writes (sm_90: an index of 0.8 MB as JSON, 29 KB stored; a 9.8 MB payload; streams
/// compressing at most 12:1). The index cap holds for its stored and its decoded size.
pub const MAX_INDEX_LEN: u32 = 64 << 20;
/// The largest payload (all compressed streams together) an archive may declare.
pub const MAX_PAYLOAD_SIZE: u64 = 1 << 30;
/// The largest total an archive's functionals may declare uncompressed.
pub const MAX_UNCOMPRESSED_SIZE: u64 = 1 << 30;
/// The largest uncompressed : compressed ratio one stream may declare.
pub const MAX_COMPRESSION_RATIO: u64 = 1000;

/// Anything wrong with an archive or with the packer's input. `file` names the file at fault,
/// `problem` says what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveError {
    /// The file at fault (an archive, or a file of the packer's input).
    pub file: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ArchiveError {
    fn new(file: impl Into<String>, problem: impl Into<String>) -> ArchiveError {
        ArchiveError {
            file: file.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ArchiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel archive {}: {}", self.file, self.problem)
    }
}

impl std::error::Error for ArchiveError {}

/// One kernel argument as Triton compiled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelArg {
    /// The parameter's name in the kernel's signature.
    pub name: String,
    /// Triton type string: `*fp16`, `fp32`, `i32`, ...
    pub ty: String,
    /// The divisibility Triton assumed when compiling (16 for `aligned` pointers and strides, 1
    /// for none): the runtime checks the caller's value against it.
    pub divisibility: u32,
    /// Set for a host-side TMA descriptor argument (format version 2).
    pub tensordesc: Option<TensorDescMeta>,
}

/// What Triton reports for a tensor-descriptor argument (`tensordesc_meta`): the runtime encodes
/// a `CUtensorMap` from it and the caller's tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDescMeta {
    /// The TMA box, outermost dimension first (its length is the descriptor's rank, 1..=5).
    pub block_size: Vec<u32>,
    /// `CUtensorMapSwizzle`: 0 none, 1 32 B, 2 64 B, 3 128 B.
    pub swizzle: u32,
    /// Triton's device-side TMA data-type enum (bf16 10, fp16 6, fp32 7).
    pub elem_type: u32,
    /// Bytes per element.
    pub elem_size: u32,
    /// Triton's `fp4_padded` flag (packed fp4 data; never set by aotriton's kernels).
    pub fp4_padded: bool,
}

impl TensorDescMeta {
    /// The descriptor's rank (dimensions of the TMA box).
    pub fn rank(&self) -> usize {
        self.block_size.len()
    }
}

/// Everything the runtime needs to launch one compiled kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelMeta {
    /// Unique name of the kernel within its archive (family, functional, config, variant).
    pub id: String,
    /// The entry point's symbol in the image.
    pub symbol: String,
    /// The divisibility variant: `aligned` or `generic` (ARCHITECTURE.md, "Divisibility variants").
    pub variant: String,
    /// BLOCK_M, BLOCK_N, num_warps, num_stages.
    pub config: BTreeMap<String, i64>,
    /// The runtime arguments, in the kernel's order.
    pub args: Vec<KernelArg>,
    /// Dynamic shared memory (LDS on AMD) in bytes.
    pub shared: u32,
    /// Warps (wavefronts on AMD) per program.
    pub num_warps: u32,
    /// Threads per warp the image was compiled for (32 NVIDIA, 64 CDNA).
    pub warp_size: u32,
    /// CTAs per cluster (1: no clusters).
    pub num_ctas: u32,
    /// Bytes of global scratch memory per program Triton asked for (0: none).
    pub global_scratch_size: u32,
    /// Alignment of that scratch memory.
    pub global_scratch_align: u32,
    /// Bytes of Triton's profiling scratch memory per program (0: none).
    pub profile_scratch_size: u32,
    /// Alignment of the profiling scratch memory.
    pub profile_scratch_align: u32,
    /// The tuning-database cells this kernel won (empty: dispatch's heuristic decides).
    pub tuned_for: Vec<TunedCell>,
    /// Compiled only because the tuning database (or a tuning build) names it: dispatch's
    /// heuristic leaves it out, so it decides among exactly its own configs.
    pub tuned_only: bool,
    /// A second backend's kernel (Gluon): the cells where the tuning database measured the
    /// portable backend faster for its operator, so `Backend::Auto` takes the portable kernels.
    pub portable_for: Vec<TunedCell>,
}

/// The mask kind of the tuning grid: whether a call's mask lets the kernels skip key blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// No mask and no window.
    None,
    /// Causal or a sliding window, either alignment.
    Causal,
}

/// Sequence lengths `lo <= n < hi` (`hi` None: no upper bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthBin {
    /// The shortest length in the bin.
    pub lo: u64,
    /// One past the longest length in the bin (None: unbounded).
    pub hi: Option<u64>,
}

impl LengthBin {
    /// Whether length `n` falls in the bin.
    pub fn contains(&self, n: u64) -> bool {
        n >= self.lo && self.hi.is_none_or(|hi| n < hi)
    }
}

/// One cell of the tuning grid (python/tuning.py): a mask kind and a bin of each length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunedCell {
    /// The mask kind the cell was timed with.
    pub mask: MaskKind,
    /// The query-length bin.
    pub seqlen_q: LengthBin,
    /// The key-length bin.
    pub seqlen_k: LengthBin,
}

impl TunedCell {
    /// Whether a call with this mask kind and lengths falls in the cell.
    pub fn contains(&self, mask: MaskKind, seqlen_q: u64, seqlen_k: u64) -> bool {
        self.mask == mask && self.seqlen_q.contains(seqlen_q) && self.seqlen_k.contains(seqlen_k)
    }
}

#[cfg(test)]
impl KernelMeta {
    /// A kernel with the given id, arguments and warps and neutral values elsewhere (no config,
    /// no shared memory, no scratch), for unit tests across the crate.
    pub(crate) fn for_tests(id: &str, args: Vec<KernelArg>, num_warps: u32) -> KernelMeta {
        KernelMeta {
            id: id.into(),
            symbol: id.into(),
            variant: "aligned".into(),
            config: BTreeMap::new(),
            args,
            shared: 0,
            num_warps,
            warp_size: 32,
            num_ctas: 1,
            global_scratch_size: 0,
            global_scratch_align: 1,
            profile_scratch_size: 0,
            profile_scratch_align: 1,
            tuned_for: Vec::new(),
            tuned_only: false,
            portable_for: Vec::new(),
        }
    }
}

/// Where one kernel's image sits inside its stream's decompressed bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ImageSlot {
    offset: u64,
    size: u64,
    crc32: u32,
}

/// One xz stream of the payload: the images of one functional (versions 1-3) or of the
/// functionals with the same [`stream_key`] (version 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StreamSlot {
    /// Relative to the payload start.
    offset: u64,
    compressed_size: u64,
    uncompressed_size: u64,
    crc32: u32,
}

/// A kernel family at fixed functional axes, with all its compiled kernels (configs × variants).
#[derive(Debug, Clone)]
pub struct Functional {
    /// The kernel family: `attn_fwd`, `attn_bwd_dkdv`, ...
    pub family: String,
    /// Canonical text of each axis value (see [`canonical_axis_value`]).
    pub axes: BTreeMap<String, String>,
    /// Its compiled kernels, one per (config, variant).
    pub kernels: Vec<KernelMeta>,
    /// The payload stream holding its images (see [`Archive::stream_sizes`]).
    stream: usize,
    /// One per kernel, same order.
    images: Vec<ImageSlot>,
}

impl Functional {
    /// `family{axis=value,...}`, for messages and listings.
    pub fn display_name(&self) -> String {
        functional_name(&self.family, &self.axes)
    }
    /// The payload stream that holds its images (shared with the functionals that differ from it
    /// in what [`stream_key`] ignores; see [`Archive::stream_sizes`]).
    pub fn stream(&self) -> usize {
        self.stream
    }
    /// Total size of its kernels' images.
    pub fn uncompressed_size(&self) -> u64 {
        self.images.iter().map(|s| s.size).sum()
    }
    /// Size of the image of `kernels[kernel]`, if there is such a kernel.
    pub fn image_size(&self, kernel: usize) -> Option<u64> {
        self.images.get(kernel).map(|s| s.size)
    }
}

fn functional_name(family: &str, axes: &BTreeMap<String, String>) -> String {
    let inner: Vec<String> = axes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{family}{{{}}}", inner.join(","))
}

/// Canonical text of a JSON scalar axis value: bools as `true`/`false`, integers in decimal,
/// strings as they are. Anything else (floats, null, arrays, objects) has none. The writer and
/// the runtime's lookup-key builder both go through this, so their keys always agree.
pub fn canonical_axis_value(v: &Value) -> Option<String> {
    match v {
        Value::Bool(b) => Some(b.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Some(i.to_string())
            } else {
                n.as_u64().map(|u| u.to_string())
            }
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// An opened archive: the raw bytes plus the checked index. Images stay compressed until
/// [`Archive::load_images`] asks for them.
pub struct Archive {
    name: String,
    bytes: Cow<'static, [u8]>,
    payload_start: usize,
    arch: String,
    triton_version: String,
    target: Value,
    streams: Vec<StreamSlot>,
    functionals: Vec<Functional>,
}

impl fmt::Debug for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archive")
            .field("name", &self.name)
            .field("bytes", &self.bytes.len())
            .field("arch", &self.arch)
            .field("triton_version", &self.triton_version)
            .field("functionals", &self.functionals.len())
            .finish()
    }
}

impl Archive {
    /// Checks the header (magic, version, length, index CRC) and the whole index (schema, layout
    /// and size caps). Payload CRCs are checked later, per functional, by [`Archive::load_images`].
    pub fn parse(name: &str, bytes: Cow<'static, [u8]>) -> Result<Archive, ArchiveError> {
        let len = bytes.len() as u64;
        let header = check_header(name, &bytes[..bytes.len().min(HEADER_LEN)], len)?;
        // check_header proved the file holds the whole index.
        let index_bytes = &bytes[HEADER_LEN..header.payload_start];
        let parsed = check_index(name, &header, index_bytes, len)?;
        Ok(Archive::from_parts(name, bytes, header.payload_start, parsed))
    }

    /// Reads and parses the archive at `path`; its name in errors is the path. The header is
    /// checked against the file's size before anything else is read, and the index before the
    /// payload, so a file that is not an archive, or whose size disagrees with what it declares,
    /// is refused having read at most its header and index.
    pub fn open(path: &Path) -> Result<Archive, ArchiveError> {
        let name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| ArchiveError::new(&name, format!("cannot read: {e}")))?;
        Archive::from_file(&name, file)
    }

    /// [`Archive::open`] on a file already open (whose metadata the caller may have checked):
    /// its size is taken from the open file, not from a path that could have changed since.
    pub fn from_file(name: &str, mut file: std::fs::File) -> Result<Archive, ArchiveError> {
        let len = file.metadata().map_err(|e| ArchiveError::new(name, format!("cannot read: {e}")))?.len();
        Archive::read_from(name, &mut file, len)
    }

    /// [`Archive::open`] on any reader of `len` bytes (the file's size as `fstat` reports it).
    fn read_from(name: &str, reader: &mut impl std::io::Read, len: u64) -> Result<Archive, ArchiveError> {
        let cannot = |e: std::io::Error| ArchiveError::new(name, format!("cannot read: {e}"));
        let mut bytes = vec![0u8; len.min(HEADER_LEN as u64) as usize];
        reader.read_exact(&mut bytes).map_err(cannot)?;
        let header = check_header(name, &bytes, len)?;
        bytes.resize(header.payload_start, 0);
        reader.read_exact(&mut bytes[HEADER_LEN..]).map_err(cannot)?;
        let parsed = check_index(name, &header, &bytes[HEADER_LEN..], len)?;
        // check_index proved `len` is exactly header + index + payload, and check_header that it
        // is within the caps.
        let total = usize::try_from(len).map_err(|_| ArchiveError::new(name, format!("file of {len} bytes is too large")))?;
        bytes.resize(total, 0);
        reader.read_exact(&mut bytes[header.payload_start..]).map_err(cannot)?;
        Ok(Archive::from_parts(name, Cow::Owned(bytes), header.payload_start, parsed))
    }

    fn from_parts(name: &str, bytes: Cow<'static, [u8]>, payload_start: usize, parsed: ParsedIndex) -> Archive {
        Archive {
            name: name.to_string(),
            bytes,
            payload_start,
            arch: parsed.arch,
            triton_version: parsed.triton_version,
            target: parsed.target,
            streams: parsed.streams,
            functionals: parsed.functionals,
        }
    }

    /// The whole archive file, as read or embedded (what its digest is computed over).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The name the archive was opened under: its file's path, or its file name when embedded.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The GPU arch of its kernels: `sm_90`, `gfx942`, ...
    pub fn arch(&self) -> &str {
        &self.arch
    }
    /// The Triton version that compiled its kernels.
    pub fn triton_version(&self) -> &str {
        &self.triton_version
    }
    /// The compile target as the manifest gave it (`backend`, `arch`, `warp_size`).
    pub fn target(&self) -> &Value {
        &self.target
    }
    /// Sorted by (family, axes).
    pub fn functionals(&self) -> &[Functional] {
        &self.functionals
    }

    /// (compressed, uncompressed) size of payload stream `stream` (see [`Functional::stream`]).
    pub fn stream_sizes(&self, stream: usize) -> Option<(u64, u64)> {
        self.streams.get(stream).map(|s| (s.compressed_size, s.uncompressed_size))
    }

    /// How many xz streams the payload holds.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Index of the functional of `family` whose axes equal `axes` exactly (same keys, same
    /// canonical values). A query naming one key twice matches nothing. Allocates nothing for
    /// queries of up to 16 axes (the launch path's).
    pub fn find(&self, family: &str, axes: &[(&str, &str)]) -> Option<usize> {
        const INLINE: usize = 16;
        let mut inline = [("", ""); INLINE];
        let mut spilled = Vec::new();
        let query: &mut [(&str, &str)] = if axes.len() <= INLINE {
            inline[..axes.len()].copy_from_slice(axes);
            &mut inline[..axes.len()]
        } else {
            spilled.extend_from_slice(axes);
            &mut spilled
        };
        query.sort_unstable();
        if query.windows(2).any(|w| w[0].0 == w[1].0) {
            return None;
        }
        // The parser checked the functionals are strictly sorted by (family, axes); comparing a
        // BTreeMap's (key, value) sequence lexicographically is exactly BTreeMap's own order.
        self.functionals
            .binary_search_by(|f| {
                f.family.as_str().cmp(family).then_with(|| {
                    f.axes
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .cmp(query.iter().copied())
                })
            })
            .ok()
    }

    /// Decompresses functional `index` (its stream up to the end of its last image: the
    /// functionals before it in the stream, not those after), verifies the stream's and every
    /// image's CRC, returns one image per kernel in `functionals()[index].kernels` order.
    pub fn load_images(&self, index: usize) -> Result<Vec<Vec<u8>>, ArchiveError> {
        let err = |problem: String| ArchiveError::new(&self.name, problem);
        let f = self.functionals.get(index).ok_or_else(|| {
            err(format!(
                "no functional {index} (archive has {})",
                self.functionals.len()
            ))
        })?;
        let fname = f.display_name();
        let stream = self
            .streams
            .get(f.stream)
            .ok_or_else(|| err(format!("functional {fname}: no stream {}", f.stream)))?;
        // Offsets were checked against the file length by `parse`; stay defensive anyway.
        let compressed = (self.payload_start as u64)
            .checked_add(stream.offset)
            .and_then(|start| Some((start, start.checked_add(stream.compressed_size)?)))
            .and_then(|(s, e)| {
                self.bytes
                    .get(usize::try_from(s).ok()?..usize::try_from(e).ok()?)
            })
            .ok_or_else(|| err(format!("functional {fname} lies outside the file")))?;
        let computed = crc32fast::hash(compressed);
        if computed != stream.crc32 {
            return Err(err(format!(
                "checksum mismatch in functional {fname} (stream {}: stored {:#010x}, computed {computed:#010x})",
                f.stream, stream.crc32
            )));
        }
        let needed = f.images.iter().map(|slot| slot.offset.saturating_add(slot.size)).max().unwrap_or(0);
        let blob = decompress(compressed, stream.uncompressed_size, needed)
            .map_err(|p| err(format!("decompression failed for functional {fname} (stream {}): {p}", f.stream)))?;

        let mut images = Vec::with_capacity(f.kernels.len());
        for (kernel, slot) in f.kernels.iter().zip(&f.images) {
            let image = usize::try_from(slot.offset)
                .ok()
                .and_then(|s| Some(s..s.checked_add(usize::try_from(slot.size).ok()?)?))
                .and_then(|r| blob.get(r))
                .ok_or_else(|| {
                    err(format!(
                        "image of kernel {} lies outside its stream",
                        kernel.id
                    ))
                })?;
            let computed = crc32fast::hash(image);
            if computed != slot.crc32 {
                return Err(err(format!(
                    "image checksum mismatch for kernel {} (stored {:#010x}, computed {computed:#010x})",
                    kernel.id, slot.crc32
                )));
            }
            images.push(image.to_vec());
        }
        Ok(images)
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

/// The fixed header, checked.
struct Header {
    version: u32,
    index_crc: u32,
    /// `HEADER_LEN` + index length: where the payload starts.
    payload_start: usize,
}

/// Checks the header (`head`: the file's first `HEADER_LEN` bytes, or all of a shorter file)
/// against the file's length `len`: magic, version, an index length within [`MAX_INDEX_LEN`]
/// that the file can hold, and a file no larger than the caps allow.
fn check_header(name: &str, head: &[u8], len: u64) -> Result<Header, ArchiveError> {
    let err = |problem: String| ArchiveError::new(name, problem);
    // Magic first, even on a short file: a short file that starts like an archive is
    // truncated, anything else is not an archive at all.
    let magic_len = head.len().min(MAGIC.len());
    if head[..magic_len] != MAGIC[..magic_len] {
        return Err(err("bad magic (not an aotriton archive)".into()));
    }
    // The version is checked before the rest of the header, so a future format with a
    // different header still gets the clearer message.
    if let Some(version) = read_u32(head, 8) {
        if version > FORMAT_VERSION {
            return Err(err(format!("format version {version} is newer than this runtime reads ({FORMAT_VERSION})")));
        }
        if version == 0 {
            return Err(err("format version 0 is not valid".into()));
        }
    }
    let (Some(version), Some(index_len), Some(index_crc)) = (read_u32(head, 8), read_u32(head, 12), read_u32(head, 16))
    else {
        return Err(err(format!("truncated: expected at least {HEADER_LEN} bytes, file has {len}")));
    };
    if index_len > MAX_INDEX_LEN {
        return Err(err(format!("index length {index_len} exceeds the limit of {MAX_INDEX_LEN} bytes")));
    }
    // Both terms are capped, so neither sum can overflow.
    let payload_start = HEADER_LEN + index_len as usize;
    if len < payload_start as u64 {
        return Err(err(format!("truncated: expected at least {payload_start} bytes, file has {len}")));
    }
    let largest = payload_start as u64 + MAX_PAYLOAD_SIZE;
    if len > largest {
        return Err(err(format!(
            "file of {len} bytes is larger than an archive can be ({largest} bytes with this index: payloads are at most {MAX_PAYLOAD_SIZE})"
        )));
    }
    Ok(Header { version, index_crc, payload_start })
}

/// Checks the index bytes (CRC, JSON, schema, layout, caps) and that header, index and payload
/// add up to exactly `len` bytes.
fn check_index(name: &str, header: &Header, index_bytes: &[u8], len: u64) -> Result<ParsedIndex, ArchiveError> {
    let err = |problem: String| ArchiveError::new(name, problem);
    let computed = crc32fast::hash(index_bytes);
    if computed != header.index_crc {
        return Err(err(format!("index checksum mismatch (stored {:#010x}, computed {computed:#010x})", header.index_crc)));
    }
    let json = index_json(header.version, index_bytes).map_err(|p| err(format!("index: {p}")))?;
    let index: Value = serde_json::from_slice(&json).map_err(|e| err(format!("index is not valid JSON: {e}")))?;
    let parsed = parse_index(&index, header.version).map_err(|p| err(format!("index: {p}")))?;
    // parse_index capped the payload, so this cannot overflow.
    let expected = header.payload_start as u64 + parsed.payload_size;
    if expected > len {
        return Err(err(format!("truncated: expected {expected} bytes, file has {len}")));
    }
    if expected < len {
        return Err(err(format!("trailing garbage: expected {expected} bytes, file has {len}")));
    }
    Ok(parsed)
}

/// The index JSON of a format-`version` archive from the index bytes as stored: from version 5
/// on one xz stream (decoded to at most [`MAX_INDEX_LEN`] bytes), before that the JSON itself.
pub fn index_json(version: u32, stored: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    if version < COMPRESSED_INDEX_VERSION {
        return Ok(Cow::Borrowed(stored));
    }
    let limit = format!("the limit of {MAX_INDEX_LEN} bytes");
    decode_xz(stored, (MAX_INDEX_LEN as usize, &limit), None).map(Cow::Owned)
}

/// Decodes an xz stream of `expected` bytes until its first `needed` bytes (or a few more) are
/// out. With `needed` >= `expected` that is the whole stream, which must then yield exactly
/// `expected` bytes and use all its input; a prefix stops early and relies on the stream's CRC
/// (checked by the caller over the compressed bytes) and the images' own. Returns the problem as
/// text; the caller adds which functional it was.
fn decompress(input: &[u8], expected: u64, needed: u64) -> Result<Vec<u8>, String> {
    let whole = needed >= expected;
    let expected = usize::try_from(expected).map_err(|_| format!("size {expected} too large"))?;
    let limit = format!("the {expected} bytes in the index");
    if !whole {
        // Below expected: fits.
        return decode_xz(input, (expected, &limit), Some(needed as usize));
    }
    let out = decode_xz(input, (expected, &limit), None)?;
    if out.len() != expected {
        return Err(format!(
            "decompressed to {} bytes, but the index says {expected}",
            out.len()
        ));
    }
    Ok(out)
}

/// Decodes the xz stream `input`, which may yield at most `limit` bytes (`limit_says` names
/// that limit in the error). With `prefix` it stops
/// once that many bytes (or a few more) are out; without, it decodes to the stream's end and
/// insists the stream uses all of `input`. The buffer grows with what the stream really yields
/// (starting at a generous guess from its compressed size), so a declared size the stream does
/// not back is never allocated whole.
fn decode_xz(input: &[u8], (limit, limit_says): (usize, &str), prefix: Option<usize>) -> Result<Vec<u8>, String> {
    // A whole stream gets room for one byte more than its limit, so an oversized stream shows
    // up as such instead of as "no progress".
    let capacity = match prefix {
        Some(needed) => needed,
        None => limit.checked_add(1).ok_or("size too large")?,
    };
    let mut out = Vec::new();
    let first = capacity.min(input.len().saturating_mul(8).max(1 << 16));
    out.try_reserve_exact(first)
        .map_err(|e| format!("cannot allocate {first} bytes: {e}"))?;
    // No CONCATENATED flag: one stream is exactly one xz stream.
    let mut stream = Stream::new_stream_decoder(DECODER_MEMLIMIT, 0).map_err(|e| e.to_string())?;
    let action = if prefix.is_some() { Action::Run } else { Action::Finish };
    loop {
        if out.len() == out.capacity() && out.capacity() < capacity {
            let more = out.capacity().min(capacity - out.capacity());
            out.try_reserve_exact(more)
                .map_err(|e| format!("cannot allocate {} bytes: {e}", out.capacity() + more))?;
        }
        let consumed = usize::try_from(stream.total_in()).map_err(|e| e.to_string())?;
        let rest = input.get(consumed..).ok_or("decoder overran its input")?;
        let before = (consumed, out.len());
        let status = stream
            .process_vec(rest, &mut out, action)
            .map_err(|e| e.to_string())?;
        if out.len() > limit {
            return Err(format!("stream decompresses to more than {limit_says}"));
        }
        if let Some(needed) = prefix
            && out.len() >= needed
        {
            return Ok(out);
        }
        if status == Status::StreamEnd {
            break;
        }
        let after = (
            usize::try_from(stream.total_in()).map_err(|e| e.to_string())?,
            out.len(),
        );
        if after == before {
            return Err("compressed stream ends early".into());
        }
    }
    if let Some(needed) = prefix {
        return Err(format!("stream ends after {} bytes, before the {needed} its images need", out.len()));
    }
    if stream.total_in() != input.len() as u64 {
        return Err(format!(
            "{} bytes after the end of the compressed stream",
            input.len() as u64 - stream.total_in().min(input.len() as u64)
        ));
    }
    Ok(out)
}

/// What a compressed blob holds, which picks its LZMA settings. The decoder reads the settings
/// from the stream itself, so they can change without a format version.
#[derive(Clone, Copy)]
enum Content {
    /// Kernel images: preset 9 with the literal and position contexts at the code's alignment
    /// ([`code_alignment_log2`]) and no literal context bits. On sm_90 this came out 4.2 %
    /// smaller than preset 9's (lc 3, lp 0, pb 2), on gfx942 1.7 %; the extreme preset and a
    /// longer match length gained nothing on code (sm_90: 0.3 % larger).
    MachineCode { alignment_log2: u32 },
    /// The index JSON: preset 9, extreme (sm_90's 803 KB index: 32.2 KB at preset 9, 28.8 KB
    /// extreme; the index is small enough that the slower search costs no build time).
    Json,
}

/// log2 of the machine-code alignment the LZMA coder's position contexts follow: NVIDIA SASS
/// instructions are 16 bytes, AMD CDNA ones 4 or 8 ((4, 4) made gfx942's 3 % larger).
fn code_alignment_log2(target: &serde_json::Value) -> u32 {
    if target.get("backend").and_then(|b| b.as_str()) == Some("cuda") { 4 } else { 2 }
}

/// Compresses one blob as a single xz stream with the settings for its [`Content`], the
/// dictionary shrunk to the input size (this changes no output byte, only the memory both sides
/// need).
fn compress(input: &[u8], content: Content) -> Result<Vec<u8>, String> {
    let preset = match content {
        Content::MachineCode { .. } => XZ_PRESET,
        Content::Json => XZ_PRESET | liblzma::stream::PRESET_EXTREME,
    };
    let mut opts = LzmaOptions::new_preset(preset).map_err(|e| e.to_string())?;
    let dict = u32::try_from(input.len())
        .unwrap_or(u32::MAX)
        .clamp(MIN_DICT_SIZE, MAX_DICT_SIZE);
    opts.dict_size(dict);
    if let Content::MachineCode { alignment_log2 } = content {
        opts.literal_context_bits(0).literal_position_bits(alignment_log2).position_bits(alignment_log2);
    }
    let mut filters = Filters::new();
    filters.lzma2(&opts);
    let mut stream =
        Stream::new_stream_encoder(&filters, Check::Crc64).map_err(|e| e.to_string())?;
    let mut out: Vec<u8> = Vec::with_capacity(input.len() / 2 + 4096);
    loop {
        let consumed = usize::try_from(stream.total_in()).map_err(|e| e.to_string())?;
        let rest = input.get(consumed..).ok_or("encoder overran its input")?;
        if out.len() == out.capacity() {
            out.reserve(out.capacity().max(4096));
        }
        match stream
            .process_vec(rest, &mut out, Action::Finish)
            .map_err(|e| e.to_string())?
        {
            Status::StreamEnd => return Ok(out),
            _ => continue,
        }
    }
}

struct ParsedIndex {
    arch: String,
    triton_version: String,
    target: Value,
    payload_size: u64,
    streams: Vec<StreamSlot>,
    functionals: Vec<Functional>,
}

// Field accessors for the index and the packer's JSON. Each returns the problem as text,
// naming the field; callers add where the object is.

fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a Value, String> {
    obj.get(key).ok_or_else(|| format!("missing field `{key}`"))
}
fn get_obj<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a Map<String, Value>, String> {
    field(obj, key)?
        .as_object()
        .ok_or_else(|| format!("field `{key}` must be an object"))
}
fn get_arr<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<&'a Vec<Value>, String> {
    field(obj, key)?
        .as_array()
        .ok_or_else(|| format!("field `{key}` must be an array"))
}
fn get_str(obj: &Map<String, Value>, key: &str) -> Result<String, String> {
    field(obj, key)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("field `{key}` must be a string"))
}
fn get_u64(obj: &Map<String, Value>, key: &str) -> Result<u64, String> {
    field(obj, key)?
        .as_u64()
        .ok_or_else(|| format!("field `{key}` must be a non-negative integer"))
}
fn get_u32(obj: &Map<String, Value>, key: &str) -> Result<u32, String> {
    field(obj, key)?
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("field `{key}` must be an unsigned 32-bit integer"))
}
fn as_obj<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} must be an object"))
}

/// The per-kernel metadata fields shared by the index and the compile driver's `<id>.json`.
/// A kernel's metadata. `arg_lists`: the index's shared argument lists (format version 4 on),
/// which `args` then indexes; None: `args` is the list itself (older versions, and the compile
/// driver's per-kernel JSON).
fn kernel_meta_from_json(k: &Map<String, Value>, arg_lists: Option<&[Vec<KernelArg>]>) -> Result<KernelMeta, String> {
    let mut config = BTreeMap::new();
    for (key, v) in get_obj(k, "config")? {
        let v = v
            .as_i64()
            .ok_or_else(|| format!("config `{key}` must be an integer"))?;
        config.insert(key.clone(), v);
    }
    let args = match arg_lists {
        None => args_from_json(get_arr(k, "args")?)?,
        Some(lists) => {
            let i = get_u64(k, "args").map_err(|_| "field `args` must be an index into `arg_lists`".to_string())?;
            usize::try_from(i)
                .ok()
                .and_then(|i| lists.get(i))
                .cloned()
                .ok_or_else(|| format!("field `args` {i} is past the {} entries of `arg_lists`", lists.len()))?
        }
    };
    Ok(KernelMeta {
        id: get_str(k, "id")?,
        symbol: get_str(k, "symbol")?,
        variant: get_str(k, "variant")?,
        config,
        args,
        shared: get_u32(k, "shared")?,
        num_warps: get_u32(k, "num_warps")?,
        warp_size: get_u32(k, "warp_size")?,
        num_ctas: get_u32(k, "num_ctas")?,
        global_scratch_size: get_u32(k, "global_scratch_size")?,
        global_scratch_align: get_u32(k, "global_scratch_align")?,
        profile_scratch_size: get_u32(k, "profile_scratch_size")?,
        profile_scratch_align: get_u32(k, "profile_scratch_align")?,
        tuned_for: match k.get("tuned_for") {
            None => Vec::new(),
            Some(v) => tuned_cells_from_json(v).map_err(|p| format!("tuned_for: {p}"))?,
        },
        tuned_only: match k.get("tuned_only") {
            None => false,
            Some(v) => v.as_bool().ok_or("field `tuned_only` must be a bool")?,
        },
        portable_for: match k.get("portable_for") {
            None => Vec::new(),
            Some(v) => tuned_cells_from_json(v).map_err(|p| format!("portable_for: {p}"))?,
        },
    })
}

/// One argument list (`[{"name", "type", "divisibility", "tensordesc"?}, ...]`).
fn args_from_json(list: &[Value]) -> Result<Vec<KernelArg>, String> {
    let mut args = Vec::new();
    for (i, a) in list.iter().enumerate() {
        let a = as_obj(a, &format!("args[{i}]"))?;
        let arg = (|| -> Result<KernelArg, String> {
            let ty = get_str(a, "type")?;
            let tensordesc = match a.get("tensordesc") {
                None if ty.starts_with("tensordesc") => {
                    return Err(format!("type {ty} needs a `tensordesc` object (block_size, swizzle, elem_type, elem_size)"));
                }
                None => None,
                Some(d) => {
                    if !ty.starts_with("tensordesc") {
                        return Err(format!("has a `tensordesc` object but type {ty}"));
                    }
                    Some(tensordesc_from_json(as_obj(d, "field `tensordesc`")?).map_err(|p| format!("tensordesc: {p}"))?)
                }
            };
            Ok(KernelArg {
                name: get_str(a, "name")?,
                ty,
                divisibility: get_u32(a, "divisibility")?,
                tensordesc,
            })
        })()
        .map_err(|p| format!("args[{i}]: {p}"))?;
        args.push(arg);
    }
    Ok(args)
}

fn tuned_cells_from_json(v: &Value) -> Result<Vec<TunedCell>, String> {
    let bin = |c: &Map<String, Value>, key: &str| -> Result<LengthBin, String> {
        let pair = get_arr(c, key)?;
        let lo = pair.first().and_then(Value::as_u64);
        let hi = pair.get(1).map(|h| if h.is_null() { Ok(None) } else { h.as_u64().map(Some).ok_or(()) });
        match (pair.len(), lo, hi) {
            (2, Some(lo), Some(Ok(hi))) if hi.is_none_or(|hi| hi > lo) => Ok(LengthBin { lo, hi }),
            _ => Err(format!("`{key}` must be [lo, hi] with integers lo < hi (hi null: unbounded)")),
        }
    };
    let cells = v.as_array().ok_or("must be an array")?;
    let mut out = Vec::with_capacity(cells.len());
    for (i, c) in cells.iter().enumerate() {
        let c = as_obj(c, &format!("[{i}]"))?;
        let cell = (|| -> Result<TunedCell, String> {
            let mask = match get_str(c, "mask")?.as_str() {
                "none" => MaskKind::None,
                "causal" => MaskKind::Causal,
                other => return Err(format!("mask `{other}` is not `none` or `causal`")),
            };
            Ok(TunedCell { mask, seqlen_q: bin(c, "seqlen_q")?, seqlen_k: bin(c, "seqlen_k")? })
        })()
        .map_err(|p| format!("[{i}]: {p}"))?;
        out.push(cell);
    }
    Ok(out)
}

fn tuned_cells_to_json(cells: &[TunedCell]) -> Value {
    let bin = |b: &LengthBin| json!([b.lo, b.hi]);
    Value::Array(
        cells
            .iter()
            .map(|c| {
                let mask = match c.mask {
                    MaskKind::None => "none",
                    MaskKind::Causal => "causal",
                };
                json!({"mask": mask, "seqlen_q": bin(&c.seqlen_q), "seqlen_k": bin(&c.seqlen_k)})
            })
            .collect(),
    )
}

fn tensordesc_from_json(d: &Map<String, Value>) -> Result<TensorDescMeta, String> {
    let mut block_size = Vec::new();
    for (i, v) in get_arr(d, "block_size")?.iter().enumerate() {
        let v = v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|v| (1..=256).contains(v))
            .ok_or_else(|| format!("block_size[{i}] must be an integer in 1..=256 (a TMA box dimension)"))?;
        block_size.push(v);
    }
    if block_size.is_empty() || block_size.len() > MAX_TENSORDESC_RANK {
        return Err(format!(
            "block_size has {} dimensions; a TMA descriptor has 1..={MAX_TENSORDESC_RANK}",
            block_size.len()
        ));
    }
    let swizzle = get_u32(d, "swizzle")?;
    if swizzle > 3 {
        return Err(format!("swizzle {swizzle} is not 0..3"));
    }
    let elem_size = get_u32(d, "elem_size")?;
    if ![1, 2, 4, 8].contains(&elem_size) {
        return Err(format!("elem_size {elem_size} is not 1, 2, 4 or 8"));
    }
    let fp4_padded = match d.get("fp4_padded") {
        None => false,
        Some(v) => v.as_bool().ok_or("field `fp4_padded` must be a bool")?,
    };
    Ok(TensorDescMeta {
        block_size,
        swizzle,
        elem_type: get_u32(d, "elem_type")?,
        elem_size,
        fp4_padded,
    })
}

/// A kernel's metadata; `args`: its argument list's index in `arg_lists` (see [`args_to_json`]).
fn kernel_meta_to_json(m: &KernelMeta, args: usize) -> Map<String, Value> {
    let mut k = Map::new();
    k.insert("id".into(), json!(m.id));
    k.insert("symbol".into(), json!(m.symbol));
    k.insert("variant".into(), json!(m.variant));
    k.insert("config".into(), json!(m.config));
    k.insert("args".into(), json!(args));
    k.insert("shared".into(), json!(m.shared));
    k.insert("num_warps".into(), json!(m.num_warps));
    k.insert("warp_size".into(), json!(m.warp_size));
    k.insert("num_ctas".into(), json!(m.num_ctas));
    k.insert("global_scratch_size".into(), json!(m.global_scratch_size));
    k.insert("global_scratch_align".into(), json!(m.global_scratch_align));
    k.insert("profile_scratch_size".into(), json!(m.profile_scratch_size));
    k.insert(
        "profile_scratch_align".into(),
        json!(m.profile_scratch_align),
    );
    if !m.tuned_for.is_empty() {
        k.insert("tuned_for".into(), tuned_cells_to_json(&m.tuned_for));
    }
    if m.tuned_only {
        k.insert("tuned_only".into(), json!(true));
    }
    if !m.portable_for.is_empty() {
        k.insert("portable_for".into(), tuned_cells_to_json(&m.portable_for));
    }
    k
}

/// One argument list, as `arg_lists` holds it.
fn args_to_json(list: &[KernelArg]) -> Value {
    let args: Vec<Value> = list
        .iter()
        .map(|a| {
            let mut v = json!({"name": a.name, "type": a.ty, "divisibility": a.divisibility});
            if let Some(d) = &a.tensordesc {
                v["tensordesc"] = json!({
                    "block_size": d.block_size,
                    "swizzle": d.swizzle,
                    "elem_type": d.elem_type,
                    "elem_size": d.elem_size,
                    "fp4_padded": d.fp4_padded,
                });
            }
            v
        })
        .collect();
    Value::Array(args)
}

/// The oldest format version that can hold these kernels (see "Versions").
fn version_needed<'a>(kernels: impl IntoIterator<Item = &'a KernelMeta>) -> u32 {
    kernels
        .into_iter()
        .map(|k| {
            if !k.tuned_for.is_empty() || k.tuned_only || !k.portable_for.is_empty() {
                TUNED_VERSION
            } else if k.args.iter().any(|a| a.tensordesc.is_some()) {
                TENSORDESC_VERSION
            } else {
                MIN_FORMAT_VERSION
            }
        })
        .max()
        .unwrap_or(MIN_FORMAT_VERSION)
}

/// Checks the index schema and layout. Errors are relative to the index ("missing field ...").
/// `header_version` is the (already range-checked) version of the file header.
fn parse_index(index: &Value, header_version: u32) -> Result<ParsedIndex, String> {
    let top = as_obj(index, "the index")?;
    let version = get_u64(top, "format_version")?;
    if version != header_version as u64 {
        return Err(format!(
            "format_version {version} differs from the header's {header_version}"
        ));
    }
    let arch = get_str(top, "arch")?;
    let triton_version = get_str(top, "triton_version")?;
    let target = get_obj(top, "target")?.clone();
    let payload_size = get_u64(top, "payload_size")?;
    if payload_size > MAX_PAYLOAD_SIZE {
        return Err(format!("payload_size {payload_size} exceeds the limit of {MAX_PAYLOAD_SIZE} bytes"));
    }

    // Version 4 on: the argument lists, each kernel's `args` an index into them.
    let arg_lists = match shared_table(top, "arg_lists", header_version)? {
        None => None,
        Some(lists) => Some(
            lists
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let l = l.as_array().ok_or_else(|| format!("arg_lists[{i}] must be an array"))?;
                    args_from_json(l).map_err(|p| format!("arg_lists[{i}]: {p}"))
                })
                .collect::<Result<Vec<_>, String>>()?,
        ),
    };
    let mut lists_used = vec![false; arg_lists.as_ref().map_or(0, Vec::len)];
    // Streams must follow each other with no gap or overlap, and fill the payload exactly.
    // Version 4 lists them once (`streams`); before, each functional's entry held its own.
    let shared_streams = header_version >= SHARED_VERSION;
    let mut streams: Vec<StreamSlot> = Vec::new();
    let mut next_offset = 0u64;
    for (si, sv) in shared_table(top, "streams", header_version)?.into_iter().flatten().enumerate() {
        let at = |p: String| format!("streams[{si}]: {p}");
        let so = as_obj(sv, "stream").map_err(at)?;
        streams.push(stream_from_json(so, &mut next_offset, payload_size).map_err(at)?);
    }
    // Per stream, the bytes its functionals' images (in index order) cover so far.
    let mut covered = vec![0u64; streams.len()];
    let mut functionals: Vec<Functional> = Vec::new();
    let mut ids = BTreeSet::new();
    for (fi, fv) in get_arr(top, "functionals")?.iter().enumerate() {
        let at = |p: String| format!("functionals[{fi}]: {p}");
        let fo = as_obj(fv, "functional").map_err(at)?;
        let family = get_str(fo, "family").map_err(at)?;
        let mut axes = BTreeMap::new();
        for (k, v) in get_obj(fo, "axes").map_err(at)? {
            let v = v
                .as_str()
                .ok_or_else(|| at(format!("axis `{k}` must be a string")))?;
            axes.insert(k.clone(), v.to_string());
        }
        let name = functional_name(&family, &axes);
        let at = |p: String| format!("functional {name}: {p}");
        let stream = if shared_streams {
            let i = get_u64(fo, "stream").map_err(at)?;
            usize::try_from(i)
                .ok()
                .filter(|&i| i < streams.len())
                .ok_or_else(|| at(format!("stream {i} is past the {} entries of `streams`", streams.len())))?
        } else {
            streams.push(stream_from_json(fo, &mut next_offset, payload_size).map_err(at)?);
            covered.push(0);
            streams.len() - 1
        };
        let uncompressed_size = streams[stream].uncompressed_size;
        if let Some(prev) = functionals.last()
            && (prev.family.as_str(), &prev.axes) >= (family.as_str(), &axes)
        {
            return Err(at(format!(
                "out of order or duplicate after {} (functionals are sorted)",
                prev.display_name()
            )));
        }

        let mut kernels = Vec::new();
        let mut images = Vec::new();
        let mut next_image = covered[stream];
        for (ki, kv) in get_arr(fo, "kernels").map_err(at)?.iter().enumerate() {
            let at = |p: String| at(format!("kernels[{ki}]: {p}"));
            let ko = as_obj(kv, "kernel").map_err(at)?;
            let meta = kernel_meta_from_json(ko, arg_lists.as_deref()).map_err(at)?;
            if let Some(i) = ko.get("args").and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok())
                && let Some(used) = lists_used.get_mut(i)
            {
                *used = true;
            }
            let needs = version_needed([&meta]);
            if needs > header_version {
                let what = if needs == TUNED_VERSION {
                    "tuning metadata (tuned_for, tuned_only, portable_for)"
                } else {
                    "tensordesc arguments"
                };
                return Err(at(format!(
                    "kernel {} has {what}, which need format version {needs} (file says {header_version})",
                    meta.id
                )));
            }
            let slot = ImageSlot {
                offset: get_u64(ko, "image_offset").map_err(at)?,
                size: get_u64(ko, "image_size").map_err(at)?,
                crc32: get_u32(ko, "image_crc32").map_err(at)?,
            };
            if slot.offset != next_image {
                return Err(at(format!(
                    "image_offset {} should be {next_image} (images are contiguous)",
                    slot.offset
                )));
            }
            next_image = next_image
                .checked_add(slot.size)
                .filter(|end| *end <= uncompressed_size)
                .ok_or_else(|| {
                    at(format!(
                        "image runs past its stream's uncompressed_size {uncompressed_size}"
                    ))
                })?;
            if let Some(prev) = kernels.last().map(|k: &KernelMeta| &k.id)
                && *prev >= meta.id
            {
                return Err(at(format!(
                    "kernel {} is out of order after {prev} (kernels are sorted by id)",
                    meta.id
                )));
            }
            if !ids.insert(meta.id.clone()) {
                return Err(at(format!("duplicate kernel id {}", meta.id)));
            }
            kernels.push(meta);
            images.push(slot);
        }
        covered[stream] = next_image;
        if !shared_streams && next_image != uncompressed_size {
            return Err(at(format!(
                "images cover {next_image} bytes but uncompressed_size is {uncompressed_size}"
            )));
        }
        functionals.push(Functional {
            family,
            axes,
            kernels,
            stream,
            images,
        });
    }
    if next_offset != payload_size {
        return Err(format!(
            "streams cover {next_offset} bytes but payload_size is {payload_size}"
        ));
    }
    for (i, (slot, covered)) in streams.iter().zip(&covered).enumerate() {
        if *covered != slot.uncompressed_size {
            return Err(format!(
                "streams[{i}]: its functionals' images cover {covered} bytes but uncompressed_size is {}",
                slot.uncompressed_size
            ));
        }
    }
    if let Some(unused) = lists_used.iter().position(|used| !used) {
        return Err(format!("arg_lists[{unused}] is used by no kernel"));
    }
    Ok(ParsedIndex {
        arch,
        triton_version,
        target: Value::Object(target),
        payload_size,
        streams,
        functionals,
    })
}

/// A version-4 table of the index (`arg_lists`, `streams`): required from version 4 on, refused
/// before it (None then).
fn shared_table<'a>(top: &'a Map<String, Value>, key: &str, header_version: u32) -> Result<Option<&'a Vec<Value>>, String> {
    match (top.get(key), header_version >= SHARED_VERSION) {
        (Some(table), true) => table.as_array().map(Some).ok_or_else(|| format!("field `{key}` must be an array")),
        (None, true) => Err(format!("missing field `{key}`")),
        (Some(_), false) => Err(format!("field `{key}` needs format version {SHARED_VERSION} (file says {header_version})")),
        (None, false) => Ok(None),
    }
}

/// Position of `item` in `table`, appended first if absent: the writer's shared tables (argument
/// lists, streams) number entries in the order of their first use.
fn intern<T: PartialEq>(table: &mut Vec<T>, item: T) -> usize {
    match table.iter().position(|x| *x == item) {
        Some(i) => i,
        None => {
            table.push(item);
            table.len() - 1
        }
    }
}

/// A stream's placement (`offset`, `compressed_size`, `uncompressed_size`, `crc32`: a
/// version-4 `streams` entry, or an older functional's entry), checked against the size caps and
/// the end of the previous stream (`next_offset`, advanced past this one).
fn stream_from_json(o: &Map<String, Value>, next_offset: &mut u64, payload_size: u64) -> Result<StreamSlot, String> {
    let offset = get_u64(o, "offset")?;
    let compressed_size = get_u64(o, "compressed_size")?;
    let uncompressed_size = get_u64(o, "uncompressed_size")?;
    let crc32 = get_u32(o, "crc32")?;
    // The decoder's output buffer grows to this size, so it is bounded by an absolute cap and
    // by what the stream can plausibly hold.
    if uncompressed_size > MAX_UNCOMPRESSED_SIZE {
        return Err(format!("uncompressed_size {uncompressed_size} exceeds the limit of {MAX_UNCOMPRESSED_SIZE} bytes"));
    }
    if uncompressed_size > compressed_size.saturating_mul(MAX_COMPRESSION_RATIO) {
        return Err(format!(
            "uncompressed_size {uncompressed_size} is more than {MAX_COMPRESSION_RATIO} times its compressed size {compressed_size}"
        ));
    }
    if offset != *next_offset {
        return Err(format!("offset {offset} should be {next_offset} (streams are contiguous)"));
    }
    *next_offset = offset
        .checked_add(compressed_size)
        .filter(|end| *end <= payload_size)
        .ok_or_else(|| format!("compressed bytes run past payload_size {payload_size}"))?;
    Ok(StreamSlot { offset, compressed_size, uncompressed_size, crc32 })
}

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

/// (family, axes).
type FunctionalKey = (String, BTreeMap<String, String>);

/// Collects kernels and writes an archive. Output depends only on what was added, not on the
/// order it was added in.
pub struct ArchiveWriter {
    arch: String,
    triton_version: String,
    target: Value,
    /// (family, axes) → id → (meta, image). BTreeMaps give the archive's sort order for free.
    functionals: BTreeMap<FunctionalKey, BTreeMap<String, (KernelMeta, Vec<u8>)>>,
}

impl ArchiveWriter {
    /// An empty archive for `arch`'s kernels, compiled by Triton `triton_version` for `target`
    /// (the manifest's `backend`, `arch`, `warp_size` and optional `features`).
    pub fn new(arch: &str, triton_version: &str, target: Value) -> Self {
        ArchiveWriter {
            arch: arch.to_string(),
            triton_version: triton_version.to_string(),
            target,
            functionals: BTreeMap::new(),
        }
    }

    fn err_name(&self) -> String {
        format!("(new archive for {})", self.arch)
    }

    /// Adds one kernel of functional (`family`, `axes`). Kernel ids are unique in an archive.
    pub fn add(
        &mut self,
        family: &str,
        axes: &[(&str, &str)],
        meta: KernelMeta,
        image: Vec<u8>,
    ) -> Result<(), ArchiveError> {
        let err = |p: String| ArchiveError::new(self.err_name(), p);
        let mut axis_map = BTreeMap::new();
        for (k, v) in axes {
            if axis_map.insert(k.to_string(), v.to_string()).is_some() {
                return Err(err(format!("kernel {}: axis `{k}` given twice", meta.id)));
            }
        }
        if self
            .functionals
            .values()
            .any(|ks| ks.contains_key(&meta.id))
        {
            return Err(err(format!("duplicate kernel id {}", meta.id)));
        }
        self.functionals
            .entry((family.to_string(), axis_map))
            .or_default()
            .insert(meta.id.clone(), (meta, image));
        Ok(())
    }

    /// The complete archive file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ArchiveError> {
        let err = |p: String| ArchiveError::new(self.err_name(), p);
        // The reader requires an object; refuse to write what could not be read back.
        if !self.target.is_object() {
            return Err(err(format!(
                "target must be a JSON object, not {}",
                self.target
            )));
        }

        // Streams: the functionals with the same stream_key share one, numbered in the order of
        // their first functional; inside a stream, functionals in index order and their kernels
        // by id.
        let mut stream_keys: Vec<FunctionalKey> = Vec::new();
        let mut stream_of = Vec::with_capacity(self.functionals.len());
        for (family, axes) in self.functionals.keys() {
            stream_of.push(intern(&mut stream_keys, stream_key(family, axes)));
        }
        let mut blobs: Vec<Vec<u8>> = vec![Vec::new(); stream_keys.len()];
        let mut image_offsets: Vec<Vec<u64>> = Vec::with_capacity(self.functionals.len());
        for (kernels, &stream) in self.functionals.values().zip(&stream_of) {
            let blob = &mut blobs[stream];
            image_offsets.push(
                kernels
                    .values()
                    .map(|(_, image)| {
                        let at = blob.len() as u64;
                        blob.extend_from_slice(image);
                        at
                    })
                    .collect(),
            );
        }
        // Compression dominates packing time and each stream is independent, so compress them on
        // all cores; the result is the same whatever the thread count.
        let code = Content::MachineCode { alignment_log2: code_alignment_log2(&self.target) };
        let compressed = parallel_map(&blobs, |b| compress(b, code)).map_err(err)?;
        let mut stream_entries = Vec::with_capacity(blobs.len());
        let mut offset = 0u64;
        for (i, (blob, packed)) in blobs.iter().zip(&compressed).enumerate() {
            let packed = packed.as_ref().map_err(|e| {
                let (family, axes) = &stream_keys[i];
                err(format!("compressing stream {i} ({}): {e}", functional_name(family, axes)))
            })?;
            stream_entries.push(json!({
                "offset": offset,
                "compressed_size": packed.len() as u64,
                "uncompressed_size": blob.len() as u64,
                "crc32": crc32fast::hash(packed),
            }));
            offset += packed.len() as u64;
        }

        // Kernels share argument lists: a handful of distinct lists (per family and variant)
        // serve hundreds of kernels, in the order of their first use.
        let mut arg_lists: Vec<&[KernelArg]> = Vec::new();
        let mut entries = Vec::new();
        for ((((family, axes), kernels), &stream), offsets) in
            self.functionals.iter().zip(&stream_of).zip(&image_offsets)
        {
            let mut kentries = Vec::new();
            for ((meta, image), image_offset) in kernels.values().zip(offsets) {
                let mut k = kernel_meta_to_json(meta, intern(&mut arg_lists, meta.args.as_slice()));
                k.insert("image_offset".into(), json!(image_offset));
                k.insert("image_size".into(), json!(image.len() as u64));
                k.insert("image_crc32".into(), json!(crc32fast::hash(image)));
                kentries.push(Value::Object(k));
            }
            entries.push(json!({
                "family": family,
                "axes": axes,
                "stream": stream,
                "kernels": kentries,
            }));
        }
        let version = version_needed(
            self.functionals
                .values()
                .flat_map(|ks| ks.values().map(|(meta, _)| meta)),
        )
        .max(COMPRESSED_INDEX_VERSION);
        let index = json!({
            "format_version": version,
            "arch": self.arch,
            "triton_version": self.triton_version,
            "target": self.target,
            "payload_size": offset,
            "arg_lists": arg_lists.iter().map(|l| args_to_json(l)).collect::<Vec<_>>(),
            "streams": stream_entries,
            "functionals": entries,
        });
        let index =
            serde_json::to_vec(&index).map_err(|e| err(format!("cannot encode index: {e}")))?;
        let index = compress(&index, Content::Json).map_err(|e| err(format!("compressing the index: {e}")))?;
        let index_len = u32::try_from(index.len()).map_err(|_| {
            err(format!(
                "index of {} bytes does not fit the header",
                index.len()
            ))
        })?;

        let mut out = Vec::with_capacity(HEADER_LEN + index.len() + offset as usize);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&index_len.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&index).to_le_bytes());
        out.extend_from_slice(&index);
        for packed in compressed.iter().flatten() {
            out.extend_from_slice(packed);
        }
        Ok(out)
    }

    /// Writes the archive to `path` atomically: a temporary file beside it, then a rename, so a
    /// reader (or an interrupted build) never sees a half-written archive.
    pub fn write(&self, path: &Path) -> Result<(), ArchiveError> {
        let bytes = self
            .to_bytes()
            .map_err(|e| ArchiveError::new(path.display().to_string(), e.problem))?;
        write_atomic(path, &bytes)
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ArchiveError> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);

    let err = |p: String| ArchiveError::new(path.display().to_string(), p);
    let file_name = path
        .file_name()
        .ok_or_else(|| err("output path has no file name".into()))?
        .to_string_lossy();
    // Unique per process and per call, so concurrent writers never share a temporary.
    let tmp_name = format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let tmp = path.with_file_name(tmp_name);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(format!("cannot write: {e}")));
    }
    Ok(())
}

/// `f` over `items` on up to all cores, results in input order.
fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Result<Vec<R>, String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        for w in workers {
            let done = w
                .join()
                .map_err(|_| "compression thread panicked".to_string())?;
            for (i, r) in done {
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(r);
                }
            }
        }
        Ok::<(), String>(())
    })?;
    results
        .into_iter()
        .map(|r| r.ok_or_else(|| "missing compression result".to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Packing a compile-driver output directory
// ---------------------------------------------------------------------------------------------

/// What [`pack_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// The arch of the packed kernels.
    pub arch: String,
    /// Functionals written.
    pub functionals: usize,
    /// Kernels written.
    pub kernels: usize,
    /// Total size of the images.
    pub raw_bytes: u64,
    /// Size of the archive file.
    pub archive_bytes: u64,
}

/// The packer: reads a compile-driver output dir and writes its archive. Checks every kernel's
/// arch and triton_version equal the manifest's, that files exist, that fields have the right
/// types, and that every file named (kernel JSON, image) lies inside `kernel_dir`; errors name
/// the file.
pub fn pack_dir(kernel_dir: &Path, out: &Path) -> Result<PackSummary, ArchiveError> {
    let manifest_path = kernel_dir.join("manifest.json");
    let manifest = read_json(&manifest_path)?;
    let merr = |p: String| ArchiveError::new(manifest_path.display().to_string(), p);
    let root = kernel_dir
        .canonicalize()
        .map_err(|e| ArchiveError::new(kernel_dir.display().to_string(), format!("cannot resolve: {e}")))?;
    let m = as_obj(&manifest, "the manifest").map_err(merr)?;
    let arch = get_str(m, "arch").map_err(merr)?;
    let triton_version = get_str(m, "triton_version").map_err(merr)?;
    let target = get_obj(m, "target").map_err(merr)?.clone();
    let listed = get_arr(m, "kernels").map_err(merr)?;
    if listed.is_empty() {
        return Err(merr("lists no kernels".into()));
    }

    let mut writer = ArchiveWriter::new(&arch, &triton_version, Value::Object(target));
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut raw_bytes = 0u64;
    for (i, entry) in listed.iter().enumerate() {
        let rel = entry.as_str().ok_or_else(|| {
            merr(format!(
                "kernels[{i}] must be a string (a kernel JSON file name)"
            ))
        })?;
        let json_path = inside(&root, kernel_dir, Path::new(rel)).map_err(|p| merr(format!("kernels[{i}]: {p}")))?;
        let kerr = |p: String| ArchiveError::new(json_path.display().to_string(), p);
        let kv = read_json(&json_path)?;
        let k = as_obj(&kv, "a kernel file").map_err(kerr)?;

        let meta = kernel_meta_from_json(k, None).map_err(kerr)?;
        let family = get_str(k, "family").map_err(kerr)?;
        for (key, want) in [("arch", &arch), ("triton_version", &triton_version)] {
            let got = get_str(k, key).map_err(kerr)?;
            if &got != want {
                return Err(kerr(format!(
                    "{key} is {got:?} but the manifest says {want:?}"
                )));
            }
        }
        // Not stored (they are fixed by the axes and the config and compiled into the image),
        // but a kernel file without them is malformed.
        get_obj(k, "constexprs").map_err(kerr)?;
        let mut axes = Vec::new();
        for (key, v) in get_obj(k, "functional").map_err(kerr)? {
            let v = canonical_axis_value(v).ok_or_else(|| {
                kerr(format!(
                    "functional axis `{key}` must be a bool, integer or string, not {v}"
                ))
            })?;
            axes.push((key.clone(), v));
        }
        let image_name = get_str(k, "image").map_err(kerr)?;
        // Images sit beside their JSON.
        let json_dir = json_path.parent().unwrap_or(kernel_dir);
        let image_path = inside(&root, json_dir, Path::new(&image_name)).map_err(|p| kerr(format!("image: {p}")))?;
        let image = std::fs::read(&image_path).map_err(|e| {
            kerr(format!(
                "cannot read image file {}: {e}",
                image_path.display()
            ))
        })?;
        if image.is_empty() {
            return Err(kerr(format!(
                "image file {} is empty",
                image_path.display()
            )));
        }
        if let Some(first) = seen.get(&meta.id) {
            return Err(kerr(format!(
                "duplicate kernel id {} (also in {})",
                meta.id,
                first.display()
            )));
        }
        seen.insert(meta.id.clone(), json_path.clone());
        raw_bytes += image.len() as u64;
        let axes_ref: Vec<(&str, &str)> =
            axes.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        writer
            .add(&family, &axes_ref, meta, image)
            .map_err(|e| kerr(e.problem))?;
    }

    writer.write(out)?;
    let archive_bytes = std::fs::metadata(out)
        .map_err(|e| ArchiveError::new(out.display().to_string(), format!("cannot stat: {e}")))?
        .len();
    Ok(PackSummary {
        arch,
        functionals: writer.functionals.len(),
        kernels: seen.len(),
        raw_bytes,
        archive_bytes,
    })
}

/// `base/rel`, refused when it leaves the kernel directory (canonical path `root`): `rel` must be
/// relative without `..`, and the file it names, once symlinks are resolved, must lie under
/// `root`. A file that does not exist is left for the caller's read to report.
fn inside(root: &Path, base: &Path, rel: &Path) -> Result<PathBuf, String> {
    use std::path::Component;
    if !rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(format!(
            "{} leaves the kernel directory (names must be relative, without `..`)",
            rel.display()
        ));
    }
    let path = base.join(rel);
    if let Ok(real) = path.canonicalize()
        && !real.starts_with(root)
    {
        return Err(format!(
            "{} resolves outside the kernel directory {} (to {})",
            rel.display(),
            root.display(),
            real.display()
        ));
    }
    Ok(path)
}

fn read_json(path: &Path) -> Result<Value, ArchiveError> {
    let err = |p: String| ArchiveError::new(path.display().to_string(), p);
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
    serde_json::from_slice(&bytes).map_err(|e| err(format!("not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let path = std::env::temp_dir().join(format!(
                "aotriton-archive-test-{}-{tag}-{}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Random-ish bytes with some repetition, like a real image: compressible, but not trivially.
    fn fake_image(seed: &str, len: usize) -> Vec<u8> {
        let mut x = crc32fast::hash(seed.as_bytes()) as u64 | 1;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(4) {
                out.extend_from_slice(b"\x7fELF.nv.shared.attn_fwd");
            } else {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out.truncate(len);
        out
    }

    struct Spec {
        family: &'static str,
        dtype: &'static str,
        head_dim: i64,
        causal: bool,
        cfg: (i64, i64, i64, i64),
        variant: &'static str,
    }

    impl Spec {
        fn id(&self) -> String {
            let (m, n, w, s) = self.cfg;
            format!(
                "{}-{}-hd{}-causal{}-m{m}n{n}w{w}s{s}-{}",
                self.family, self.dtype, self.head_dim, self.causal as u8, self.variant
            )
        }
        fn json(&self, arch: &str) -> Value {
            let (m, n, w, s) = self.cfg;
            let id = self.id();
            json!({
                "id": id,
                "family": self.family,
                "functional": {"dtype": self.dtype, "head_dim": self.head_dim, "causal": self.causal},
                "config": {"BLOCK_M": m, "BLOCK_N": n, "num_warps": w, "num_stages": s},
                "variant": self.variant,
                "arch": arch,
                "triton_version": "3.6.0",
                "symbol": self.family,
                "image": format!("{id}.cubin"),
                "args": [{"name": "Q", "type": format!("*{}", self.dtype), "divisibility": 16},
                         {"name": "sm_scale", "type": "fp32", "divisibility": 1}],
                "constexprs": {"HEAD_DIM": self.head_dim, "BLOCK_M": m, "BLOCK_N": n, "CAUSAL": self.causal},
                "shared": 1024 * m, "num_warps": w, "warp_size": 32, "num_ctas": 1,
                "global_scratch_size": 0, "global_scratch_align": 1,
                "profile_scratch_size": 0, "profile_scratch_align": 1
            })
        }
        fn image(&self) -> Vec<u8> {
            let id = self.id();
            fake_image(&id, 2000 + (crc32fast::hash(id.as_bytes()) % 3000) as usize)
        }
    }

    /// 3 functionals, 9 kernels.
    fn specs() -> Vec<Spec> {
        let mut v = Vec::new();
        for (head_dim, causal) in [(64, false), (128, true)] {
            for cfg in [(128, 64, 4, 2), (64, 64, 4, 3)] {
                for variant in ["aligned", "unaligned"] {
                    v.push(Spec {
                        family: "attn_fwd",
                        dtype: "fp16",
                        head_dim,
                        causal,
                        cfg,
                        variant,
                    });
                }
            }
        }
        v.push(Spec {
            family: "attn_bwd",
            dtype: "bf16",
            head_dim: 64,
            causal: false,
            cfg: (64, 64, 8, 1),
            variant: "aligned",
        });
        v
    }

    /// Writes a compile-driver output dir for `specs`, returns the kernel JSON values by id.
    fn write_dir(dir: &Path, specs: &[Spec]) -> BTreeMap<String, Value> {
        let mut listed = Vec::new();
        let mut by_id = BTreeMap::new();
        // Listed in reverse so the packer's sorting is exercised.
        for s in specs.iter().rev() {
            let id = s.id();
            let j = s.json("sm_90");
            std::fs::write(
                dir.join(format!("{id}.json")),
                serde_json::to_vec_pretty(&j).unwrap(),
            )
            .unwrap();
            std::fs::write(dir.join(format!("{id}.cubin")), s.image()).unwrap();
            listed.push(format!("{id}.json"));
            by_id.insert(id, j);
        }
        let manifest = json!({
            "arch": "sm_90", "triton_version": "3.6.0",
            "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
            "kernels": listed,
        });
        std::fs::write(
            dir.join("manifest.json"),
            serde_json::to_vec_pretty(&manifest).unwrap(),
        )
        .unwrap();
        by_id
    }

    /// Packs the standard specs; returns (temp dir guard, archive path).
    fn packed(tag: &str) -> (TempDir, PathBuf) {
        let t = TempDir::new(tag);
        let kdir = t.0.join("kernels");
        std::fs::create_dir(&kdir).unwrap();
        write_dir(&kdir, &specs());
        let out = t.0.join("aotriton-sm_90.images");
        pack_dir(&kdir, &out).unwrap();
        (t, out)
    }

    fn archive_bytes(tag: &str) -> Vec<u8> {
        let (_t, out) = packed(tag);
        std::fs::read(out).unwrap()
    }

    fn parse(bytes: Vec<u8>) -> Result<Archive, ArchiveError> {
        Archive::parse("test.images", Cow::Owned(bytes))
    }

    /// Parsing must fail with a problem containing `want`, naming the file.
    fn parse_err(bytes: Vec<u8>, want: &str) -> ArchiveError {
        let e = parse(bytes).expect_err("parse should fail");
        assert_eq!(e.file, "test.images");
        assert!(
            e.problem.contains(want),
            "problem {:?} should contain {want:?}",
            e.problem
        );
        e
    }

    fn index_len(bytes: &[u8]) -> usize {
        read_u32(bytes, 12).unwrap() as usize
    }

    /// The index JSON of `bytes` (decompressed from version 5 on).
    fn index_of(bytes: &[u8]) -> Value {
        let version = read_u32(bytes, 8).unwrap();
        serde_json::from_slice(&index_json(version, &bytes[HEADER_LEN..HEADER_LEN + index_len(bytes)]).unwrap()).unwrap()
    }

    /// Replaces the stored index with `stored` (any bytes) and a matching length and CRC.
    fn with_stored_index(bytes: &[u8], stored: &[u8]) -> Vec<u8> {
        let payload = &bytes[HEADER_LEN + index_len(bytes)..];
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(&bytes[8..12]);
        out.extend_from_slice(&(stored.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(stored).to_le_bytes());
        out.extend_from_slice(stored);
        out.extend_from_slice(payload);
        out
    }

    /// `json` (any bytes) as a format-`version` archive stores its index.
    fn stored_as(version: u32, json: &[u8]) -> Vec<u8> {
        if version < COMPRESSED_INDEX_VERSION { json.to_vec() } else { compress(json, Content::Json).unwrap() }
    }

    /// Replaces the index with `json` (any bytes), stored as the header's version stores it.
    fn with_raw_index(bytes: &[u8], json: &[u8]) -> Vec<u8> {
        with_stored_index(bytes, &stored_as(read_u32(bytes, 8).unwrap(), json))
    }

    /// `bytes` with the index edited by `edit` and the header saying `version` (the index
    /// stored as that version stores it; `edit` sets the index's own `format_version`).
    fn restamped(bytes: &[u8], version: u32, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut index = index_of(bytes);
        edit(&mut index);
        let mut out = with_stored_index(bytes, &stored_as(version, &serde_json::to_vec(&index).unwrap()));
        out[8..12].copy_from_slice(&version.to_le_bytes());
        out
    }

    /// Edits the index JSON, keeping the header consistent, so only the edit is wrong.
    fn with_index(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
        let mut index = index_of(bytes);
        edit(&mut index);
        with_raw_index(bytes, &serde_json::to_vec(&index).unwrap())
    }

    /// The argument list kernel `k` of functional `f` uses (shared: an edit reaches every kernel
    /// that shares it).
    fn args_of(v: &mut Value, f: usize, k: usize) -> &mut Value {
        let list = v["functionals"][f]["kernels"][k]["args"].as_u64().unwrap() as usize;
        &mut v["arg_lists"][list]
    }

    /// Rewrites a version-4 index as an older writer would have: each kernel's argument list
    /// inline, no `arg_lists`; each functional's stream in its own entry, no `streams` (every
    /// stream must hold one functional); sets `format_version` (the caller sets the header's).
    fn inline_args(v: &mut Value, version: u32) {
        let top = v.as_object_mut().unwrap();
        let lists = top.remove("arg_lists").unwrap();
        let streams = top.remove("streams").unwrap();
        let mut seen = BTreeSet::new();
        for f in v["functionals"].as_array_mut().unwrap() {
            for k in f["kernels"].as_array_mut().unwrap() {
                k["args"] = lists[k["args"].as_u64().unwrap() as usize].clone();
            }
            let stream = f.as_object_mut().unwrap().remove("stream").unwrap().as_u64().unwrap() as usize;
            assert!(seen.insert(stream), "stream {stream} holds more than one functional");
            for (key, value) in streams[stream].as_object().unwrap() {
                f[key] = value.clone();
            }
        }
        v["format_version"] = json!(version);
    }

    /// `bytes` as version `version` with inline argument lists and streams (see [`inline_args`]).
    fn as_version(bytes: &[u8], version: u32) -> Vec<u8> {
        restamped(bytes, version, |v| inline_args(v, version))
    }

    fn fwd_axes(head_dim: &'static str, causal: &'static str) -> [(&'static str, &'static str); 3] {
        [
            ("dtype", "fp16"),
            ("head_dim", head_dim),
            ("causal", causal),
        ]
    }

    #[test]
    fn round_trip() {
        let t = TempDir::new("roundtrip");
        let specs = specs();
        let jsons = write_dir(&t.0, &specs);
        let out = t.0.join("aotriton-sm_90.images");
        let summary = pack_dir(&t.0, &out).unwrap();
        let raw: u64 = specs.iter().map(|s| s.image().len() as u64).sum();
        assert_eq!(
            summary,
            PackSummary {
                arch: "sm_90".into(),
                functionals: 3,
                kernels: 9,
                raw_bytes: raw,
                archive_bytes: std::fs::metadata(&out).unwrap().len(),
            }
        );

        let a = Archive::open(&out).unwrap();
        assert_eq!(a.name(), out.display().to_string());
        assert_eq!(a.arch(), "sm_90");
        assert_eq!(a.triton_version(), "3.6.0");
        assert_eq!(
            a.target(),
            &json!({"backend": "cuda", "arch": 90, "warp_size": 32})
        );
        assert_eq!(a.functionals().len(), 3);
        // Sorted by (family, axes).
        let names: Vec<String> = a.functionals().iter().map(|f| f.display_name()).collect();
        assert_eq!(
            names,
            [
                "attn_bwd{causal=false,dtype=bf16,head_dim=64}",
                "attn_fwd{causal=false,dtype=fp16,head_dim=64}",
                "attn_fwd{causal=true,dtype=fp16,head_dim=128}",
            ]
        );

        for s in &specs {
            let (hd, causal) = (s.head_dim.to_string(), s.causal.to_string());
            let axes = [
                ("dtype", s.dtype),
                ("head_dim", hd.as_str()),
                ("causal", causal.as_str()),
            ];
            let fi = a.find(s.family, &axes).expect("functional found");
            let f = &a.functionals()[fi];
            let ki = f
                .kernels
                .iter()
                .position(|k| k.id == s.id())
                .expect("kernel present");
            let images = a.load_images(fi).unwrap();
            assert_eq!(images.len(), f.kernels.len());
            assert_eq!(images[ki], s.image());
            assert_eq!(f.image_size(ki), Some(s.image().len() as u64));

            let j = jsons[&s.id()].as_object().unwrap();
            let want = kernel_meta_from_json(j, None).unwrap();
            assert_eq!(f.kernels[ki], want);
            let k = &f.kernels[ki];
            assert_eq!(k.config["BLOCK_M"], s.cfg.0);
            assert_eq!(k.config["num_stages"], s.cfg.3);
            assert_eq!(k.shared as i64, 1024 * s.cfg.0);
            assert_eq!(k.variant, s.variant);
            assert_eq!(k.symbol, s.family);
            assert_eq!(
                k.args[0],
                KernelArg {
                    name: "Q".into(),
                    ty: format!("*{}", s.dtype),
                    divisibility: 16,
                    tensordesc: None,
                }
            );
        }
        // Kernels sorted by id within a functional.
        for f in a.functionals() {
            assert!(f.kernels.windows(2).all(|w| w[0].id < w[1].id));
        }
    }

    #[test]
    fn find_requires_exact_axes() {
        let (_t, out) = packed("find");
        let a = Archive::open(&out).unwrap();
        assert!(a.find("attn_fwd", &fwd_axes("64", "false")).is_some());
        // Order of the query does not matter.
        assert_eq!(
            a.find(
                "attn_fwd",
                &[("causal", "false"), ("head_dim", "64"), ("dtype", "fp16")]
            ),
            a.find("attn_fwd", &fwd_axes("64", "false"))
        );
        assert_eq!(a.find("attn_fwd", &fwd_axes("64", "true")), None);
        assert_eq!(a.find("attn_fwd", &fwd_axes("96", "false")), None);
        assert_eq!(a.find("attn_bwd", &fwd_axes("64", "false")), None);
        assert_eq!(a.find("nope", &fwd_axes("64", "false")), None);
        // Missing key, extra key, repeated key.
        assert_eq!(
            a.find("attn_fwd", &[("dtype", "fp16"), ("head_dim", "64")]),
            None
        );
        let mut extra = fwd_axes("64", "false").to_vec();
        extra.push(("dropout", "false"));
        assert_eq!(a.find("attn_fwd", &extra), None);
        assert_eq!(
            a.find(
                "attn_fwd",
                &[("dtype", "fp16"), ("head_dim", "64"), ("head_dim", "64")]
            ),
            None
        );
        // Non-canonical spelling does not match.
        assert_eq!(a.find("attn_fwd", &fwd_axes("64", "False")), None);
        assert_eq!(a.find("attn_fwd", &fwd_axes("064", "false")), None);
    }

    #[test]
    fn canonical_axis_values() {
        assert_eq!(canonical_axis_value(&json!(true)).as_deref(), Some("true"));
        assert_eq!(
            canonical_axis_value(&json!(false)).as_deref(),
            Some("false")
        );
        assert_eq!(canonical_axis_value(&json!(64)).as_deref(), Some("64"));
        assert_eq!(canonical_axis_value(&json!(-3)).as_deref(), Some("-3"));
        assert_eq!(
            canonical_axis_value(&json!(u64::MAX)),
            Some(u64::MAX.to_string())
        );
        assert_eq!(
            canonical_axis_value(&json!("fp16")).as_deref(),
            Some("fp16")
        );
        assert_eq!(canonical_axis_value(&json!(1.5)), None);
        assert_eq!(canonical_axis_value(&Value::Null), None);
        assert_eq!(canonical_axis_value(&json!([1])), None);
        assert_eq!(canonical_axis_value(&json!({"a": 1})), None);
    }

    #[test]
    fn packing_is_deterministic() {
        let a = archive_bytes("det-a");
        let b = archive_bytes("det-b");
        assert!(a == b, "two packs of the same input differ");

        // Insertion order into the writer does not matter either.
        let build = |rev: bool| {
            let mut w = ArchiveWriter::new("sm_90", "3.6.0", json!({"backend": "cuda"}));
            let mut specs = specs();
            if rev {
                specs.reverse();
            }
            for s in &specs {
                let meta = kernel_meta_from_json(s.json("sm_90").as_object().unwrap(), None).unwrap();
                let (hd, causal) = (s.head_dim.to_string(), s.causal.to_string());
                let axes = [
                    ("dtype", s.dtype),
                    ("head_dim", hd.as_str()),
                    ("causal", causal.as_str()),
                ];
                w.add(s.family, &axes, meta, s.image()).unwrap();
            }
            w.to_bytes().unwrap()
        };
        assert!(build(false) == build(true));
    }

    #[test]
    fn corrupt_functional_does_not_affect_others() {
        let bytes = archive_bytes("lazy");
        let a = parse(bytes.clone()).unwrap();
        let b_index = a.find("attn_fwd", &fwd_axes("128", "true")).unwrap();
        let f = &a.functionals()[b_index];
        let stream = a.streams[f.stream];
        let at = a.payload_start + stream.offset as usize + stream.compressed_size as usize / 2;
        let mut bad = bytes;
        bad[at] ^= 0x40;
        let a = parse(bad).expect("the index is intact, so parse succeeds");
        for (i, f) in a.functionals().iter().enumerate() {
            if i == b_index {
                let e = a.load_images(i).unwrap_err();
                assert_eq!(e.file, "test.images");
                assert!(
                    e.problem.starts_with(
                        "checksum mismatch in functional attn_fwd{causal=true,dtype=fp16,head_dim=128}"
                    ),
                    "{e}"
                );
            } else {
                assert_eq!(a.load_images(i).unwrap().len(), f.kernels.len());
            }
        }
        assert!(a.load_images(99).is_err());
    }

    #[test]
    fn bad_magic() {
        let mut bytes = archive_bytes("magic");
        bytes[0] = b'X';
        let e = parse_err(bytes, "bad magic (not an aotriton archive)");
        assert_eq!(
            e.to_string(),
            "kernel archive test.images: bad magic (not an aotriton archive)"
        );
        parse_err(b"hello".to_vec(), "bad magic");
        parse_err(
            b"\x7fELF\x02\x01\x01\0 some other file entirely".to_vec(),
            "bad magic",
        );
    }

    fn desc_meta() -> TensorDescMeta {
        TensorDescMeta {
            block_size: vec![1, 1, 64, 64],
            swizzle: 3,
            elem_type: 10,
            elem_size: 2,
            fp4_padded: false,
        }
    }

    fn gluon_meta(id: &str) -> KernelMeta {
        let mut config = BTreeMap::new();
        for (k, v) in [("BLOCK_M", 128), ("BLOCK_N", 128), ("STAGES", 2), ("num_warps", 4), ("maxnreg", 168)] {
            config.insert(k.to_string(), v);
        }
        let args = vec![
            KernelArg {
                name: "desc_q".into(),
                ty: "tensordesc<bf16[1, 1, 64, 128],NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4, transposed=False, fp4_padded=False, cga_layout=[])>".into(),
                divisibility: 1,
                tensordesc: Some(desc_meta()),
            },
            KernelArg { name: "sm_scale".into(), ty: "fp32".into(), divisibility: 1, tensordesc: None },
        ];
        KernelMeta {
            symbol: "attn_fwd_gluon".into(),
            config,
            shared: 200_000,
            ..KernelMeta::for_tests(id, args, 12)
        }
    }

    fn plain_meta(id: &str) -> KernelMeta {
        KernelMeta {
            args: vec![KernelArg { name: "Q".into(), ty: "*bf16".into(), divisibility: 16, tensordesc: None }],
            num_warps: 4,
            ..gluon_meta(id)
        }
    }

    fn written(metas: Vec<KernelMeta>) -> Vec<u8> {
        let mut w = ArchiveWriter::new("sm_90", "3.6.0", json!({"backend": "cuda", "arch": 90, "warp_size": 32}));
        for (i, m) in metas.into_iter().enumerate() {
            w.add("attn_fwd_gluon", &[("dtype", "bf16"), ("head_dim", "128")], m, fake_image(&i.to_string(), 100))
                .unwrap();
        }
        w.to_bytes().unwrap()
    }

    #[test]
    fn tensordesc_metadata_round_trips_as_version_2() {
        let bytes = written(vec![gluon_meta("g"), plain_meta("p")]);
        assert_eq!(read_u32(&bytes, 8), Some(COMPRESSED_INDEX_VERSION), "the writer writes version 5 on");
        let a = parse(bytes.clone()).unwrap();
        let f = &a.functionals()[a.find("attn_fwd_gluon", &[("head_dim", "128"), ("dtype", "bf16")]).unwrap()];
        let g = f.kernels.iter().find(|k| k.id == "g").unwrap();
        assert_eq!(*g, gluon_meta("g"));
        assert_eq!(g.args[0].tensordesc.as_ref().unwrap().rank(), 4);
        assert_eq!(g.config["maxnreg"], 168);
        assert_eq!(g.num_warps, 12);
        assert_eq!(f.kernels.iter().find(|k| k.id == "p").unwrap().args[0].tensordesc, None);
        // The same content written inline as version 2 reads the same (older writers' files).
        let v2 = parse(as_version(&bytes, 2)).unwrap();
        assert_eq!(v2.functionals()[0].kernels, a.functionals()[0].kernels);
    }

    #[test]
    fn tensordesc_from_compile_driver_json_packs() {
        let t = TempDir::new("tensordesc");
        let mut s = specs();
        s.truncate(1);
        let jsons = write_dir(&t.0, &s);
        let path = kernel_json_path(&t, 0);
        edit_json(&path, |v| {
            v["args"][0] = json!({"name": "desc_q", "type": "tensordesc<fp16[1, 1, 64, 64],NVMMASharedLayout(...)>",
                                  "divisibility": 1,
                                  "tensordesc": {"block_size": [1, 1, 64, 64], "swizzle": 3, "elem_type": 6,
                                                 "elem_size": 2, "fp4_padded": false}});
            v["config"]["maxnreg"] = json!(168);
        });
        drop(jsons);
        let out = t.0.join("out.images");
        pack_dir(&t.0, &out).unwrap();
        let a = Archive::open(&out).unwrap();
        let arg = &a.functionals()[0].kernels[0].args[0];
        assert_eq!(arg.tensordesc.as_ref().unwrap().elem_type, 6);
        assert_eq!(a.functionals()[0].kernels[0].config["maxnreg"], 168);
    }

    #[test]
    fn bad_tensordesc_metadata_is_refused() {
        let bytes = written(vec![gluon_meta("g")]);
        type Edit = fn(&mut Value);
        let cases: [(Edit, &str); 7] = [
            (|v| v["block_size"] = json!([]), "block_size has 0 dimensions"),
            (|v| v["block_size"] = json!([1, 1, 1, 1, 1, 1]), "block_size has 6 dimensions"),
            (|v| v["block_size"] = json!([1, 512]), "block_size[1] must be an integer in 1..=256"),
            (|v| v["swizzle"] = json!(4), "swizzle 4 is not 0..3"),
            (|v| v["elem_size"] = json!(3), "elem_size 3"),
            (|v| drop(v.as_object_mut().unwrap().remove("elem_type")), "tensordesc: missing field `elem_type`"),
            (|v| v["fp4_padded"] = json!(1), "`fp4_padded` must be a bool"),
        ];
        for (edit, want) in cases {
            parse_err(
                with_index(&bytes, |v| edit(&mut args_of(v, 0, 0)[0]["tensordesc"])),
                want,
            );
        }
        parse_err(
            with_index(&bytes, |v| drop(args_of(v, 0, 0)[0].as_object_mut().unwrap().remove("tensordesc"))),
            "needs a `tensordesc` object",
        );
        parse_err(
            with_index(&bytes, |v| args_of(v, 0, 0)[0]["type"] = json!("*bf16")),
            "has a `tensordesc` object but type *bf16",
        );
        // A version-1 file cannot carry descriptors: refused, not half-read.
        parse_err(as_version(&bytes, 1), "need format version 2 (file says 1)");
    }

    #[test]
    fn functionals_differing_in_dtype_share_a_stream() {
        let mut w = ArchiveWriter::new("sm_90", "3.6.0", json!({"backend": "cuda", "arch": 90, "warp_size": 32}));
        // fp16 and bf16 of head_dim 128 share stream 0; head_dim 64 has stream 1.
        for (id, dtype, head_dim) in [("a", "fp16", "128"), ("b", "bf16", "128"), ("c", "bf16", "64")] {
            w.add("attn_fwd", &[("dtype", dtype), ("head_dim", head_dim)], plain_meta(id), fake_image(id, 3000)).unwrap();
        }
        let bytes = w.to_bytes().unwrap();
        let a = parse(bytes.clone()).unwrap();
        assert_eq!(a.stream_count(), 2);
        let stream = |dtype, head_dim| a.functionals()[a.find("attn_fwd", &[("dtype", dtype), ("head_dim", head_dim)]).unwrap()].stream();
        assert_eq!((stream("fp16", "128"), stream("bf16", "128"), stream("bf16", "64")), (0, 0, 1));
        assert_eq!(a.stream_sizes(0).unwrap().1, 6000);
        for i in 0..3 {
            let id = &a.functionals()[i].kernels[0].id;
            assert_eq!(a.load_images(i).unwrap(), [fake_image(id, 3000)], "functional {i}");
        }
        // Index order: (bf16, 128) = stream 0 from byte 0, (bf16, 64) = stream 1, (fp16, 128) =
        // stream 0 from byte 3000.
        let f = |v: &mut Value, i: usize| v["functionals"][i].clone();
        parse_err(with_index(&bytes, |v| v["functionals"][2]["stream"] = json!(2)),
                  "stream 2 is past the 2 entries of `streams`");
        parse_err(with_index(&bytes, |v| v["functionals"][2]["kernels"][0]["image_offset"] = json!(0)),
                  "image_offset 0 should be 3000 (images are contiguous)");
        parse_err(with_index(&bytes, |v| v["functionals"][2]["stream"] = json!(1)),
                  "kernels[0]: image runs past its stream's uncompressed_size 3000");
        parse_err(with_index(&bytes, |v| { let g = f(v, 0); v["functionals"][1]["kernels"] = g["kernels"].clone(); }),
                  "duplicate kernel id b");
        parse_err(with_index(&bytes, |v| drop(v.as_object_mut().unwrap().remove("streams"))), "missing field `streams`");
        parse_err(with_index(&bytes, |v| v["streams"][1]["uncompressed_size"] = json!(3001)),
                  "streams[1]: its functionals' images cover 3000 bytes but uncompressed_size is 3001");
        let v3 = restamped(&bytes, 3, |v| v["format_version"] = json!(3));
        parse_err(v3, "needs format version 4 (file says 3)");
        // A damaged shared stream fails both of its functionals, not the other one.
        let mut bad = bytes.clone();
        let at = a.payload_start + a.streams[0].offset as usize + 20;
        bad[at] ^= 0x10;
        let b = parse(bad).unwrap();
        assert!(b.load_images(0).is_err() && b.load_images(2).is_err() && b.load_images(1).is_ok());
    }

    #[test]
    fn argument_lists_are_shared_and_checked() {
        // Kernels g and h share one list, p has its own: two lists, in the order of first use.
        let bytes = written(vec![gluon_meta("g"), gluon_meta("h"), plain_meta("p")]);
        let index = index_of(&bytes);
        assert_eq!(index["arg_lists"].as_array().unwrap().len(), 2);
        let uses: Vec<_> = index["functionals"][0]["kernels"].as_array().unwrap().iter().map(|k| k["args"].clone()).collect();
        assert_eq!(uses, [json!(0), json!(0), json!(1)]);
        let a = parse(bytes.clone()).unwrap();
        assert_eq!(a.functionals()[0].kernels[1], gluon_meta("h"));
        assert_eq!(a.functionals()[0].kernels[2], plain_meta("p"));

        parse_err(with_index(&bytes, |v| v["functionals"][0]["kernels"][2]["args"] = json!(2)),
                  "kernels[2]: field `args` 2 is past the 2 entries of `arg_lists`");
        parse_err(with_index(&bytes, |v| v["functionals"][0]["kernels"][1]["args"] = json!([])),
                  "kernels[1]: field `args` must be an index into `arg_lists`");
        parse_err(with_index(&bytes, |v| v["functionals"][0]["kernels"][2]["args"] = json!(0)),
                  "arg_lists[1] is used by no kernel");
        parse_err(with_index(&bytes, |v| drop(v.as_object_mut().unwrap().remove("arg_lists"))),
                  "missing field `arg_lists`");
        parse_err(with_index(&bytes, |v| v["arg_lists"][1] = json!({})), "arg_lists[1] must be an array");
        // Before version 4 lists are inline, and a shared table is refused.
        let v3 = restamped(&bytes, 3, |v| v["format_version"] = json!(3));
        parse_err(v3, "field `arg_lists` needs format version 4 (file says 3)");
        parse_err(with_index(&as_version(&bytes, 3), |v| v["functionals"][0]["kernels"][0]["args"] = json!(0)),
                  "kernels[0]: field `args` must be an array");
    }

    #[test]
    fn tuning_metadata_round_trips_as_version_3_and_is_checked() {
        let mut tuned = plain_meta("t");
        tuned.tuned_for = vec![
            TunedCell {
                mask: MaskKind::Causal,
                seqlen_q: LengthBin { lo: 512, hi: Some(2048) },
                seqlen_k: LengthBin { lo: 8192, hi: None },
            },
            TunedCell {
                mask: MaskKind::None,
                seqlen_q: LengthBin { lo: 0, hi: Some(512) },
                seqlen_k: LengthBin { lo: 0, hi: Some(512) },
            },
        ];
        let mut only = plain_meta("u");
        only.tuned_only = true;
        only.portable_for = vec![tuned.tuned_for[1]];
        let bytes = written(vec![tuned.clone(), only.clone(), plain_meta("p")]);
        assert_eq!(read_u32(&bytes, 8), Some(COMPRESSED_INDEX_VERSION), "the writer writes version 5 on");
        let a = parse(bytes.clone()).unwrap();
        let kernels = &a.functionals()[0].kernels;
        assert_eq!(kernels.iter().find(|k| k.id == "t").unwrap(), &tuned);
        assert_eq!(kernels.iter().find(|k| k.id == "u").unwrap(), &only);
        let cell = tuned.tuned_for[0];
        assert!(cell.contains(MaskKind::Causal, 512, 1 << 40) && cell.contains(MaskKind::Causal, 2047, 8192));
        assert!(!cell.contains(MaskKind::Causal, 2048, 8192) && !cell.contains(MaskKind::Causal, 600, 8191));
        assert!(!cell.contains(MaskKind::None, 600, 9000));
        // Written inline as version 3 it reads the same.
        assert_eq!(parse(as_version(&bytes, 3)).unwrap().functionals()[0].kernels, a.functionals()[0].kernels);

        // Kernels are sorted by id in the index: p, t, u.
        type Edit = fn(&mut Value);
        let cases: [(Edit, &str); 5] = [
            (|c| c["mask"] = json!("sliding"), "mask `sliding` is not `none` or `causal`"),
            (|c| c["seqlen_q"] = json!([512, 512]), "`seqlen_q` must be [lo, hi]"),
            (|c| c["seqlen_k"] = json!([512]), "`seqlen_k` must be [lo, hi]"),
            (|c| c["seqlen_k"] = json!([-1, 4]), "`seqlen_k` must be [lo, hi]"),
            (|c| drop(c.as_object_mut().unwrap().remove("mask")), "tuned_for: [0]: missing field `mask`"),
        ];
        for (edit, want) in cases {
            parse_err(with_index(&bytes, |v| edit(&mut v["functionals"][0]["kernels"][1]["tuned_for"][0])), want);
        }
        parse_err(
            with_index(&bytes, |v| v["functionals"][0]["kernels"][2]["tuned_only"] = json!(1)),
            "`tuned_only` must be a bool",
        );
        // A version-2 file cannot carry tuning metadata: refused, not half-read.
        parse_err(as_version(&bytes, 2), "need format version 3 (file says 2)");
    }

    #[test]
    fn the_index_is_stored_compressed_from_version_5() {
        let bytes = archive_bytes("index-xz");
        assert_eq!(read_u32(&bytes, 8), Some(COMPRESSED_INDEX_VERSION), "the writer writes version 5 on");
        let stored = &bytes[HEADER_LEN..HEADER_LEN + index_len(&bytes)];
        assert!(stored.starts_with(b"\xfd7zXZ\0"), "an xz stream");
        let json = index_json(COMPRESSED_INDEX_VERSION, stored).unwrap();
        assert!(json.len() > stored.len(), "{} bytes of JSON stored in {}", json.len(), stored.len());
        let a = parse(bytes.clone()).unwrap();
        // The same index stored as plain JSON under version 4 reads the same (older writers).
        let v4 = parse(restamped(&bytes, SHARED_VERSION, |v| v["format_version"] = json!(SHARED_VERSION))).unwrap();
        assert_eq!(format!("{:?}", v4.functionals()), format!("{:?}", a.functionals()));
        for f in 0..a.functionals().len() {
            assert_eq!(v4.load_images(f).unwrap(), a.load_images(f).unwrap());
        }
        // Plain JSON under version 5, a cut stream, a damaged one: refused as the index's problem
        // (the CRC fixed up each time, so the decoder meets the damage).
        let e = parse_err(with_stored_index(&bytes, &json), "index: ");
        assert!(!e.problem.contains("JSON"), "{e}");
        parse_err(with_stored_index(&bytes, &stored[..stored.len() - 9]), "index: ");
        let mut damaged = stored.to_vec();
        let at = damaged.len() / 2;
        damaged[at] ^= 0x40;
        parse_err(with_stored_index(&bytes, &damaged), "index: ");
        // The index version and the header's must agree, whichever stores it.
        parse_err(restamped(&bytes, SHARED_VERSION, |_| {}), "format_version");
    }

    #[test]
    fn an_index_stream_may_not_exceed_its_limit() {
        let json = br#"{"format_version": 5, "pad": "0123456789abcdef0123456789abcdef"}"#;
        let packed = compress(json, Content::Json).unwrap();
        assert_eq!(decode_xz(&packed, (json.len(), "the limit"), None).unwrap(), json);
        let e = decode_xz(&packed, (json.len() - 1, "the limit of 41 bytes"), None).unwrap_err();
        assert_eq!(e, "stream decompresses to more than the limit of 41 bytes");
        let mut trailing = packed.clone();
        trailing.push(0);
        assert!(decode_xz(&trailing, (json.len(), "the limit"), None).unwrap_err().contains("after the end"));
    }

    #[test]
    fn newer_format_version() {
        let mut bytes = archive_bytes("version");
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        parse_err(
            bytes.clone(),
            "format version 7 is newer than this runtime reads (5)",
        );
        // Even when the rest of the header is missing.
        parse_err(bytes[..12].to_vec(), "format version 7 is newer");
        bytes[8..12].copy_from_slice(&0u32.to_le_bytes());
        parse_err(bytes, "format version 0 is not valid");
    }

    #[test]
    fn truncated() {
        let bytes = archive_bytes("trunc");
        let payload_start = HEADER_LEN + index_len(&bytes);
        let len = bytes.len();
        let cuts = [
            0,
            3,
            8,
            12,
            19,
            20,
            21,
            HEADER_LEN + index_len(&bytes) / 2,
            payload_start - 1,
            payload_start,
            payload_start + 1,
            (payload_start + len) / 2,
            len - 1,
        ];
        for cut in cuts {
            let e = parse_err(bytes[..cut].to_vec(), "truncated: expected ");
            assert!(
                e.problem.ends_with(&format!("file has {cut}")),
                "cut {cut}: {e}"
            );
            if cut < HEADER_LEN {
                assert!(e.problem.contains("at least 20 bytes"), "cut {cut}: {e}");
            } else if cut < payload_start {
                assert!(
                    e.problem
                        .contains(&format!("at least {payload_start} bytes")),
                    "{e}"
                );
            } else {
                assert!(
                    e.problem.contains(&format!("expected {len} bytes")),
                    "cut {cut}: {e}"
                );
            }
        }
    }

    #[test]
    fn trailing_garbage() {
        let mut bytes = archive_bytes("trailing");
        let len = bytes.len();
        bytes.extend_from_slice(b"junk");
        parse_err(
            bytes,
            &format!(
                "trailing garbage: expected {len} bytes, file has {}",
                len + 4
            ),
        );
    }

    #[test]
    fn flipped_index_byte() {
        let mut bytes = archive_bytes("flip-index");
        let at = HEADER_LEN + index_len(&bytes) / 3;
        bytes[at] ^= 0x01;
        parse_err(bytes.clone(), "index checksum mismatch");
        // The stored CRC itself damaged.
        bytes[at] ^= 0x01;
        bytes[17] ^= 0x10;
        parse_err(bytes, "index checksum mismatch");
    }

    #[test]
    fn flipped_blob_byte() {
        let bytes = archive_bytes("flip-blob");
        let a = parse(bytes.clone()).unwrap();
        for (i, f) in a.functionals().iter().enumerate() {
            let stream = a.streams[f.stream];
            for at in [0, stream.compressed_size as usize - 1] {
                let mut bad = bytes.clone();
                bad[a.payload_start + stream.offset as usize + at] ^= 0x80;
                let e = parse(bad).unwrap().load_images(i).unwrap_err();
                let want = format!("checksum mismatch in functional {}", f.display_name());
                assert!(e.problem.starts_with(&want), "{e}");
                assert_eq!(e.file, "test.images");
            }
        }
    }

    #[test]
    fn image_checksum_mismatch() {
        let bytes = archive_bytes("image-crc");
        let bad = with_index(&bytes, |v| {
            let k = &mut v["functionals"][1]["kernels"][2];
            k["image_crc32"] = json!(k["image_crc32"].as_u64().unwrap() ^ 1);
        });
        let a = parse(bad).unwrap();
        let id = a.functionals()[1].kernels[2].id.clone();
        assert!(a.load_images(0).is_ok());
        let e = a.load_images(1).unwrap_err();
        assert!(
            e.problem
                .starts_with(&format!("image checksum mismatch for kernel {id}")),
            "{e}"
        );
    }

    #[test]
    fn a_load_decodes_only_the_stream_prefix_it_needs() {
        let blob: Vec<u8> = (0..200_000u32).flat_map(|i| (i.wrapping_mul(2654435761) >> 7).to_le_bytes()).collect();
        let packed = compress(&blob, Content::MachineCode { alignment_log2: 4 }).unwrap();
        let total = blob.len() as u64;
        for needed in [1u64, 4096, 333_333, total - 1] {
            let got = decompress(&packed, total, needed).unwrap();
            assert!(got.len() as u64 >= needed && got.len() as u64 <= total, "{needed}: {} bytes", got.len());
            assert_eq!(got[..], blob[..got.len()], "{needed}: not the stream's prefix");
        }
        assert_eq!(decompress(&packed, total, total).unwrap(), blob);
        // A stream shorter than the index says, and a truncated one, fail as such.
        let e = decompress(&packed, total + 10, total + 5).unwrap_err();
        assert!(e.contains("ends after"), "{e}");
        let e = decompress(&packed[..packed.len() / 2], total, total - 1).unwrap_err();
        assert!(e.contains("ends early") || e.contains("ends after"), "{e}");
    }

    #[test]
    fn decompression_failure_and_size_mismatch() {
        let bytes = archive_bytes("lzma");
        let a = parse(bytes.clone()).unwrap();
        let f = &a.functionals()[0];
        let stream = a.streams[f.stream];
        let start = a.payload_start + stream.offset as usize;
        let end = start + stream.compressed_size as usize;

        // Damage the stream, then fix up its CRC so the damage reaches the decoder.
        let mut bad = bytes.clone();
        for b in &mut bad[start + 12..start + 40] {
            *b ^= 0x5a;
        }
        let crc = crc32fast::hash(&bad[start..end]);
        let bad = with_index(&bad, |v| v["streams"][0]["crc32"] = json!(crc));
        let e = parse(bad).unwrap().load_images(0).unwrap_err();
        let want = format!("decompression failed for functional {} (stream 0): ", f.display_name());
        assert!(e.problem.starts_with(&want), "{e}");

        // The index claims one byte more (and its last image one byte longer) than the stream holds.
        let n = f.kernels.len() - 1;
        let grow = |v: &mut Value, delta: i64| {
            let u = v["streams"][0]["uncompressed_size"].as_i64().unwrap() + delta;
            v["streams"][0]["uncompressed_size"] = json!(u);
            let fj = &mut v["functionals"][0];
            let s = fj["kernels"][n]["image_size"].as_i64().unwrap() + delta;
            fj["kernels"][n]["image_size"] = json!(s);
        };
        for delta in [1, -1] {
            let bad = with_index(&bytes, |v| grow(v, delta));
            let e = parse(bad).unwrap().load_images(0).unwrap_err();
            assert!(e.problem.starts_with(&want), "{e}");
            assert!(e.problem.contains("bytes"), "{e}");
        }
    }

    #[test]
    fn invalid_json_index() {
        let bytes = archive_bytes("json");
        parse_err(
            with_raw_index(&bytes, b"{\"format_version\": 1,"),
            "index is not valid JSON: ",
        );
        parse_err(
            with_raw_index(&bytes, b"\xff\xfe"),
            "index is not valid JSON: ",
        );
        parse_err(with_raw_index(&bytes, b""), "index is not valid JSON: ");
        parse_err(
            with_raw_index(&bytes, b"[1, 2]"),
            "the index must be an object",
        );
    }

    #[test]
    fn missing_or_wrong_index_fields() {
        let bytes = archive_bytes("fields");
        let cases: [(Edit, &str); 14] = [
            (
                |v| drop(v.as_object_mut().unwrap().remove("functionals")),
                "missing field `functionals`",
            ),
            (
                |v| drop(v.as_object_mut().unwrap().remove("arch")),
                "missing field `arch`",
            ),
            (
                |v| drop(v.as_object_mut().unwrap().remove("triton_version")),
                "missing field `triton_version`",
            ),
            (
                |v| drop(v.as_object_mut().unwrap().remove("payload_size")),
                "missing field `payload_size`",
            ),
            (
                |v| drop(v.as_object_mut().unwrap().remove("target")),
                "missing field `target`",
            ),
            (
                |v| v["format_version"] = json!(2),
                "format_version 2 differs",
            ),
            (|v| v["arch"] = json!(90), "field `arch` must be a string"),
            (
                |v| drop(v["streams"][1].as_object_mut().unwrap().remove("crc32")),
                "streams[1]: missing field `crc32`",
            ),
            (
                |v| {
                    drop(
                        v["functionals"][0]
                            .as_object_mut()
                            .unwrap()
                            .remove("family"),
                    )
                },
                "functionals[0]: missing field `family`",
            ),
            (
                |v| {
                    drop(
                        v["functionals"][2]["kernels"][1]
                            .as_object_mut()
                            .unwrap()
                            .remove("shared"),
                    )
                },
                "kernels[1]: missing field `shared`",
            ),
            (
                |v| {
                    drop(
                        args_of(v, 2, 0)[1]
                            .as_object_mut()
                            .unwrap()
                            .remove("name"),
                    )
                },
                "args[1]: missing field `name`",
            ),
            (
                |v| v["functionals"][1]["kernels"][0]["shared"] = json!(-1),
                "field `shared` must be an unsigned 32-bit",
            ),
            (
                |v| v["functionals"][1]["kernels"][0]["config"]["BLOCK_M"] = json!("x"),
                "config `BLOCK_M` must be an integer",
            ),
            (
                |v| v["functionals"][1]["axes"]["head_dim"] = json!(64),
                "axis `head_dim` must be a string",
            ),
        ];
        for (edit, want) in cases {
            parse_err(with_index(&bytes, edit), want);
        }
    }

    #[test]
    fn inconsistent_index_layout() {
        let bytes = archive_bytes("layout");
        let cases: [(Edit, &str); 8] = [
            (|v| v["payload_size"] = json!(u64::MAX), "payload_size"),
            (
                |v| v["streams"][1]["offset"] = json!(1u64 << 62),
                "offset",
            ),
            (
                |v| v["streams"][2]["compressed_size"] = json!(u64::MAX),
                "run past payload_size",
            ),
            (
                |v| v["functionals"][0]["kernels"][0]["image_size"] = json!(u64::MAX),
                "runs past its stream's uncompressed_size",
            ),
            (
                // One byte more than the images cover (u64::MAX is refused by the size cap).
                |v| {
                    let u = v["streams"][0]["uncompressed_size"].as_u64().unwrap();
                    v["streams"][0]["uncompressed_size"] = json!(u + 1)
                },
                "images cover",
            ),
            (
                |v| {
                    let fs = v["functionals"].as_array_mut().unwrap();
                    fs.swap(0, 1);
                },
                "out of order or duplicate",
            ),
            (
                |v| {
                    let k = v["functionals"][1]["kernels"][0].clone();
                    v["functionals"][2]["kernels"][0]["id"] = k["id"].clone();
                },
                "duplicate kernel id",
            ),
            (
                |v| {
                    let ks = v["functionals"][1]["kernels"].as_array_mut().unwrap();
                    let id0 = ks[0]["id"].clone();
                    ks[0]["id"] = ks[1]["id"].clone();
                    ks[1]["id"] = id0;
                },
                "out of order",
            ),
        ];
        for (edit, want) in cases {
            parse_err(with_index(&bytes, edit), want);
        }
    }

    /// Every single-bit flip anywhere in the file is caught (the CRCs cover every byte), and
    /// every truncation is rejected, without panicking.
    #[test]
    fn every_flip_and_cut_is_detected() {
        let t = TempDir::new("exhaustive");
        let specs: Vec<Spec> = specs()
            .into_iter()
            .filter(|s| s.variant == "aligned")
            .take(3)
            .collect();
        write_dir(&t.0, &specs);
        let out = t.0.join("small.images");
        pack_dir(&t.0, &out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                parse(bytes[..cut].to_vec()).is_err(),
                "cut at {cut} accepted"
            );
        }
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 1 << (at % 8);
            let detected = match parse(bad) {
                Err(_) => true,
                Ok(a) => (0..a.functionals().len()).any(|i| a.load_images(i).is_err()),
            };
            assert!(detected, "flip at byte {at} went unnoticed");
        }
    }

    #[test]
    fn writer_rejects_duplicates() {
        let s = &specs()[0];
        let meta = kernel_meta_from_json(s.json("sm_90").as_object().unwrap(), None).unwrap();
        let mut w = ArchiveWriter::new("sm_90", "3.6.0", json!({}));
        w.add(
            "attn_fwd",
            &[("dtype", "fp16")],
            meta.clone(),
            vec![1, 2, 3],
        )
        .unwrap();
        // Same id, even in another functional.
        let e = w
            .add("attn_bwd", &[("dtype", "fp16")], meta.clone(), vec![4])
            .unwrap_err();
        assert!(
            e.problem
                .contains(&format!("duplicate kernel id {}", meta.id)),
            "{e}"
        );
        let mut other = meta;
        other.id.push('x');
        let e = w
            .add(
                "attn_fwd",
                &[("dtype", "fp16"), ("dtype", "bf16")],
                other,
                vec![4],
            )
            .unwrap_err();
        assert!(e.problem.contains("axis `dtype` given twice"), "{e}");
    }

    #[test]
    fn writer_output_reads_back_and_writes_atomically() {
        let t = TempDir::new("writer");
        let mut w = ArchiveWriter::new(
            "gfx942",
            "3.6.0",
            json!({"backend": "hip", "arch": "gfx942", "warp_size": 64}),
        );
        let s = &specs()[0];
        let meta = kernel_meta_from_json(s.json("gfx942").as_object().unwrap(), None).unwrap();
        w.add(
            "attn_fwd",
            &fwd_axes("64", "false"),
            meta.clone(),
            s.image(),
        )
        .unwrap();
        let path = t.0.join("aotriton-gfx942.images");
        w.write(&path).unwrap();
        // Overwriting works and leaves no temporary behind.
        w.write(&path).unwrap();
        let names: Vec<_> = std::fs::read_dir(&t.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("aotriton-gfx942.images")]);
        let a = Archive::open(&path).unwrap();
        assert_eq!(a.arch(), "gfx942");
        assert_eq!(a.functionals()[0].kernels, [meta]);
        assert_eq!(a.load_images(0).unwrap(), [s.image()]);
        // An empty archive is valid too.
        let empty = ArchiveWriter::new("sm_80", "3.6.0", json!({}))
            .to_bytes()
            .unwrap();
        assert_eq!(parse(empty).unwrap().functionals().len(), 0);
        let e = ArchiveWriter::new("sm_80", "3.6.0", json!(90))
            .to_bytes()
            .unwrap_err();
        assert!(e.problem.contains("target must be a JSON object"), "{e}");
        // A write into a missing directory names the output.
        let bad = t.0.join("missing").join("x.images");
        let e = w.write(&bad).unwrap_err();
        assert_eq!(e.file, bad.display().to_string());
    }

    #[test]
    fn open_missing_file() {
        let path = std::env::temp_dir().join("aotriton-archive-test-does-not-exist.images");
        let e = Archive::open(&path).unwrap_err();
        assert_eq!(e.file, path.display().to_string());
        assert!(e.problem.starts_with("cannot read: "), "{e}");
    }

    /// Packs `t` after `edit` changed its files; the error must name `file` and contain `want`.
    fn pack_err(t: &TempDir, file: &Path, want: &str) {
        let e = pack_dir(&t.0, &t.0.join("out.images")).unwrap_err();
        assert_eq!(e.file, file.display().to_string(), "{e}");
        assert!(
            e.problem.contains(want),
            "problem {:?} should contain {want:?}",
            e.problem
        );
        assert!(!t.0.join("out.images").exists());
    }

    fn kernel_json_path(t: &TempDir, i: usize) -> PathBuf {
        t.0.join(format!("{}.json", specs()[i].id()))
    }

    fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
        let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
    }

    #[test]
    fn pack_missing_manifest() {
        let t = TempDir::new("no-manifest");
        pack_err(&t, &t.0.join("manifest.json"), "cannot read: ");
        std::fs::write(t.0.join("manifest.json"), b"{not json").unwrap();
        pack_err(&t, &t.0.join("manifest.json"), "not valid JSON: ");
        std::fs::write(t.0.join("manifest.json"), br#"{"arch": "sm_90"}"#).unwrap();
        pack_err(
            &t,
            &t.0.join("manifest.json"),
            "missing field `triton_version`",
        );
    }

    #[test]
    fn pack_arch_or_version_mismatch() {
        let t = TempDir::new("arch");
        write_dir(&t.0, &specs());
        let path = kernel_json_path(&t, 4);
        edit_json(&path, |v| v["arch"] = json!("sm_80"));
        pack_err(
            &t,
            &path,
            "arch is \"sm_80\" but the manifest says \"sm_90\"",
        );
        edit_json(&path, |v| {
            v["arch"] = json!("sm_90");
            v["triton_version"] = json!("3.5.0");
        });
        pack_err(
            &t,
            &path,
            "triton_version is \"3.5.0\" but the manifest says \"3.6.0\"",
        );
    }

    #[test]
    fn pack_missing_image() {
        let t = TempDir::new("no-image");
        write_dir(&t.0, &specs());
        let s = &specs()[2];
        let image = t.0.join(format!("{}.cubin", s.id()));
        std::fs::remove_file(&image).unwrap();
        pack_err(
            &t,
            &kernel_json_path(&t, 2),
            &format!("cannot read image file {}", image.display()),
        );
        std::fs::write(&image, b"").unwrap();
        pack_err(&t, &kernel_json_path(&t, 2), "is empty");
    }

    #[test]
    fn pack_missing_kernel_json() {
        let t = TempDir::new("no-json");
        write_dir(&t.0, &specs());
        let path = kernel_json_path(&t, 5);
        std::fs::remove_file(&path).unwrap();
        pack_err(&t, &path, "cannot read: ");
    }

    #[test]
    fn pack_duplicate_id() {
        let t = TempDir::new("dup");
        write_dir(&t.0, &specs());
        let first = kernel_json_path(&t, 0);
        let second = kernel_json_path(&t, 1);
        let id0 = specs()[0].id();
        edit_json(&second, |v| v["id"] = json!(id0));
        // The manifest lists kernels in reverse, so `second` (index 1) is read before `first`.
        let e = pack_dir(&t.0, &t.0.join("out.images")).unwrap_err();
        assert_eq!(e.file, first.display().to_string());
        assert!(
            e.problem.contains(&format!(
                "duplicate kernel id {id0} (also in {})",
                second.display()
            )),
            "{e}"
        );
    }

    type Edit = fn(&mut Value);

    #[test]
    fn pack_wrong_field_types() {
        let t = TempDir::new("types");
        write_dir(&t.0, &specs());
        let path = kernel_json_path(&t, 3);
        let cases: [(Edit, &str); 6] = [
            (
                |v| v["shared"] = json!("65536"),
                "field `shared` must be an unsigned 32-bit integer",
            ),
            (
                |v| v["num_warps"] = json!(4.5),
                "field `num_warps` must be an unsigned 32-bit integer",
            ),
            (
                |v| v["functional"]["head_dim"] = json!(64.5),
                "functional axis `head_dim` must be a bool, integer or string",
            ),
            (
                |v| v["args"][0]["divisibility"] = json!(null),
                "args[0]: field `divisibility`",
            ),
            (
                |v| drop(v.as_object_mut().unwrap().remove("constexprs")),
                "missing field `constexprs`",
            ),
            (
                |v| v["config"] = json!([1, 2]),
                "field `config` must be an object",
            ),
        ];
        let original = std::fs::read(&path).unwrap();
        for (edit, want) in cases {
            std::fs::write(&path, &original).unwrap();
            edit_json(&path, edit);
            pack_err(&t, &path, want);
        }
    }

    /// A kernel dir `kernels/` with the standard specs and, beside it, `outside/` holding a valid
    /// kernel JSON and image that the manifest must not be able to reach.
    fn dir_with_outside(tag: &str) -> (TempDir, PathBuf, PathBuf) {
        let t = TempDir::new(tag);
        let kdir = t.0.join("kernels");
        let outside = t.0.join("outside");
        std::fs::create_dir(&kdir).unwrap();
        std::fs::create_dir(&outside).unwrap();
        write_dir(&kdir, &specs());
        let s = &specs()[0];
        for ext in ["json", "cubin"] {
            std::fs::rename(kdir.join(format!("{}.{ext}", s.id())), outside.join(format!("{}.{ext}", s.id()))).unwrap();
        }
        (t, kdir, outside)
    }

    fn list_in_manifest(kdir: &Path, entry: &str) {
        let id = specs()[0].id();
        edit_json(&kdir.join("manifest.json"), |m| {
            for k in m["kernels"].as_array_mut().unwrap() {
                if k.as_str() == Some(&format!("{id}.json")) {
                    *k = json!(entry);
                }
            }
        });
    }

    #[test]
    fn pack_refuses_manifest_entries_outside_the_kernel_dir() {
        let id = specs()[0].id();
        let (t, kdir, outside) = dir_with_outside("contain-abs");
        let absolute = outside.join(format!("{id}.json"));
        list_in_manifest(&kdir, absolute.to_str().unwrap());
        let e = pack_dir(&kdir, &t.0.join("out.images")).unwrap_err();
        assert!(e.problem.contains("leaves the kernel directory") && e.problem.contains(&id), "{e}");

        let (t, kdir, _) = dir_with_outside("contain-dotdot");
        list_in_manifest(&kdir, &format!("../outside/{id}.json"));
        let e = pack_dir(&kdir, &t.0.join("out.images")).unwrap_err();
        assert!(e.problem.contains("leaves the kernel directory"), "{e}");

        // A symlink inside the kernel dir that points out of it.
        let (t, kdir, outside) = dir_with_outside("contain-link");
        std::os::unix::fs::symlink(outside.join(format!("{id}.json")), kdir.join(format!("{id}.json"))).unwrap();
        let e = pack_dir(&kdir, &t.0.join("out.images")).unwrap_err();
        assert!(e.problem.contains("resolves outside the kernel directory"), "{e}");

        // An image name that climbs out, from a kernel JSON inside.
        let (t, kdir, outside) = dir_with_outside("contain-image");
        std::fs::rename(outside.join(format!("{id}.json")), kdir.join(format!("{id}.json"))).unwrap();
        edit_json(&kdir.join(format!("{id}.json")), |v| v["image"] = json!(format!("../outside/{id}.cubin")));
        let e = pack_dir(&kdir, &t.0.join("out.images")).unwrap_err();
        assert!(e.problem.contains("leaves the kernel directory"), "{e}");
        assert!(!t.0.join("out.images").exists());

        // A symlink that stays inside is fine.
        let (t, kdir, outside) = dir_with_outside("contain-inner-link");
        std::fs::create_dir(kdir.join("sub")).unwrap();
        for ext in ["json", "cubin"] {
            std::fs::rename(outside.join(format!("{id}.{ext}")), kdir.join("sub").join(format!("{id}.{ext}"))).unwrap();
        }
        std::os::unix::fs::symlink(kdir.join("sub"), kdir.join("link")).unwrap();
        list_in_manifest(&kdir, &format!("link/{id}.json"));
        pack_dir(&kdir, &t.0.join("out.images")).unwrap();
    }

    /// Stands in for an open file: `data` plus a length as `fstat` would report it, counting the
    /// bytes the reader asked for.
    struct CountingReader<'a> {
        data: &'a [u8],
        read: usize,
    }

    impl std::io::Read for CountingReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let rest = &self.data[self.read.min(self.data.len())..];
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.read += n;
            Ok(n)
        }
    }

    /// Reads `data` as a file of `len` bytes; returns the result and how many bytes were read.
    fn read_as_file(data: &[u8], len: u64) -> (Result<Archive, ArchiveError>, usize) {
        let mut reader = CountingReader { data, read: 0 };
        let result = Archive::read_from("test.images", &mut reader, len);
        (result, reader.read)
    }

    #[test]
    fn a_file_of_the_wrong_size_is_refused_before_its_payload_is_read() {
        let bytes = archive_bytes("file-size");
        let index_end = HEADER_LEN + index_len(&bytes);
        let (ok, read) = read_as_file(&bytes, bytes.len() as u64);
        assert!(ok.is_ok() && read == bytes.len());
        // Bigger than header and index say, by a little and by 8 GiB.
        for extra in [1u64, 8 << 30] {
            let (e, read) = read_as_file(&bytes, bytes.len() as u64 + extra);
            let e = e.unwrap_err();
            assert!(e.problem.contains("trailing garbage") || e.problem.contains("larger than"), "{e}");
            assert!(read <= index_end, "read {read} bytes of a bad file (header and index: {index_end})");
        }
        // Smaller than the index says: only the header is read.
        let (e, read) = read_as_file(&bytes, (index_end - 1) as u64);
        assert!(e.unwrap_err().problem.contains("truncated"));
        assert!(read <= HEADER_LEN, "read {read} bytes of a truncated file");
        // Smaller than the payload needs: header and index only.
        let (e, read) = read_as_file(&bytes, bytes.len() as u64 - 1);
        assert!(e.unwrap_err().problem.contains("truncated"));
        assert!(read <= index_end, "read {read} bytes of a truncated file");
        // A header declaring a 4 GiB index in an 8 GiB file: refused after the header.
        let mut huge = bytes[..HEADER_LEN].to_vec();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let (e, read) = read_as_file(&huge, 8 << 30);
        let e = e.unwrap_err();
        assert!(e.problem.contains("index length 4294967295 exceeds"), "{e}");
        assert!(read <= HEADER_LEN, "read {read} bytes");
    }

    #[test]
    fn open_refuses_an_oversized_file_without_reading_it() {
        let (_t, path) = packed("sparse");
        let len = std::fs::metadata(&path).unwrap().len();
        // Sparse: 8 GiB on paper, nothing on disk.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len + (8 << 30)).unwrap();
        let start = std::time::Instant::now();
        let e = Archive::open(&path).unwrap_err();
        assert!(e.problem.contains("larger than"), "{e}");
        assert!(start.elapsed() < std::time::Duration::from_secs(2), "took {:?}", start.elapsed());
    }

    #[test]
    fn huge_declared_sizes_are_refused() {
        let bytes = archive_bytes("huge");
        let a = parse(bytes.clone()).unwrap();
        let f = &a.functionals()[0];
        let last = f.kernels.len() - 1;
        // Grows functional 0's declared size (and its last image, so the layout stays consistent).
        let declare = |total: u64| {
            with_index(&bytes, |v| {
                let grow = total - v["streams"][0]["uncompressed_size"].as_u64().unwrap();
                v["streams"][0]["uncompressed_size"] = json!(total);
                let fj = &mut v["functionals"][0];
                let s = fj["kernels"][last]["image_size"].as_u64().unwrap() + grow;
                fj["kernels"][last]["image_size"] = json!(s);
            })
        };
        parse_err(
            with_index(&bytes, |v| v["streams"][0]["uncompressed_size"] = json!(u64::MAX)),
            "uncompressed_size 18446744073709551615 exceeds",
        );
        parse_err(with_index(&bytes, |v| v["payload_size"] = json!(2u64 << 30)), "payload_size 2147483648 exceeds");
        let e = parse_err(declare(3 << 30), "uncompressed_size 3221225472 exceeds");
        assert!(e.problem.contains("streams[0]"), "{e}");
        parse_err(declare(a.streams[0].compressed_size * 1000 + 1), "more than 1000 times its compressed size");
        assert!(parse(declare(f.uncompressed_size() + 1)).is_ok(), "a small excess is the decoder's to find");
    }

    #[test]
    fn error_display() {
        let e = ArchiveError::new("a.images", "index checksum mismatch");
        assert_eq!(
            e.to_string(),
            "kernel archive a.images: index checksum mismatch"
        );
        let _: &dyn std::error::Error = &e;
    }
}
