//! Running commands: echo them, fail with the command line in the message.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A command to run from the workspace root, echoed before it runs.
pub(crate) fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args).current_dir(workspace_root());
    c
}

/// Runs `c` with inherited stdio; an error names the command and its exit status.
pub(crate) fn status(c: &mut Command) -> Result<(), String> {
    let line = describe(c);
    eprintln!("$ {line}");
    let st = c
        .status()
        .map_err(|e| format!("cannot start `{line}`: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("`{line}` failed ({st})"))
    }
}

/// Whether `c` runs and exits with success, silently (for probes such as `cargo nextest --version`).
pub(crate) fn succeeds(c: &mut Command) -> bool {
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The standard output of `c`, trimmed, or `None` if it cannot run or fails.
pub(crate) fn output(c: &mut Command) -> Option<String> {
    let out = c.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The `cargo` that runs this task runner (so toolchain overrides carry through).
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// `cargo` with `args`, from the workspace root, without incremental compilation: every cargo
/// the tasks run is a whole build (CI's clean clone, a release build), where the incremental
/// cache only costs time and about a gigabyte of disk.
pub(crate) fn cargo_cmd(args: &[&str]) -> Command {
    let mut c = cmd(&cargo(), args);
    c.env("CARGO_INCREMENTAL", "0");
    c
}

/// The workspace root: the parent of this crate's directory.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

/// A binary built into `target/<dir>` (`CARGO_TARGET_DIR` honoured), e.g. `release`.
pub(crate) fn target_bin(dir: &str, name: &str) -> String {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join(dir).join(name).to_string_lossy().into_owned()
}

fn describe(c: &Command) -> String {
    let mut line = String::new();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            line.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    line.push_str(&c.get_program().to_string_lossy());
    for a in c.get_args() {
        line.push(' ');
        line.push_str(&a.to_string_lossy());
    }
    line
}

/// Builds every target of the workspace (debug), as one feature resolution: what the tests,
/// `capture` and `interop` run (the `softnic-run` launcher and the drop-in libibverbs,
/// `uccl-perf`, softnic's `check_capture` example) and the tests themselves. Building these
/// one package at a time resolved features differently each time and rebuilt much of the
/// workspace for each (four minutes of a cold `xtask test`); after this, nextest and the later
/// steps find everything built.
pub(crate) fn build_workspace() -> Result<(), String> {
    status(&mut cargo_cmd(&[
        "build",
        "--workspace",
        "--all-targets",
        "--locked",
    ]))
}
