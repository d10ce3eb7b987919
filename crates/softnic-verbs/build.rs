//! Links the shared library as libibverbs is linked: soname `libibverbs.so.1`, and a version
//! script giving each exported symbol its libibverbs version (`IBVERBS_1.0`, `IBVERBS_1.1`,
//! ..., `IBVERBS_PRIVATE_34`; softnic's own, `SOFTNIC_1.0`).
//!
//! The script is generated from the sources, so that it always lists exactly what they
//! export: the `export!` entries (`"IBVERBS_1.1" fn name(`), the `unsupported!` lists
//! (`unsupported!("IBVERBS_PRIVATE_34": name name ...);`) and the hand-written `.symver`
//! lines (`name@@IBVERBS_...`). Each symbol is bound to its version by an assembler `.symver`
//! in the code; the linker requires every version node it names to be in the script, and
//! every symbol the script names to exist.

use std::collections::BTreeMap;
use std::fmt::Write as _;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let mut versions: BTreeMap<(u32, u32, String), Vec<String>> = BTreeMap::new();
    let src = std::path::Path::new(&dir).join("src");
    println!("cargo:rerun-if-changed=src");
    for entry in std::fs::read_dir(&src).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        for (version, name) in exported(&text) {
            versions.entry(order(&version)).or_default().push(name);
        }
    }
    let mut script = String::new();
    let mut previous: Option<String> = None;
    for ((_, _, version), mut names) in versions {
        names.sort();
        names.dedup();
        let _ = writeln!(script, "{version} {{\n\tglobal:");
        for n in &names {
            let _ = writeln!(script, "\t\t{n};");
        }
        let first = previous.is_none();
        if first {
            let _ = writeln!(script, "\tlocal: *;");
        }
        // The public versions inherit from one another; the private one, and softnic's own,
        // stand alone.
        let public = version.starts_with("IBVERBS_") && !version.starts_with("IBVERBS_PRIVATE");
        match (&previous, public) {
            (Some(p), true) => {
                let _ = writeln!(script, "}} {p};\n");
            }
            _ => script.push_str("};\n\n"),
        }
        if public {
            previous = Some(version);
        }
    }
    let map = std::path::Path::new(&out).join("ibverbs.map");
    std::fs::write(&map, script).expect("OUT_DIR is writable");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}

/// `IBVERBS_1.10` sorts after `IBVERBS_1.9`, and the private version last.
fn order(version: &str) -> (u32, u32, String) {
    let rest = version.trim_start_matches("IBVERBS_");
    let mut parts = rest.split('.');
    let major = parts
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(u32::MAX);
    let minor = parts
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(u32::MAX);
    (major, minor, version.to_string())
}

/// Every (version, symbol) a source file exports.
fn exported(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    // `"IBVERBS_x" fn name(` entries of `export!`.
    for (i, _) in text.match_indices("\"IBVERBS_") {
        let rest = &text[i + 1..];
        let Some(end) = rest.find('"') else { continue };
        let version = &rest[..end];
        let after = &rest[end + 1..];
        if let Some(f) = after.strip_prefix(" fn ") {
            found.push((version.to_string(), ident(f)));
        } else if let Some(list) = after.strip_prefix(':') {
            // `unsupported!("IBVERBS_x": a b c);`
            let list = &list[..list.find(')').unwrap_or(list.len())];
            found.extend(
                list.split_whitespace()
                    .map(|n| (version.to_string(), ident(n))),
            );
        }
    }
    // Hand-written `.symver softnic_x, x@@IBVERBS_y` (or `x@@SOFTNIC_y`) lines.
    let symvers = text.match_indices("@@IBVERBS_");
    for (i, _) in symvers.chain(text.match_indices("@@SOFTNIC_")) {
        let before = &text[..i];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |p| p + 1);
        let name = &before[start..];
        let version: String = text[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        if !name.is_empty() {
            found.push((version, name.to_string()));
        }
    }
    found
}
