//! Seeds the fresh clone's target directory with the registry crates the workspace's own
//! build compiled, so that `fresh-clone` compiles only the workspace's crates (from the
//! clone's sources) and not every dependency a second time.
//!
//! What is seeded: the entries of `debug/{build,deps,.fingerprint}` named `<name>-<hash>`
//! whose hash is a registry package's (a package `Cargo.lock` names with a `registry+`
//! source, whose fingerprint directory carries that hash). Compiled artifacts are hard-linked
//! (copied across file systems); the small files cargo and rustc rewrite in place
//! (fingerprints, build script outputs, dep-info) are copied with their times, so the
//! clone's build never writes into the workspace's; fingerprints come last. Cargo then finds
//! them fresh where the clone resolves a dependency as the workspace did (same version,
//! features and profile), and builds any other. Nothing of the workspace's own packages is
//! seeded, and every file without a hash (the launcher, the drop-in libraries) left in the
//! clone's target directory by an earlier run is removed first ([`clear_leftovers`]): a
//! leftover of those could hide one that the clone's `cargo test` does not build.

use std::collections::HashSet;
use std::io;
use std::path::Path;

/// Seeds `to` (a target directory's `debug/`) from `from` (the workspace's `debug/`) with
/// the packages `lock` (the text of a `Cargo.lock`) has from a registry. Entries already in
/// `to` are left alone. Returns how many were seeded.
pub(crate) fn registry_builds(lock: &str, from: &Path, to: &Path) -> io::Result<usize> {
    let registry = registry_packages(lock);
    // The hashes of the registry packages' units (a unit's fingerprint directory and its
    // outputs carry the same hash).
    let mut theirs = HashSet::new();
    for e in std::fs::read_dir(from.join(".fingerprint"))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some((package, hash)) = split_hash(&name)
            && registry.contains(package)
        {
            theirs.insert(hash.to_string());
        }
    }
    let mut seeded = 0;
    for dir in ["build", "deps", ".fingerprint"] {
        std::fs::create_dir_all(to.join(dir))?;
        for e in std::fs::read_dir(from.join(dir))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((_, hash)) = split_hash(&name) else {
                continue;
            };
            if !theirs.contains(hash) || to.join(dir).join(&name).exists() {
                continue;
            }
            put_tree(&e.path(), &to.join(dir).join(&name))?;
            seeded += 1;
        }
    }
    Ok(seeded)
}

/// Removes from `debug` (a target directory's `debug/`) every file at its top (the binaries
/// and libraries cargo copies there) and every entry of `deps/` without a hash (a cdylib
/// package's outputs, the launcher's library directory): what an earlier run left that a
/// later one must build again to have.
pub(crate) fn clear_leftovers(debug: &Path) -> io::Result<()> {
    let Ok(top) = std::fs::read_dir(debug) else {
        return Ok(());
    };
    for e in top {
        let e = e?;
        if !e.file_type()?.is_dir() {
            std::fs::remove_file(e.path())?;
        }
    }
    let Ok(deps) = std::fs::read_dir(debug.join("deps")) else {
        return Ok(());
    };
    for e in deps {
        let e = e?;
        if split_hash(&e.file_name().to_string_lossy()).is_none() {
            if e.file_type()?.is_dir() {
                std::fs::remove_dir_all(e.path())?;
            } else {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    Ok(())
}

/// `name-0123456789abcdef` (before any `.extension`) as `(name, hash)`.
fn split_hash(file: &str) -> Option<(&str, &str)> {
    let stem = file.split('.').next()?;
    let (name, hash) = stem.rsplit_once('-')?;
    let is_hash = hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    is_hash.then_some((name, hash))
}

/// The names of the packages a `Cargo.lock` has from a registry (`source = "registry+..."`).
fn registry_packages(lock: &str) -> HashSet<&str> {
    lock.split("[[package]]")
        .filter(|p| p.contains("\nsource = \"registry+"))
        .filter_map(|p| {
            let line = p.lines().find(|l| l.starts_with("name = "))?;
            Some(line["name = ".len()..].trim().trim_matches('"'))
        })
        .collect()
}

/// `from` at `to`: compiled artifacts hard-linked (copied when that fails), other files
/// copied, symbolic links made again (a build's may dangle), directories walked.
fn put_tree(from: &Path, to: &Path) -> io::Result<()> {
    let kind = std::fs::symlink_metadata(from)?.file_type();
    if kind.is_symlink() {
        return std::os::unix::fs::symlink(std::fs::read_link(from)?, to);
    }
    if kind.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            put_tree(&e.path(), &to.join(e.file_name()))?;
        }
        return Ok(());
    }
    let artifact = from
        .extension()
        .is_some_and(|x| ["rlib", "rmeta", "so", "a", "o"].iter().any(|a| x == *a))
        || (from.parent().is_some_and(|d| d.ends_with("deps")) && from.extension().is_none());
    if artifact && std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to)?;
    // Its time too: cargo tells a fresh unit by its files' times.
    let modified = std::fs::metadata(from)?.modified()?;
    std::fs::File::options()
        .write(true)
        .open(to)?
        .set_modified(modified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_splits_from_its_hash_only_when_it_has_one() {
        assert_eq!(
            split_hash("libserde-02d844455f25a815.rlib"),
            Some(("libserde", "02d844455f25a815"))
        );
        assert_eq!(
            split_hash("softnic-verbs-0123456789abcdef"),
            Some(("softnic-verbs", "0123456789abcdef"))
        );
        assert_eq!(split_hash("libibverbs.so"), None);
        assert_eq!(split_hash("softnic-run"), None);
        assert_eq!(split_hash("uccl-perf-0123"), None);
    }

    #[test]
    fn only_registry_packages_are_taken_from_the_lock() {
        let lock = std::fs::read_to_string(crate::run::workspace_root().join("Cargo.lock"))
            .expect("the workspace's Cargo.lock");
        let r = registry_packages(&lock);
        for name in ["serde", "libc", "ibverbs", "ibverbs-sys"] {
            assert!(r.contains(name), "{name} missing");
        }
        for name in [
            "softnic",
            "softnic-verbs",
            "softnic-preload",
            "uccl-integration",
            "xtask",
        ] {
            assert!(!r.contains(name), "{name} taken for a registry package");
        }
    }
}
