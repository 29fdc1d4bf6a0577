//! aotriton-info and aotriton-pack as a user runs them, on this machine: the archives the test
//! build embeds, and (without a GPU driver) the no-driver answer.
use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> (Output, String) {
    let out = Command::new(exe).args(args).env_remove("AOTRITON_IMAGE_DIR").output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

const INFO: &str = env!("CARGO_BIN_EXE_aotriton-info");
const PACK: &str = env!("CARGO_BIN_EXE_aotriton-pack");

#[test]
fn both_tools_print_their_version() {
    for (exe, name) in [(INFO, "aotriton-info"), (PACK, "aotriton-pack")] {
        let (out, text) = run(exe, &["--version"]);
        assert!(out.status.success(), "{name} --version: {text}");
        assert_eq!(text.trim(), format!("{name} {}", env!("CARGO_PKG_VERSION")));
    }
}

#[test]
fn info_lists_the_embedded_archives_and_their_functionals() {
    let (_, text) = run(INFO, &["--functionals"]);
    assert!(text.contains("images:   embedded in the library"), "{text}");
    for arch in aotriton::built_archs() {
        let line = text.lines().find(|l| l.starts_with(&format!("archive:  {arch}: aotriton-{arch}.images, Triton ")));
        assert!(line.is_some_and(|l| l.contains("attn_fwd")), "no line for {arch}: {text}");
    }
    assert!(text.lines().any(|l| l.starts_with("  attn_fwd{")), "no functionals listed: {text}");
}

#[test]
fn info_without_a_driver_says_so_and_fails() {
    if aotriton::library_present(aotriton::Runtime::Cuda) {
        eprintln!("skipped: this machine has the CUDA driver");
        return;
    }
    let (out, text) = run(INFO, &["--runtime", "cuda"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = text.lines().find(|l| l.starts_with("device:   CUDA: none: NoDriver"));
    assert!(line.is_some_and(|l| l.contains("libcuda.so.1")), "{text}");
    assert!(!text.contains("panicked"), "{text}");
    if !aotriton::library_present(aotriton::Runtime::Hip) {
        let (out, text) = run(INFO, &[]);
        assert_eq!(out.status.code(), Some(1), "{text}");
        let line = text.lines().find(|l| l.starts_with("device:   none: no GPU driver ("));
        assert!(line.is_some_and(|l| l.contains("libcuda.so.1")), "{text}");
    }
}

#[test]
fn info_refuses_unknown_arguments_with_usage_status() {
    let (out, text) = run(INFO, &["--frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
}

#[test]
fn info_lists_the_archives_of_an_image_dir_and_refuses_an_untrusted_one() {
    use std::os::unix::fs::PermissionsExt;
    let arch = aotriton::built_archs()[0];
    let bytes = aotriton::with_archive(arch, |a| a.bytes().to_vec()).unwrap();
    let dir = std::env::temp_dir().join(format!("aotriton-info-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join(format!("aotriton-{arch}.images"));
    std::fs::write(&file, &bytes).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let info = |dir: &std::path::Path| {
        let out = Command::new(INFO).args(["--runtime", "cuda"]).env("AOTRITON_IMAGE_DIR", dir).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let text = info(&dir);
    let real = dir.canonicalize().unwrap();
    assert!(text.contains(&format!("images:   directory {}", real.display())), "{text}");
    assert!(text.contains(&format!("archive:  {arch}: {}, Triton ", real.join(format!("aotriton-{arch}.images")).display())), "{text}");

    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let text = info(&dir);
    assert!(text.contains("images:   refused: UntrustedImages") && text.contains("writable by group or others"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
