//! `softnic-run`: runs a libibverbs program on softnic.
//!
//! ```text
//! softnic-run [--addr 127.0.0.N] [--loss P] [--seed S] ... -- PROGRAM [ARGS...]
//! ```
//!
//! The program runs with softnic's `libibverbs.so.1` (built next to this launcher by
//! `cargo build --release -p softnic-verbs`) in place of the system library, with softnic's
//! `librdmacm.so.1` too when it is built beside (`cargo build -p softnic-rdmacm`: rdma_cm
//! programs such as rping then connect over softnic's connection manager), and one device,
//! `soft0`, whose GID is `::ffff:127.0.0.N`, on softnic's UDP link: two programs started this
//! way (a server and a client, on one host or two) talk RoCEv2 to each other.
//!
//! It works by `LD_LIBRARY_PATH` (libibverbs is not preloaded): the program's
//! `libibverbs.so.1` is found in a directory holding softnic's library under that name, so
//! the system library is never loaded at all (with a preload it would be loaded too, with its
//! providers, and any verb softnic lacked would fall through to it with a softnic object).
//! The flags become the `SOFTNIC_*` variables the library reads, and the program replaces
//! this process (its exit status is the launcher's).
//!
//! The program also sees the device as the kernel would show it: a character device at
//! `/dev/infiniband/uverbs-soft0` and the sysfs directories of a RoCE device, in a mount
//! namespace of its own, made without root (see `softnic-run/view.rs`), and the device's
//! address among the host's interface addresses (`getifaddrs`, on an interface `lo:soft0`:
//! the crate `softnic-preload`, whose library is preloaded, after any the environment
//! preloads already, into the program and every process it starts that keeps its
//! environment). `--no-view` runs it without either. UCX needs the files to list the device;
//! libfabric's verbs provider (and so Open MPI's `mtl ofi`) needs the address to use it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser;

#[path = "softnic-run/view.rs"]
mod view;

/// Runs a libibverbs program on softnic (RoCEv2 over UDP) instead of the system library.
#[derive(Parser, Debug)]
#[command(name = "softnic-run", version)]
struct Args {
    /// The device's IPv4 address (its GID is the IPv4-mapped one); default: a free one in
    /// 127.0.0.2-254.
    #[arg(long)]
    addr: Option<std::net::Ipv4Addr>,
    /// Probability of dropping each packet the device sends.
    #[arg(long, value_parser = probability)]
    loss: Option<f64>,
    /// Probability of delaying each packet the device sends behind later ones.
    #[arg(long, value_parser = probability)]
    reorder: Option<f64>,
    /// Probability of sending each packet twice.
    #[arg(long, value_parser = probability)]
    duplicate: Option<f64>,
    /// Probability of flipping a bit of each packet (the receiver's ICRC check drops it).
    #[arg(long, value_parser = probability)]
    corrupt: Option<f64>,
    /// Seed of the fault injection.
    #[arg(long)]
    seed: Option<u64>,
    /// The port MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, value_parser = ["256", "512", "1024", "2048", "4096"])]
    mtu: Option<String>,
    /// Do not say which address the device took.
    #[arg(long)]
    quiet: bool,
    /// Print the device's counters (packets, drops, retransmissions, ICRC errors...) on
    /// standard error when the program exits.
    #[arg(long)]
    stats: bool,
    /// Do not show the device in /dev/infiniband and /sys/class, nor its address among the
    /// interface addresses (see below): run the program in this mount namespace, without
    /// preloading the library.
    #[arg(long)]
    no_view: bool,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<OsString>,
}

fn probability(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| format!("{s:?} is not a probability in 0..=1"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("softnic-run: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sets up the environment and replaces this process with the program.
fn run(args: &Args) -> Result<std::convert::Infallible, String> {
    let (libdir, rdmacm) = library_dir()?;
    if !rdmacm && links_rdmacm(&args.command[0]) {
        eprintln!(
            "softnic-run: note: {} links librdmacm, and softnic's is not built beside this \
             launcher (`cargo build [--release] -p softnic-rdmacm`): any rdma_cm call it makes \
             fails (\"rdma_create_event_channel failed\": the system's librdmacm needs the \
             kernel's rdma_cm)",
            args.command[0].to_string_lossy()
        );
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    let mut path = OsString::from(&libdir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", path);
    let mut set = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            cmd.env(name, v);
        }
    };
    set("SOFTNIC_ADDR", args.addr.map(|a| a.to_string()));
    set("SOFTNIC_LOSS", args.loss.map(|p| p.to_string()));
    set("SOFTNIC_REORDER", args.reorder.map(|p| p.to_string()));
    set("SOFTNIC_DUPLICATE", args.duplicate.map(|p| p.to_string()));
    set("SOFTNIC_CORRUPT", args.corrupt.map(|p| p.to_string()));
    set("SOFTNIC_SEED", args.seed.map(|s| s.to_string()));
    set("SOFTNIC_MTU", args.mtu.clone());
    set("SOFTNIC_ANNOUNCE", (!args.quiet).then(|| "1".to_string()));
    set("SOFTNIC_STATS", args.stats.then(|| "1".to_string()));
    if !args.no_view {
        if let Err(e) = preload(&mut cmd) {
            eprintln!(
                "softnic-run: the program runs without the device's address among the \
                 interface addresses (libfabric's verbs provider, and MPI over it, will not \
                 find the device): {e}"
            );
        }
        let dev = view::Device {
            name: "soft0".into(),
            addr: args.addr,
        };
        if let Err(e) = view::enter(&dev) {
            eprintln!(
                "softnic-run: the program runs without /dev/infiniband/uverbs-soft0 and \
                 /sys/class/infiniband/soft0 (programs that look for them, such as UCX, will \
                 not see the device): {e}"
            );
        }
    }
    let e = cmd.exec();
    Err(format!("cannot run {:?}: {e}", args.command[0]))
}

/// Preloads softnic-preload's library into the program, after any library already preloaded
/// (AddressSanitizer's runtime must come first); AddressSanitizer is told not to require its
/// runtime first in the whole list (`verify_asan_link_order=0`: the library replaces no
/// function it intercepts but `getifaddrs`, whose next definition it calls).
fn preload(cmd: &mut Command) -> Result<(), String> {
    let mut list = std::env::var_os("LD_PRELOAD")
        .filter(|p| !p.is_empty())
        .unwrap_or_default();
    if list.to_string_lossy().contains("libsoftnic_preload.so") {
        // A launcher under a launcher: the outer one's is there already.
        return Ok(());
    }
    let lib = newest("libsoftnic_preload.so")
        .ok_or(
            "libsoftnic_preload.so is not built beside this launcher nor in deps/ there \
             (`cargo build -p softnic-verbs` builds it)",
        )?
        .join("libsoftnic_preload.so");
    let text = lib.to_string_lossy();
    if text.contains([' ', ':']) {
        return Err(format!(
            "{text} has a space or a colon, which LD_PRELOAD cannot hold"
        ));
    }
    if !list.is_empty() {
        list.push(":");
    }
    list.push(&lib);
    cmd.env("LD_PRELOAD", list);
    let asan = std::env::var("ASAN_OPTIONS").unwrap_or_default();
    if !asan.contains("verify_asan_link_order") {
        let sep = if asan.is_empty() { "" } else { ":" };
        cmd.env(
            "ASAN_OPTIONS",
            format!("{asan}{sep}verify_asan_link_order=0"),
        );
    }
    Ok(())
}

/// Whether `program` (a path, or a name looked up in `PATH`) needs `librdmacm.so.1`: its
/// dynamic section names it (the name is in its string table, which lies near the start of
/// the file: only the first 16 MiB are read). False if it cannot be read.
fn links_rdmacm(program: &std::ffi::OsStr) -> bool {
    let path = Path::new(program);
    let found = if path.components().count() > 1 {
        Some(path.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(path))
                .find(|f| f.is_file())
        })
    };
    let needle = b"librdmacm.so.1\0";
    let head = |f: PathBuf| {
        use std::io::Read;
        let mut b = Vec::new();
        std::fs::File::open(f)
            .and_then(|file| file.take(16 << 20).read_to_end(&mut b))
            .map(|_| b)
            .ok()
    };
    found
        .and_then(head)
        .is_some_and(|b| b.windows(needle.len()).any(|w| w == needle))
}

/// A directory whose `libibverbs.so.1` is softnic's library: `softnic-verbs/` beside the
/// library, made (a link to `../libibverbs.so`) on first use, and whether softnic's
/// `librdmacm.so.1` is there too. The library is next to this launcher (`cargo build`), or in
/// `deps/` there (`cargo test` builds it only there); of the two, the newer.
fn library_dir() -> Result<(PathBuf, bool), String> {
    let Some(base) = newest("libibverbs.so") else {
        let exe = std::env::current_exe().map_err(|e| format!("finding this launcher: {e}"))?;
        return Err(format!(
            "{} is missing: build it with `cargo build -p softnic-verbs` (it is built with \
             this launcher)",
            exe.with_file_name("libibverbs.so").display()
        ));
    };
    let dir = base.join("softnic-verbs");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    link(&dir, "libibverbs.so.1", "libibverbs.so")?;
    // softnic's librdmacm (crates/softnic-rdmacm), when it is built: rdma_cm programs then
    // connect over softnic's connection manager; without it they find the system's, which
    // needs the kernel's rdma_cm and fails.
    let rdmacm = base.join("librdmacm.so").exists();
    if rdmacm {
        link(&dir, "librdmacm.so.1", "librdmacm.so")?;
    }
    Ok((dir, rdmacm))
}

/// Of this launcher's directory and `deps/` there, the one whose `file` is newer (cargo puts
/// a package's libraries in `deps/`, and copies them beside the binaries only when the
/// package itself is built); `None` if neither has it.
fn newest(file: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.to_path_buf();
    let modified = |dir: &Path| {
        std::fs::metadata(dir.join(file))
            .and_then(|m| m.modified())
            .ok()
    };
    let deps = bin.join("deps");
    match (modified(&bin), modified(&deps)) {
        (Some(a), Some(b)) if b > a => Some(deps),
        (None, Some(_)) => Some(deps),
        (Some(_), _) => Some(bin),
        (None, None) => None,
    }
}

/// `dir/name`, a link to `../target`, made unless it is there.
fn link(dir: &Path, name: &str, target: &str) -> Result<(), String> {
    let link = dir.join(name);
    if link.exists() {
        return Ok(());
    }
    match std::os::unix::fs::symlink(Path::new("..").join(target), &link) {
        Ok(()) => Ok(()),
        // Another launcher made it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("linking {}: {e}", link.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_names_librdmacm_in_its_dynamic_section_links_it() {
        let dir = std::env::temp_dir().join(format!("softnic-run-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (yes, no) = (dir.join("yes"), dir.join("no"));
        std::fs::write(&yes, b"\x7fELF...libibverbs.so.1\0librdmacm.so.1\0...").unwrap();
        std::fs::write(&no, b"\x7fELF...libibverbs.so.1\0librdmacm.so.10...").unwrap();
        assert!(links_rdmacm(yes.as_os_str()));
        assert!(!links_rdmacm(no.as_os_str()));
        assert!(!links_rdmacm(dir.join("missing").as_os_str()));
        assert!(!links_rdmacm(std::ffi::OsStr::new(
            "no-such-program-on-the-path"
        )));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
