//! Links the shared library as libibverbs does: soname `libibverbs.so.1` and the symbol
//! versions of `ibverbs.map` (the symbols are bound to them by `.symver` in `src/exports.rs`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=ibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/ibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
