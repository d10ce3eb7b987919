//! Seeds the fresh clone's target directory with the registry crates the workspace's own
//! build compiled, so that `fresh-clone` compiles only the workspace's crates (from the
//! clone's sources) and not every dependency a second time.
//!
//! What is seeded: the entries of `debug/{.fingerprint,build,deps}` named `<name>-<hash>`
//! whose hash is not one of a workspace package's (hard links, copies across file systems).
//! Cargo then finds them fresh where the clone resolves a dependency as the workspace did
//! (same version, features and profile), and builds any other. Nothing of the workspace's
//! own packages is seeded, nor any file without a hash (the launcher, the drop-in libraries):
//! a leftover of those could hide one that the clone's `cargo test` does not build.

use std::collections::HashSet;
use std::io;
use std::path::Path;

/// Seeds `to` (a target directory's `debug/`) from `from` (the workspace's `debug/`); the
/// workspace's packages are those of the manifest at `root`. Entries already in `to` are
/// left alone.
pub(crate) fn registry_builds(root: &Path, from: &Path, to: &Path) -> io::Result<usize> {
    let packages = workspace_packages(root);
    // The hashes of the workspace's units (a unit's fingerprint directory and its outputs
    // carry the same hash).
    let mut ours = HashSet::new();
    for e in std::fs::read_dir(from.join(".fingerprint"))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some((package, hash)) = split_hash(&name)
            && packages.iter().any(|p| p == package)
        {
            ours.insert(hash.to_string());
        }
    }
    let mut seeded = 0;
    for dir in [".fingerprint", "build", "deps"] {
        std::fs::create_dir_all(to.join(dir))?;
        for e in std::fs::read_dir(from.join(dir))? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((_, hash)) = split_hash(&name) else {
                continue;
            };
            if ours.contains(hash) || to.join(dir).join(&name).exists() {
                continue;
            }
            link_tree(&e.path(), &to.join(dir).join(&name))?;
            seeded += 1;
        }
    }
    Ok(seeded)
}

/// `name-0123456789abcdef` (before any `.extension`) as `(name, hash)`.
fn split_hash(file: &str) -> Option<(&str, &str)> {
    let stem = file.split('.').next()?;
    let (name, hash) = stem.rsplit_once('-')?;
    let is_hash = hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit());
    is_hash.then_some((name, hash))
}

/// The `[package] name` of each member the manifest at `root` lists in `members = [...]`.
fn workspace_packages(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let members = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map_or("", |(m, _)| m);
    members
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .filter_map(|dir| {
            let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).ok()?;
            let (_, package) = text.split_once("[package]")?;
            let line = package
                .lines()
                .find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split_once('=')?.1.trim().trim_matches('"').to_string())
        })
        .collect()
}

/// `from` at `to`: files hard-linked (copied when that fails), directories walked.
fn link_tree(from: &Path, to: &Path) -> io::Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            link_tree(&e.path(), &to.join(e.file_name()))?;
        }
        return Ok(());
    }
    std::fs::hard_link(from, to).or_else(|_| std::fs::copy(from, to).map(|_| ()))
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
    fn the_workspaces_packages_are_its_members_names() {
        let root = crate::run::workspace_root();
        let p = workspace_packages(&root);
        for name in ["softnic", "softnic-verbs", "uccl-integration", "xtask"] {
            assert!(p.iter().any(|n| n == name), "{name} missing from {p:?}");
        }
        assert!(!p.iter().any(|n| n == "serde"), "{p:?}");
    }
}
