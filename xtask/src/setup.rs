//! `cargo xtask setup`: the system packages the build needs, checked and (as root) installed.
//!
//! `ibverbs-sys` configures the vendored rdma-core with cmake to generate its bindings (bindgen
//! needs libclang; the build step that follows is skipped in this workspace, see
//! `.cargo/cmake-configure-only`) and links the system `libibverbs.so`. On Debian 12 that is
//! these packages.

use crate::run::{cargo, cmd, output, status, succeeds};

/// Debian packages the workspace needs to build and test.
const PACKAGES: &[&str] = &[
    "cmake",
    "pkg-config",
    "libibverbs-dev",
    "libclang1-14",
    "libclang-common-14-dev",
    "python3",
    // `cargo xtask capture` (part of `test`): decodes softnic's RoCEv2 frames.
    "tshark",
    // `cargo xtask interop` (part of `test`): libibverbs programs run on softnic.
    "ibverbs-utils",
    "perftest",
    // `cargo xtask interop`: UCX (ucx_info, ucx_perftest) and OpenMPI over UCX on softnic.
    "ucx-utils",
    "openmpi-bin",
    "libopenmpi-dev",
    // `cargo xtask interop`: rdma_cm programs (rping, ucmatose, udaddy, rdma_server/client)
    // and libfabric's fi_pingpong on softnic's librdmacm; the rdma_cm headers for C tests.
    "rdmacm-utils",
    "libfabric-bin",
    "librdmacm-dev",
];

/// Toolchain components `cargo xtask test` uses.
const COMPONENTS: &[(&str, &str)] = &[("fmt", "rustfmt"), ("clippy", "clippy")];

/// Checks packages and toolchain components; installs what is missing when it can.
pub(crate) fn run() -> Result<(), String> {
    packages()?;
    components()
}

fn packages() -> Result<(), String> {
    if !succeeds(&mut cmd("dpkg-query", &["--version"])) {
        eprintln!(
            "xtask setup: no dpkg here, so the system packages cannot be checked; the build needs \
             the equivalents of: {}",
            PACKAGES.join(" ")
        );
        return Ok(());
    }
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let install = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !is_root() {
        return Err(format!(
            "missing system packages: {}\nrun as root:\n  {install}",
            missing.join(" ")
        ));
    }
    eprintln!("xtask setup: installing {}", missing.join(" "));
    status(&mut cmd("apt-get", &["update"]))?;
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&missing);
    status(cmd("apt-get", &args).env("DEBIAN_FRONTEND", "noninteractive"))?;
    let still: Vec<&str> = missing.into_iter().filter(|p| !installed(p)).collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!("apt-get did not install: {}", still.join(" ")))
    }
}

fn installed(package: &str) -> bool {
    output(&mut cmd(
        "dpkg-query",
        &["-W", "-f=${db:Status-Status}", package],
    ))
    .is_some_and(|s| s == "installed")
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    output(&mut cmd("id", &["-u"])).is_some_and(|uid| uid == "0")
}

fn components() -> Result<(), String> {
    let cargo = cargo();
    let missing: Vec<&str> = COMPONENTS
        .iter()
        .filter(|(sub, _)| !succeeds(&mut cmd(&cargo, &[sub, "--version"])))
        .map(|&(_, component)| component)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut args = vec!["component", "add"];
    args.extend(&missing);
    status(&mut cmd("rustup", &args))
        .map_err(|e| format!("toolchain components missing ({}): {e}", missing.join(" ")))
}
