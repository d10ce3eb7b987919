//! The device as the kernel would show it: `/dev/infiniband/uverbs-<dev>` and the sysfs
//! directories of a RoCE device, in a mount namespace of the program's own, made without root.
//!
//! Some programs look for a device's files before they use its verbs: UCX lists an InfiniBand
//! device only if `/dev/infiniband/<dev_name>` is a character device the user can open for
//! reading and writing (`uct_ib_device_is_accessible`), and reads the GID types and the network
//! device of a RoCE port from `/sys/class/infiniband/<name>/ports/1/gid_attrs/` (without them it
//! takes every GID for RoCE v1). softnic's library serves the verbs; this module makes the files.
//!
//! How: the launcher enters a new mount namespace (inside a new user namespace when it does not
//! run as root: the kernel lets any user do that where user namespaces are on; as root a mount
//! namespace alone, or with a user namespace where root may not make one, as in a container
//! without `CAP_SYS_ADMIN`), makes every mount private to it, and *shadows* `/dev` and `/sys/class`: a
//! read-only tmpfs over each holds a bind mount of every original entry (so `/dev/null`,
//! `/dev/shm`, `/dev/pts`, `/sys/class/net`... are what they were) plus softnic's entries:
//! `/dev/infiniband/uverbs-<dev>` is `/dev/null` bound in (a real character device anyone may
//! open for reading and writing; softnic's library never opens it, UCX only checks it), and
//! `/sys/class/infiniband/<dev>` and `/sys/class/infiniband_verbs/uverbs-<dev>` are files with
//! what rxe's have (node type, GUIDs, port state and rate, GIDs when the address is known, GID
//! types `RoCE v2`, network device `lo`, the P_Key). Nothing outside the program's namespace
//! changes, and its children (an MPI launcher's ranks) share it. In a user namespace the user
//! keeps its own uid and gid (no capability survives the `exec`), and files of other users show
//! as owned by `nobody`.
//!
//! The other way considered: interposing the checks with a preload (`stat`, `access`, `open`,
//! `opendir`... for these paths). It needs no namespace, but has to catch every entry point a
//! program may take (`stat`, `stat64`, `__xstat`, `statx`, `fstatat`, `faccessat2`, `openat`,
//! raw system calls from static or Go binaries), changes every program of the process tree, and
//! a file read through a path it missed is simply absent. The namespace shows real files to
//! every reader by every path. Where user namespaces are off (`kernel.unprivileged_userns_clone
//! = 0`, `user.max_user_namespaces = 0`, or an AppArmor policy such as Ubuntu's
//! `apparmor_restrict_unprivileged_userns`), the launcher says so and runs the program without
//! the view: verbs programs run as before, UCX lists no InfiniBand device. Run as root then, or
//! have an administrator make the node once (`mkdir /dev/infiniband; ln -s /dev/null
//! /dev/infiniband/uverbs-soft0`: UCX follows the link).

use std::fs;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::Path;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;

/// The device the view shows.
pub(crate) struct Device {
    /// Its name (`soft0`).
    pub(crate) name: String,
    /// Its IPv4 address, when chosen before the program starts (its GIDs and GUIDs follow).
    pub(crate) addr: Option<Ipv4Addr>,
}

/// Enters a mount namespace of this process's own (in a user namespace unless root) in which
/// `/dev` and `/sys/class` show `dev` as the kernel shows a device. On an error nothing is
/// shadowed (the namespace may have been entered: it then looks as the one left).
pub(crate) fn enter(dev: &Device) -> Result<(), String> {
    let uid = rustix::process::getuid();
    let gid = rustix::process::getgid();
    // Root makes a mount namespace alone; where it may not (a container without
    // CAP_SYS_ADMIN), or for any other user, a user namespace with it.
    let own_userns = !uid.is_root() || unshare(UnshareFlags::NEWNS).is_err();
    if own_userns {
        unshare(UnshareFlags::NEWUSER | UnshareFlags::NEWNS).map_err(|e| {
            format!(
                "cannot make a user and mount namespace ({e}): user namespaces look off here \
                 (kernel.unprivileged_userns_clone, user.max_user_namespaces, a seccomp or \
                 AppArmor policy)"
            )
        })?;
        let write = |file: &str, what: String| {
            fs::write(file, &what).map_err(|e| format!("writing {what:?} to {file}: {e}"))
        };
        write("/proc/self/setgroups", "deny".into())?;
        write("/proc/self/uid_map", format!("{0} {0} 1", uid.as_raw()))?;
        write("/proc/self/gid_map", format!("{0} {0} 1", gid.as_raw()))?;
    }
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| format!("making the mounts private: {e}"))?;
    let node = format!("uverbs-{}", dev.name);
    shadow(Path::new("/dev"), &["infiniband"], |dev_dir, original| {
        let ib = dev_dir.join("infiniband");
        mkdir(&ib)?;
        let target = ib.join(&node);
        touch(&target)?;
        bind(&original.join("null"), &target)
    })?;
    let shown = shadow(
        Path::new("/sys/class"),
        &["infiniband", "infiniband_verbs"],
        |class, _| sysfs(class, dev, &node),
    );
    if let Err(e) = shown {
        // Leave /dev as it was too: the view is whole or absent.
        let _ = rustix::mount::unmount("/dev", UnmountFlags::DETACH);
        return Err(e);
    }
    Ok(())
}

/// `unshare(flags)`.
fn unshare(flags: UnshareFlags) -> rustix::io::Result<()> {
    // SAFETY: the flags callers pass never include FILES, so no descriptor table is unshared
    // (the only thing that makes `unshare` unsafe); the launcher runs one thread, as NEWUSER
    // requires.
    unsafe { rustix::thread::unshare_unsafe(flags) }
}

/// Mounts a tmpfs over `dir` holding a bind mount of each original entry (each symbolic link
/// made again), except those named in `ours`, which `add` makes (it is given the directory and
/// a path to the original one); then makes the tmpfs read-only.
fn shadow(
    dir: &Path,
    ours: &[&str],
    add: impl FnOnce(&Path, &Path) -> Result<(), String>,
) -> Result<(), String> {
    let fd = fs::File::open(dir).map_err(|e| format!("opening {}: {e}", dir.display()))?;
    // The original directory, still reachable through the descriptor once covered.
    let original = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
    let entries: Vec<_> = fs::read_dir(&original)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("listing {}: {e}", dir.display()))?;
    rustix::mount::mount("tmpfs", dir, "tmpfs", MountFlags::NOSUID, c"mode=755")
        .map_err(|e| format!("mounting a tmpfs over {}: {e}", dir.display()))?;
    let filled = (|| {
        for e in &entries {
            let name = e.file_name();
            if ours.iter().any(|o| name == *o) {
                continue;
            }
            let (from, to) = (original.join(&name), dir.join(&name));
            let kind = e
                .file_type()
                .map_err(|e| format!("reading {}: {e}", to.display()))?;
            if kind.is_symlink() {
                let link =
                    fs::read_link(&from).map_err(|e| format!("reading {}: {e}", to.display()))?;
                std::os::unix::fs::symlink(&link, &to)
                    .map_err(|e| format!("linking {}: {e}", to.display()))?;
                continue;
            }
            if kind.is_dir() {
                mkdir(&to)?;
            } else {
                touch(&to)?;
            }
            bind(&from, &to)?;
        }
        add(dir, &original)?;
        rustix::mount::mount_remount(dir, MountFlags::RDONLY | MountFlags::NOSUID, "mode=755")
            .map_err(|e| format!("making {} read-only: {e}", dir.display()))
    })();
    if filled.is_err() {
        let _ = rustix::mount::unmount(dir, UnmountFlags::DETACH);
    }
    filled
}

/// The sysfs directories of a RoCE device as rxe has them, under `class` (`/sys/class`).
fn sysfs(class: &Path, dev: &Device, node: &str) -> Result<(), String> {
    let ib = class.join("infiniband").join(&dev.name);
    let port = ib.join("ports/1");
    for d in [
        &port.join("gids"),
        &port.join("gid_attrs/types"),
        &port.join("gid_attrs/ndevs"),
        &port.join("pkeys"),
    ] {
        fs::create_dir_all(d).map_err(|e| format!("making {}: {e}", d.display()))?;
    }
    // The GUIDs: a modified EUI-64 of the address, as `ibv_get_device_guid` gives.
    let guid = dev.addr.map_or_else(
        || "0000:0000:0000:0000".to_string(),
        |a| {
            let o = a.octets();
            format!(
                "0200:{:02x}ff:fe{:02x}:{:02x}{:02x}",
                o[0], o[1], o[2], o[3]
            )
        },
    );
    let mut files = vec![
        (ib.join("node_type"), "1: CA".to_string()),
        (ib.join("node_guid"), guid.clone()),
        (ib.join("sys_image_guid"), guid),
        (ib.join("node_desc"), format!("softnic {}", dev.name)),
        (ib.join("fw_ver"), "0.1".into()),
        (ib.join("hw_rev"), "1".into()),
        (ib.join("hca_type"), "softnic".into()),
        (port.join("state"), "4: ACTIVE".into()),
        (port.join("phys_state"), "5: LinkUp".into()),
        (port.join("link_layer"), "Ethernet".into()),
        (port.join("rate"), "100 Gb/sec (4X EDR)".into()),
        (port.join("lid"), "0x0".into()),
        (port.join("sm_lid"), "0x0".into()),
        (port.join("sm_sl"), "0".into()),
        (port.join("lid_mask_count"), "0".into()),
        (port.join("cap_mask"), "0x00010000".into()),
        (port.join("pkeys/0"), "0xffff".into()),
    ];
    // Index 0 the link-local GID, index 1 the IPv4-mapped one (the library's table).
    for i in 0..2 {
        files.push((port.join(format!("gid_attrs/types/{i}")), "RoCE v2".into()));
        files.push((port.join(format!("gid_attrs/ndevs/{i}")), "lo".into()));
        if let Some(a) = dev.addr {
            let o = a.octets();
            let high = if i == 0 {
                "fe80:0000:0000:0000"
            } else {
                "0000:0000:0000:0000"
            };
            files.push((
                port.join(format!("gids/{i}")),
                format!(
                    "{high}:0000:ffff:{:02x}{:02x}:{:02x}{:02x}",
                    o[0], o[1], o[2], o[3]
                ),
            ));
        }
    }
    let verbs = class.join("infiniband_verbs");
    let uverbs = verbs.join(node);
    fs::create_dir_all(&uverbs).map_err(|e| format!("making {}: {e}", uverbs.display()))?;
    files.push((verbs.join("abi_version"), "6".into()));
    files.push((uverbs.join("ibdev"), dev.name.clone()));
    files.push((uverbs.join("abi_version"), "1".into()));
    // The numbers of the node bound at /dev/infiniband (it is /dev/null).
    files.push((uverbs.join("dev"), "1:3".into()));
    for (path, text) in files {
        fs::write(&path, format!("{text}\n"))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Makes a directory (mode 755).
fn mkdir(path: &Path) -> Result<(), String> {
    fs::create_dir(path).map_err(|e| format!("making {}: {e}", path.display()))
}

/// Makes an empty file to bind something onto.
fn touch(path: &Path) -> Result<(), String> {
    fs::File::create(path)
        .map(drop)
        .map_err(|e| format!("making {}: {e}", path.display()))
}

/// Binds `from` (with what is mounted under it) onto `to`.
fn bind(from: &Path, to: &Path) -> Result<(), String> {
    rustix::mount::mount_bind_recursive(from, to)
        .map_err(|e| format!("binding {} onto {}: {e}", from.display(), to.display()))
}
