//! A child forked after its parent used the device (`tests/c/fork.c`, built with the system's
//! C compiler and run under `softnic-run`): it gets a device of its own, as a child opens a
//! context of its own on a kernel, and none of its parent's objects. Without a C compiler or
//! libibverbs's headers the tests are skipped, saying so.

use std::path::Path;
use std::process::Command;

/// `tests/c/fork.c` built into the test's target directory for the test of `mode` (each test
/// its own copy: they run at once), or `None` (saying why).
fn build(mode: &str) -> Option<std::path::PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/fork.c");
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipped: no <infiniband/verbs.h> (apt-get install libibverbs-dev)");
        return None;
    }
    let exe = std::env::current_exe()
        .expect("this test binary")
        .with_file_name(format!("fork-c-{mode}-{}", std::process::id()));
    let built = match Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(["-libverbs", "-lpthread"])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: no C compiler ({e})");
            return None;
        }
    };
    assert!(
        built.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    Some(exe)
}

/// `fork <mode>` under `softnic-run` with its device on `addr`: it must say "ok" and exit 0.
fn run(mode: &str, addr: &str) {
    let Some(exe) = build(mode) else {
        return;
    };
    let out = Command::new("timeout")
        .args([
            "120",
            env!("CARGO_BIN_EXE_softnic-run"),
            "--addr",
            addr,
            "--",
        ])
        .arg(&exe)
        .arg(mode)
        .output()
        .expect("running softnic-run");
    let _ = std::fs::remove_file(&exe);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("ok"),
        "{}\n{text}",
        out.status
    );
}

/// The child opens the device from the list its parent got before the fork, on an address of
/// its own (its parent holds `--addr`), and exchanges 20 messages with its parent's UD QP;
/// a poll of its parent's CQ and a PD on its parent's context fail in the child.
#[test]
fn a_forked_child_opens_a_device_of_its_own() {
    run("echo", "127.0.29.1");
}

/// 20 children forked while another thread of the parent makes and destroys objects without
/// pause each open a device and send to themselves: none waits for a lock held by a thread it
/// does not have (each dies by `alarm` if it does).
#[test]
fn a_child_forked_while_objects_are_made_never_waits() {
    run("busy", "127.0.29.2");
}
