//! The launcher's device view: a program under `softnic-run` finds the device's node in
//! `/dev/infiniband` and its sysfs directories as a kernel shows them, as an ordinary user too,
//! with everything else of `/dev` and `/sys/class` still there; `--no-view` shows nothing.

use std::process::Command;

/// What a shell script prints under the launcher (with `extra` launcher flags), as `nobody`
/// when `as_nobody` (through `setpriv`; only root can do that).
fn under_launcher(extra: &[&str], as_nobody: bool, script: &str) -> (bool, String) {
    let launcher = env!("CARGO_BIN_EXE_softnic-run");
    let mut c = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", launcher]);
        c
    } else {
        Command::new(launcher)
    };
    let out = c
        .arg("--quiet")
        .args(extra)
        .args(["--", "sh", "-c", script])
        .output()
        .expect("the launcher runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The checks of the view, as a script: each prints its name when it holds.
const CHECKS: &str = "\
    n=/dev/infiniband/uverbs-soft0; \
    test -c $n && echo chr; test -r $n && test -w $n && echo rw; \
    test -c /dev/null && test -d /dev/shm && echo dev-kept; \
    test -d /sys/class/net/lo && echo sys-kept; \
    s=/sys/class/infiniband/soft0; \
    echo \"types=$(cat $s/ports/1/gid_attrs/types/0),$(cat $s/ports/1/gid_attrs/types/1)\"; \
    echo \"ndev=$(cat $s/ports/1/gid_attrs/ndevs/1)\"; \
    echo \"state=$(cat $s/ports/1/state)\"; echo \"layer=$(cat $s/ports/1/link_layer)\"; \
    echo \"gid=$(cat $s/ports/1/gids/1)\"; \
    echo \"ibdev=$(cat /sys/class/infiniband_verbs/uverbs-soft0/ibdev)\"; \
    touch /dev/x 2>/dev/null || echo read-only";

fn check_view(as_nobody: bool) {
    let (ok, out) = under_launcher(&["--addr", "127.0.0.77"], as_nobody, CHECKS);
    assert!(ok, "{out}");
    for want in [
        "chr",
        "rw",
        "dev-kept",
        "sys-kept",
        "types=RoCE v2,RoCE v2",
        "ndev=lo",
        "state=4: ACTIVE",
        "layer=Ethernet",
        "gid=0000:0000:0000:0000:0000:ffff:7f00:004d",
        "ibdev=soft0",
        "read-only",
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{want:?} missing in:\n{out}"
        );
    }
}

#[test]
fn the_device_shows_in_dev_and_sys() {
    check_view(false);
}

/// As an ordinary user (the launcher makes a user namespace): only root can switch to
/// `nobody`, so elsewhere the test above is the ordinary user's already.
#[test]
fn the_device_shows_to_an_ordinary_user() {
    let root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok();
    if !root || !setpriv {
        eprintln!("not root, or no setpriv: covered by the_device_shows_in_dev_and_sys");
        return;
    }
    // `nobody` must reach the launcher and its library: skip where the build is private.
    let launcher = env!("CARGO_BIN_EXE_softnic-run");
    let (reachable, _) = under_launcher(&["--no-view"], true, "true");
    if !reachable {
        eprintln!("nobody cannot run {launcher} here: skipped");
        return;
    }
    check_view(true);
}

/// Root without `CAP_SYS_ADMIN` (a container's root) may not make a mount namespace: the
/// launcher makes a user namespace with it and shows the device all the same.
#[test]
fn the_device_shows_to_root_without_cap_sys_admin() {
    let root = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    if !root || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("not root, or no setpriv: nothing to take away");
        return;
    }
    let out = Command::new("setpriv")
        .args(["--bounding-set=-sys_admin", "--inh-caps=-sys_admin"])
        .arg(env!("CARGO_BIN_EXE_softnic-run"))
        .args([
            "--quiet",
            "--",
            "sh",
            "-c",
            "test -c /dev/infiniband/uverbs-soft0 && echo chr",
        ])
        .output()
        .expect("setpriv runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.lines().any(|l| l == "chr"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn no_view_shows_nothing() {
    let (ok, out) = under_launcher(
        &["--no-view"],
        false,
        "test -e /dev/infiniband/uverbs-soft0 || echo absent",
    );
    assert!(ok && out.lines().any(|l| l == "absent"), "{out}");
}
