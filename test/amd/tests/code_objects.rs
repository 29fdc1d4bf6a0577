//! Every hsaco of the AMD archives (gfx942 and gfx90a required, gfx950 when its archive exists)
//! read with the real ROCm code-object manager and checked against what the runtime will do with
//! it: one kernel named by the metadata's symbol; 64-lane waves; the explicit kernel arguments
//! exactly where the runtime's argument plan (`aotriton::abi::kernarg_layout`) puts them, byte
//! for byte, with any hidden arguments after them; no scratch and no spilled VGPRs; static plus dynamic
//! LDS within the arch's limit; a workgroup size that admits the launch's block.
//!
//! It also renders the resources per (arch, family, config, variant) and compares them with the
//! committed table `test/amd/code_objects.md`; with `AOTRITON_WRITE_CODE_OBJECT_TABLE=1`
//! (`test/amd/regen_code_object_table.sh`) it writes the table instead.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use aotriton::abi::{KernargLayout, kernarg_layout};
use aotriton::archive::{Archive, KernelMeta};
use aotriton_amd_tests::comgr::{CodeObject, Comgr};
use aotriton_amd_tests::{archive_path, repo_root, skip_or_fail};

/// The AMD archs: (arch, whether its archive is required, LDS bytes one workgroup may use).
const ARCHS: [(&str, bool, u32); 3] = [("gfx942", true, 65536), ("gfx90a", true, 65536), ("gfx950", false, 163840)];

/// Wave size of every AMD kernel the project compiles.
const WAVE_SIZE: u32 = 64;

/// The committed table, relative to the repository root.
const TABLE: &str = "test/amd/code_objects.md";
/// Set (to anything but `0`) to write the table instead of comparing it.
const WRITE_ENV: &str = "AOTRITON_WRITE_CODE_OBJECT_TABLE";
/// The command that regenerates the table.
const REGEN: &str = "test/amd/regen_code_object_table.sh";

/// Failures listed in the final message (all are counted).
const SHOWN_FAILURES: usize = 20;

/// What one code object uses.
#[derive(Debug, Clone, Copy)]
struct Usage {
    lds: u32,
    vgpr: u32,
    agpr: u32,
    sgpr: u32,
    sgpr_spill: u32,
    scratch: u32,
}

/// A row of the table: family, config (in [`config_key`] order) and variant.
type RowKey = (String, Vec<(usize, String, i64)>, String);

/// One arch's rows: the usage of each kernel of each row.
type Rows = BTreeMap<RowKey, Vec<Usage>>;

/// What one arch's archive gave: its code objects, their explicit arguments and its table section.
struct Checked {
    code_objects: usize,
    arguments: usize,
    section: String,
}

#[test]
fn every_code_object_matches_the_argument_plan() {
    let writing = std::env::var(WRITE_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let missing = |reason: &str| {
        if writing {
            panic!("{reason}: cannot regenerate {TABLE}");
        }
        skip_or_fail(reason);
    };
    for (arch, required, _) in ARCHS {
        let path = archive_path(arch);
        if required && !path.is_file() {
            return missing(&format!(
                "no {arch} archive at {} (build it with AOTRITON_TARGET_ARCH including {arch}: ./build.sh or ./test.sh)",
                path.display()
            ));
        }
    }
    let comgr = match Comgr::load() {
        Ok(comgr) => comgr,
        Err(e) => return missing(&e),
    };

    let mut failures = Vec::new();
    let mut sections = BTreeMap::new();
    let mut counts = Vec::new();
    let mut arguments = 0;
    for (arch, _, lds_limit) in ARCHS {
        let path = archive_path(arch);
        if !path.is_file() {
            println!("{arch}: no archive at {}, not checked", path.display());
            continue;
        }
        let checked = check_archive(&comgr, arch, lds_limit, &path, &mut failures);
        counts.push(format!("{arch} {}", checked.code_objects));
        arguments += checked.arguments;
        sections.insert(arch, checked.section);
    }
    println!(
        "code objects checked against comgr metadata: {} ({arguments} kernel arguments; comgr: {})",
        counts.join(", "),
        comgr.path()
    );

    let table = compare_or_write_table(&sections, writing);
    let mut message = String::new();
    if !failures.is_empty() {
        // Every failure on stdout (shown with --nocapture or when the test fails), the first
        // ones in the assertion.
        for failure in &failures {
            println!("FAILED {failure}");
        }
        let shown: Vec<&str> = failures.iter().take(SHOWN_FAILURES).map(String::as_str).collect();
        let more = failures.len().saturating_sub(SHOWN_FAILURES);
        let _ = writeln!(message, "{} failure(s) in the AMD code objects:\n  {}", failures.len(), shown.join("\n  "));
        if more > 0 {
            let _ = writeln!(message, "  ... and {more} more");
        }
    }
    if let Err(problem) = table {
        message += &problem;
    }
    assert!(message.is_empty(), "{message}");
}

/// Checks every code object of one arch's archive, appending failures; returns the counts and the
/// arch's table section.
fn check_archive(comgr: &Comgr, arch: &str, lds_limit: u32, path: &Path, failures: &mut Vec<String>) -> Checked {
    let mut checked = Checked { code_objects: 0, arguments: 0, section: String::new() };
    let archive = match Archive::open(path) {
        Ok(archive) => archive,
        Err(e) => {
            failures.push(format!("{arch}: {e}"));
            return checked;
        }
    };
    if archive.arch() != arch {
        failures.push(format!("{}: the archive is for {}, not {arch}", path.display(), archive.arch()));
    }
    let mut rows = Rows::new();
    for (index, functional) in archive.functionals().iter().enumerate() {
        let images = match archive.load_images(index) {
            Ok(images) => images,
            Err(e) => {
                failures.push(format!("{arch} {}: {e}", functional.display_name()));
                continue;
            }
        };
        for (meta, image) in functional.kernels.iter().zip(&images) {
            let mut problems = Vec::new();
            if let Err(problem) = check_elf(arch, image) {
                problems.push(problem);
            }
            match comgr.read(image) {
                Ok(object) => {
                    checked.code_objects += 1;
                    if let Some((usage, arguments)) = check_code_object(arch, lds_limit, meta, &object, &mut problems) {
                        checked.arguments += arguments;
                        let key = (functional.family.clone(), config_key(meta), meta.variant.clone());
                        rows.entry(key).or_default().push(usage);
                    }
                }
                Err(e) => problems.push(format!("comgr cannot read the image: {e}")),
            }
            failures.extend(problems.into_iter().map(|p| format!("{arch} {}: {p}", meta.id)));
        }
    }
    checked.section = render_section(arch, archive.triton_version(), checked.code_objects, &rows);
    checked
}

/// `EF_AMDGPU_MACH` (the low byte of the ELF header's `e_flags`) of each arch.
const ELF_MACH: [(&str, u32); 3] = [("gfx90a", 0x3f), ("gfx942", 0x4c), ("gfx950", 0x4f)];

/// Whether the image is an AMDGPU HSA code object for `arch`, by its ELF header (this comgr
/// reports no ISA name for code objects of version 5).
fn check_elf(arch: &str, image: &[u8]) -> Result<(), String> {
    const ELFOSABI_AMDGPU_HSA: u8 = 64;
    const EM_AMDGPU: u16 = 224;
    let header = image.get(..52).filter(|h| h.starts_with(b"\x7fELF") && h[4] == 2).ok_or("not a 64-bit ELF file")?;
    let machine = u16::from_le_bytes([header[18], header[19]]);
    let flags = u32::from_le_bytes([header[48], header[49], header[50], header[51]]);
    if header[7] != ELFOSABI_AMDGPU_HSA || machine != EM_AMDGPU {
        return Err(format!("not an AMDGPU HSA code object (ELF OS ABI {}, machine {machine})", header[7]));
    }
    let want = ELF_MACH.iter().find(|(a, _)| *a == arch).map(|(_, mach)| *mach);
    if want != Some(flags & 0xff) {
        let found = ELF_MACH.iter().find(|(_, mach)| *mach == flags & 0xff).map_or("an unknown processor", |(a, _)| a);
        return Err(format!("the image is compiled for {found} (ELF e_flags {flags:#x}), not {arch}"));
    }
    Ok(())
}

/// Checks one code object against the kernel's metadata and the runtime's kernarg layout. Returns
/// its usage and the number of explicit arguments compared, unless it has no single kernel.
fn check_code_object(
    arch: &str,
    lds_limit: u32,
    meta: &KernelMeta,
    object: &CodeObject,
    problems: &mut Vec<String>,
) -> Option<(Usage, usize)> {
    if let Some(isa) = &object.isa {
        let processor = isa.split("--").nth(1).unwrap_or("").split(':').next().unwrap_or("");
        if processor != arch {
            problems.push(format!("code object ISA is {isa}, not {arch}"));
        }
    }
    let [k] = object.kernels.as_slice() else {
        problems.push(format!("the code object has {} kernels, not exactly one", object.kernels.len()));
        return None;
    };
    if k.name != meta.symbol {
        problems.push(format!(".name is {:?}, the metadata's symbol {:?}", k.name, meta.symbol));
    }
    if k.symbol != format!("{}.kd", meta.symbol) {
        problems.push(format!(".symbol is {:?}, not \"{}.kd\"", k.symbol, meta.symbol));
    }
    if k.wavefront_size != meta.warp_size || meta.warp_size != WAVE_SIZE {
        problems.push(format!(
            ".wavefront_size is {}, metadata warp_size {} (expected both {WAVE_SIZE})",
            k.wavefront_size, meta.warp_size
        ));
    }

    // The explicit arguments against the runtime's plan, slot by slot.
    let mut arguments = 0;
    match kernarg_layout(meta) {
        Err(e) => problems.push(format!("the runtime has no kernarg layout for it: {e}")),
        Ok(KernargLayout { slots, size }) => {
            let explicit: Vec<_> = k.args.iter().filter(|a| !a.is_hidden()).collect();
            if explicit.len() != slots.len() {
                problems.push(format!(
                    "{} explicit kernel arguments in the code object, {} in the runtime's plan \
                     ({} metadata arguments + 2 scratch pointers)",
                    explicit.len(),
                    slots.len(),
                    meta.args.len()
                ));
            }
            for (i, (arg, slot)) in explicit.iter().zip(&slots).enumerate() {
                arguments += 1;
                let kind = if slot.pointer { "global_buffer" } else { "by_value" };
                if arg.offset != slot.offset || arg.size != slot.size || arg.value_kind != kind {
                    problems.push(format!(
                        "argument {i} ({}): the code object has {} bytes at offset {} ({}), \
                         the runtime's plan {} bytes at {} ({kind})",
                        slot.name, arg.size, arg.offset, arg.value_kind, slot.size, slot.offset
                    ));
                }
            }
            let hidden: Vec<_> = k.args.iter().filter(|a| a.is_hidden()).collect();
            for arg in &hidden {
                if arg.offset < size {
                    problems.push(format!(
                        "hidden argument {} at offset {} lies inside the runtime's {size}-byte plan",
                        arg.value_kind, arg.offset
                    ));
                }
            }
            let align = k.kernarg_segment_align.max(1);
            if k.kernarg_segment_size < size {
                problems.push(format!(".kernarg_segment_size {} < the plan's {size} bytes", k.kernarg_segment_size));
            } else if hidden.is_empty() && k.kernarg_segment_size != size.div_ceil(align) * align {
                problems.push(format!(
                    ".kernarg_segment_size {} is not the plan's {size} bytes rounded up to .kernarg_segment_align {align}",
                    k.kernarg_segment_size
                ));
            }
            if let Some(end) = k.args.iter().map(|a| a.offset + a.size).max().filter(|&end| end > k.kernarg_segment_size) {
                problems.push(format!("arguments end at byte {end}, past .kernarg_segment_size {}", k.kernarg_segment_size));
            }
        }
    }

    // No scratch and no spilled VGPRs. Spilled SGPRs go to VGPR lanes (`v_writelane`), not to
    // memory, as the compile driver also accepts: nearly every kernel spills some (its scalar
    // arguments and strides outnumber the 102 SGPRs); where no lane is free they would reach
    // scratch, which the first condition catches. The table lists them.
    if k.private_segment_fixed_size != 0 || k.vgpr_spill_count != 0 {
        problems.push(format!(
            "scratch: .private_segment_fixed_size {} bytes, .vgpr_spill_count {} (both must be 0; .sgpr_spill_count {})",
            k.private_segment_fixed_size, k.vgpr_spill_count, k.sgpr_spill_count
        ));
    }
    // LDS: the code object's static part plus the launch's dynamic part.
    let lds = k.group_segment_fixed_size as u64 + meta.shared as u64;
    if lds > lds_limit as u64 {
        problems.push(format!(
            "LDS: {} static + {} dynamic = {lds} bytes, more than {arch}'s {lds_limit}",
            k.group_segment_fixed_size, meta.shared
        ));
    }
    // The launch's block must fit the workgroup size the kernel was compiled for.
    let block = meta.num_warps * meta.warp_size;
    if k.max_flat_workgroup_size < block {
        problems.push(format!(
            ".max_flat_workgroup_size {} < the launch's block of {block} ({} warps of {})",
            k.max_flat_workgroup_size, meta.num_warps, meta.warp_size
        ));
    }
    let usage = Usage {
        lds: lds.min(u32::MAX as u64) as u32,
        vgpr: k.vgpr_count,
        agpr: k.agpr_count,
        sgpr: k.sgpr_count,
        sgpr_spill: k.sgpr_spill_count,
        scratch: k.private_segment_fixed_size,
    };
    Some((usage, arguments))
}

/// The config's keys in a stable order: BLOCK_M, BLOCK_N, num_warps, num_stages, waves_per_eu,
/// then any others by name.
fn config_key(meta: &KernelMeta) -> Vec<(usize, String, i64)> {
    const ORDER: [&str; 5] = ["BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu"];
    let mut key: Vec<(usize, String, i64)> = meta
        .config
        .iter()
        .map(|(k, v)| (ORDER.iter().position(|o| o == k).unwrap_or(ORDER.len()), k.clone(), *v))
        .collect();
    key.sort();
    key
}

/// `a` or `a–b` over the kernels of a row.
fn range(usages: &[Usage], field: impl Fn(&Usage) -> u32) -> String {
    let min = usages.iter().map(&field).min().unwrap_or(0);
    let max = usages.iter().map(&field).max().unwrap_or(0);
    if min == max { min.to_string() } else { format!("{min}–{max}") }
}

/// One arch's section of the table.
fn render_section(arch: &str, triton_version: &str, code_objects: usize, rows: &Rows) -> String {
    let mut s = format!("## {arch}\n\n{code_objects} code objects (Triton {triton_version}).\n\n");
    s += "| family | config | variant | kernels | LDS bytes | VGPRs | AGPRs | SGPRs | SGPR spills | scratch bytes |\n";
    s += "|---|---|---|--:|--:|--:|--:|--:|--:|--:|\n";
    for ((family, config, variant), usages) in rows {
        let config: Vec<String> = config.iter().map(|(_, k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            s,
            "| {family} | {} | {variant} | {} | {} | {} | {} | {} | {} | {} |",
            config.join(" "),
            usages.len(),
            range(usages, |u| u.lds),
            range(usages, |u| u.vgpr),
            range(usages, |u| u.agpr),
            range(usages, |u| u.sgpr),
            range(usages, |u| u.sgpr_spill),
            range(usages, |u| u.scratch)
        );
    }
    s
}

fn header() -> String {
    format!(
        "# AMD code objects: resources per config

Generated by `test/amd/tests/code_objects.rs` from the code-object metadata (read with the ROCm
code-object manager) of every hsaco in the AMD archives; never edit it by hand. Regenerate it
after changing a kernel or a config, from the archives of `./build.sh` or `./test.sh`, with

    {REGEN}

The test fails while this file differs from what it reads from the archives. One row per
(family, config, variant), over the functionals (dtype, head dim, dropout, bias, ...) compiled with
that config; `kernels` counts them, and `a–b` is the range where they differ. LDS: the launch's
dynamic shared memory (metadata `shared`) plus the code object's static
`.group_segment_fixed_size`, per workgroup. VGPRs, AGPRs, SGPRs: `.vgpr_count`, `.agpr_count`,
`.sgpr_count`. SGPR spills: `.sgpr_spill_count`, SGPRs kept in VGPR lanes (not memory). Scratch:
`.private_segment_fixed_size` per work-item (the test requires 0 and no spilled VGPRs).
"
    )
}

/// Splits a table file into its sections by arch (a section runs from its `## <arch>` line to the
/// next one; the header before the first is dropped).
fn split_sections(text: &str) -> BTreeMap<String, String> {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.split_inclusive('\n') {
        if let Some(arch) = line.strip_prefix("## ") {
            if let Some((arch, body)) = current.take() {
                sections.insert(arch, body);
            }
            current = Some((arch.trim().to_string(), String::new()));
        }
        if let Some((_, body)) = &mut current {
            body.push_str(line);
        }
    }
    if let Some((arch, body)) = current {
        sections.insert(arch, body);
    }
    sections
}

/// The table from the sections computed here; an optional arch without an archive here keeps its
/// committed section (CI, which builds it, checks that one).
fn render_table(computed: &BTreeMap<&str, String>, committed: &BTreeMap<String, String>) -> String {
    let mut text = header();
    for (arch, _, _) in ARCHS {
        let section = computed.get(arch).or_else(|| committed.get(arch));
        if let Some(section) = section {
            text.push('\n');
            text.push_str(section.trim_end());
            text.push('\n');
        }
    }
    text
}

/// Writes the table, or compares it with the committed one (the problem, with the differing
/// lines and the regen command, if they differ).
fn compare_or_write_table(computed: &BTreeMap<&str, String>, writing: bool) -> Result<(), String> {
    let path: PathBuf = repo_root().join(TABLE);
    let committed_text = std::fs::read_to_string(&path).ok();
    let committed = committed_text.as_deref().map(split_sections).unwrap_or_default();
    for (arch, _, _) in ARCHS {
        if !computed.contains_key(arch) && committed.contains_key(arch) {
            println!("{TABLE}: the {arch} section is kept as committed (no {arch} archive here to check it)");
        }
    }
    let expected = render_table(computed, &committed);
    if writing {
        std::fs::write(&path, &expected).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
        return Ok(());
    }
    let Some(committed_text) = committed_text else {
        return Err(format!("{TABLE} does not exist; generate it with {REGEN}"));
    };
    if committed_text == expected {
        println!("{TABLE} is up to date");
        return Ok(());
    }
    let old: Vec<&str> = committed_text.lines().collect();
    let new: Vec<&str> = expected.lines().collect();
    let mut diff = Vec::new();
    diff.extend(old.iter().filter(|l| !new.contains(l)).map(|l| format!("    - {l}")));
    diff.extend(new.iter().filter(|l| !old.contains(l)).map(|l| format!("    + {l}")));
    let more = diff.len().saturating_sub(SHOWN_FAILURES);
    diff.truncate(SHOWN_FAILURES);
    Err(format!(
        "{TABLE} is stale (it differs from the code objects in the archives): regenerate it with {REGEN} and commit it\n{}{}",
        diff.join("\n"),
        if more > 0 { format!("\n    ... and {more} more lines") } else { String::new() }
    ))
}

/// The checks on a hand-made kernel and code object (no comgr, no archive): the matching pair
/// passes, and each kind of mismatch is reported.
#[test]
fn the_checks_name_each_mismatch() {
    use aotriton::archive::KernelArg;
    use aotriton_amd_tests::comgr::{Arg, Kernel};

    let meta_arg = |name: &str, ty: &str| KernelArg { name: name.into(), ty: ty.into(), divisibility: 1, tensordesc: None };
    let meta = KernelMeta {
        id: "k-m64w4s1-aligned".into(),
        symbol: "k".into(),
        variant: "aligned".into(),
        config: [("BLOCK_M".to_string(), 64), ("num_warps".to_string(), 4)].into_iter().collect(),
        args: vec![meta_arg("Q", "*fp16"), meta_arg("sm_scale", "fp32"), meta_arg("stride_qz", "i64"), meta_arg("N", "i32")],
        shared: 1024,
        num_warps: 4,
        warp_size: 64,
        num_ctas: 1,
        global_scratch_size: 0,
        global_scratch_align: 1,
        profile_scratch_size: 0,
        profile_scratch_align: 1,
        tuned_for: Vec::new(),
        tuned_only: false,
        portable_for: Vec::new(),
    };
    /// One change to the matching code object.
    type Edit = fn(&mut Kernel);
    fn arg(offset: u32, size: u32, kind: &str) -> Arg {
        Arg { name: String::new(), offset, size, value_kind: kind.into() }
    }
    let good = Kernel {
        name: "k".into(),
        symbol: "k.kd".into(),
        kernarg_segment_size: 48,
        kernarg_segment_align: 8,
        group_segment_fixed_size: 0,
        private_segment_fixed_size: 0,
        wavefront_size: 64,
        sgpr_count: 20,
        vgpr_count: 30,
        agpr_count: 4,
        sgpr_spill_count: 0,
        vgpr_spill_count: 0,
        max_flat_workgroup_size: 256,
        args: vec![
            arg(0, 8, "global_buffer"),
            arg(8, 4, "by_value"),
            arg(16, 8, "by_value"),
            arg(24, 4, "by_value"),
            arg(32, 8, "global_buffer"),
            arg(40, 8, "global_buffer"),
        ],
    };
    let check = |edit: Edit| {
        let mut kernel = good.clone();
        edit(&mut kernel);
        let mut problems = Vec::new();
        let object = CodeObject { isa: None, kernels: vec![kernel] };
        let usage = check_code_object("gfx942", 65536, &meta, &object, &mut problems);
        (usage, problems)
    };
    let (usage, problems) = check(|_| {});
    assert!(problems.is_empty(), "{problems:?}");
    let (usage, arguments) = usage.unwrap();
    assert_eq!((usage.lds, usage.vgpr, usage.agpr, usage.sgpr, usage.scratch, arguments), (1024, 30, 4, 20, 0, 6));
    let (usage, problems) = check(|k| k.sgpr_spill_count = 12);
    assert!(problems.is_empty(), "SGPRs spilled to VGPR lanes: {problems:?}");
    assert_eq!(usage.unwrap().0.sgpr_spill, 12);
    let (_, problems) = check(|k| {
        k.args.push(arg(48, 8, "hidden_block_count_x"));
        k.kernarg_segment_size = 56;
    });
    assert!(problems.is_empty(), "hidden arguments after the plan: {problems:?}");

    let cases: [(Edit, &str); 14] = [
        (|k| k.name = "other".into(), ".name is \"other\""),
        (|k| k.symbol = "k".into(), ".symbol is \"k\""),
        (|k| k.wavefront_size = 32, ".wavefront_size is 32"),
        (|k| k.args[1].size = 8, "argument 1 (sm_scale): the code object has 8 bytes at offset 8 (by_value), the runtime's"),
        (|k| k.args[2].offset = 12, "argument 2 (stride_qz)"),
        (|k| k.args[0].value_kind = "by_value".into(), "argument 0 (Q)"),
        (|k| drop(k.args.pop()), "5 explicit kernel arguments in the code object, 6 in the runtime's plan"),
        (|k| k.args.push(arg(40, 8, "hidden_default_queue")), "hidden argument hidden_default_queue at offset 40 lies"),
        (|k| k.kernarg_segment_size = 40, ".kernarg_segment_size 40 < the plan's 48 bytes"),
        (|k| k.kernarg_segment_size = 64, "not the plan's 48 bytes rounded up"),
        (|k| k.private_segment_fixed_size = 16, ".private_segment_fixed_size 16 bytes"),
        (|k| k.vgpr_spill_count = 2, ".vgpr_spill_count 2 (both must be 0"),
        (|k| k.group_segment_fixed_size = 65000, "LDS: 65000 static + 1024 dynamic = 66024 bytes, more than gfx942's 65536"),
        (|k| k.max_flat_workgroup_size = 128, ".max_flat_workgroup_size 128 < the launch's block of 256"),
    ];
    for (edit, expected) in cases {
        let (_, problems) = check(edit);
        assert!(problems.iter().any(|p| p.contains(expected)), "expected {expected:?} in {problems:?}");
    }
    let mut problems = Vec::new();
    let two = CodeObject { isa: None, kernels: vec![good.clone(), good.clone()] };
    assert!(check_code_object("gfx942", 65536, &meta, &two, &mut problems).is_none());
    assert_eq!(problems, ["the code object has 2 kernels, not exactly one"]);
    let mut problems = Vec::new();
    let other_isa = CodeObject { isa: Some("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-".into()), kernels: vec![good] };
    check_code_object("gfx942", 65536, &meta, &other_isa, &mut problems);
    assert_eq!(problems, ["code object ISA is amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-, not gfx942"]);

    // The ELF header names the processor.
    let mut elf = vec![0u8; 64];
    elf[..5].copy_from_slice(b"\x7fELF\x02");
    elf[7] = 64;
    elf[18..20].copy_from_slice(&224u16.to_le_bytes());
    elf[48..52].copy_from_slice(&0x54cu32.to_le_bytes());
    assert_eq!(check_elf("gfx942", &elf), Ok(()));
    assert_eq!(check_elf("gfx90a", &elf).unwrap_err(), "the image is compiled for gfx942 (ELF e_flags 0x54c), not gfx90a");
    elf[18] = 0;
    assert!(check_elf("gfx942", &elf).unwrap_err().starts_with("not an AMDGPU HSA code object"));
    assert_eq!(check_elf("gfx942", b"\x7fELF").unwrap_err(), "not a 64-bit ELF file");
}
