//! Links the shared library as librdmacm is linked: soname `librdmacm.so.1`, and a version
//! script giving each exported symbol its librdmacm version (`RDMACM_1.0` .. `RDMACM_1.3`, as
//! Debian 12's `objdump -T /usr/lib/x86_64-linux-gnu/librdmacm.so.1` shows them).
//!
//! The script is generated from the sources: every `export!` entry (`"RDMACM_1.x" fn name(`)
//! and every `"RDMACM_1.x": name ...)` list (the form of a macro that exports several names).

use std::collections::BTreeMap;
use std::fmt::Write as _;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=src");
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let src = std::path::Path::new(&dir).join("src");
    for entry in std::fs::read_dir(&src).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable source file");
        for (i, _) in text.match_indices("\"RDMACM_1.") {
            let rest = &text[i + 1..];
            let Some(end) = rest.find('"') else { continue };
            let version = rest[..end].to_string();
            let after = &rest[end + 1..];
            let ident = |s: &str| -> String {
                s.trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            };
            if let Some(f) = after.strip_prefix(" fn ") {
                versions.entry(version).or_default().push(ident(f));
            } else if let Some(list) = after.strip_prefix(':') {
                let list = &list[..list.find(')').unwrap_or(list.len())];
                let names = list.split_whitespace().map(ident);
                versions.entry(version).or_default().extend(names);
            }
        }
    }
    let mut script = String::new();
    let mut previous: Option<String> = None;
    for (version, mut names) in versions {
        names.sort();
        names.dedup();
        let _ = writeln!(script, "{version} {{\n\tglobal:");
        for n in &names {
            let _ = writeln!(script, "\t\t{n};");
        }
        match &previous {
            None => script.push_str("\tlocal: *;\n};\n\n"),
            Some(p) => {
                let _ = writeln!(script, "}} {p};\n");
            }
        }
        previous = Some(version);
    }
    let map = std::path::Path::new(&out).join("rdmacm.map");
    std::fs::write(&map, script).expect("OUT_DIR is writable");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
}
