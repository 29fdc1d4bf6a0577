//! Prints what the code-object manager reads from hsaco files: `cargo run -p aotriton-amd-tests
//! --example read_hsaco -- FILE.hsaco ...`.
fn main() {
    let comgr = match aotriton_amd_tests::comgr::Comgr::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    for path in std::env::args().skip(1) {
        let image = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        match comgr.read(&image) {
            Ok(object) => println!("{path}: {object:#?}"),
            Err(e) => println!("{path}: {e}"),
        }
    }
}
