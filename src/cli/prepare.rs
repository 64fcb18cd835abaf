//! What `run` and `exec` do before their sandbox: load the profile (which compiles its
//! seccomp filter), locate and verify the rootfs, discover the cgroup hierarchies. Each
//! step is timed in one "prepare steps" debug event.

use std::path::Path;

use anyhow::bail;

use codebox::execution::Host;
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::sandbox::IdMapping;
use codebox::stopwatch::Stopwatch;

/// A loaded profile and a host ready to spawn sandboxes.
pub struct Prepared {
    pub profile: Profile,
    pub host: Host,
}

/// Loads `profile`, verifies the rootfs (`rootfs`, else `$CODEBOX_ROOTFS` or next to the
/// executable) and discovers cgroups; `root_host_id` is the host id the sandbox user maps
/// to when running as root.
pub fn prepare(
    profile: &str,
    rootfs: Option<&Path>,
    root_host_id: u32,
) -> anyhow::Result<Prepared> {
    if root_host_id == 0 {
        bail!("--root-host-id 0 would make the sandbox user host root; pick an unprivileged id");
    }
    let mut sw = Stopwatch::start();
    let profile = Profile::load(profile)?;
    let profile_us = sw.lap_us();
    let rootfs_dir = rootfs::locate(rootfs)?;
    let rootfs_locate_us = sw.lap_us();
    let rootfs = rootfs::verify(&rootfs_dir, rootfs::default_stamp_dir().as_deref())?;
    let rootfs_verify_us = sw.lap_us();
    tracing::debug!(
        path = %rootfs.path.display(),
        verification = ?rootfs.verification,
        "rootfs verified"
    );
    let host = Host::new(rootfs, IdMapping::for_current_process(root_host_id));
    tracing::debug!(
        profile_us,
        rootfs_locate_us,
        rootfs_verify_us,
        host_us = sw.lap_us(),
        total_us = sw.total_us(),
        "prepare steps"
    );
    Ok(Prepared { profile, host })
}
