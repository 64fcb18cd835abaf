//! The guest init's system steps: mounts, modules, devices, clock, entropy. Each is one
//! or a few system calls on the guest's own kernel; nothing here runs on the host.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};

/// Per-step times since the init started, for the console.
pub struct BootClock {
    start: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl BootClock {
    pub fn start() -> Self {
        BootClock {
            start: Instant::now(),
            steps: Vec::new(),
        }
    }

    pub fn step(&mut self, name: &'static str) {
        self.steps.push((name, self.start.elapsed()));
    }

    pub fn summary(&self) -> String {
        self.steps
            .iter()
            .map(|(n, d)| format!("{n} {:.0} ms", d.as_secs_f64() * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn mount_fs(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    fs::create_dir_all(target).with_context(|| format!("creating {target}"))?;
    mount(Some(source), target, Some(fstype), flags, data)
        .with_context(|| format!("mounting {fstype} on {target}"))
}

/// Moves the root off the initramfs's own mount: the kernel refuses `pivot_root` away
/// from that mount (it has no parent), and every sandbox pivots. A recursive bind of `/`
/// moved onto `/` (what `switch_root` does with a new root) is a mount like any other.
pub fn leave_initramfs_root() -> Result<()> {
    fs::create_dir_all("/newroot").context("creating /newroot")?;
    mount(
        Some("/"),
        "/newroot",
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .context("binding / on /newroot")?;
    nix::unistd::chdir("/newroot").context("entering /newroot")?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .context("moving /newroot onto /")?;
    nix::unistd::chroot(".").context("chroot")?;
    nix::unistd::chdir("/").context("chdir /")?;
    Ok(())
}

/// `/proc`, `/sys`, `/dev` (devtmpfs: the kernel makes the device nodes), `/tmp`.
pub fn mount_early() -> Result<()> {
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount_fs("proc", "/proc", "proc", nodev, None)?;
    mount_fs("sysfs", "/sys", "sysfs", nodev, None)?;
    mount_fs(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755"),
    )?;
    mount_fs("tmpfs", "/tmp", "tmpfs", nodev, Some("mode=1777,size=16m"))
}

/// The console as fds 0, 1 and 2 (the initramfs has no `/dev/console` node for the
/// kernel to open before `/init`).
pub fn console_stdio() {
    if let Ok(console) = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/console")
    {
        for fd in 0..3 {
            // SAFETY: dup2 between two descriptor numbers; no memory is passed.
            unsafe { libc::dup2(console.as_raw_fd(), fd) };
        }
    }
}

/// Loads every module of `dir/order`, in order; returns how many.
pub fn load_modules(dir: &Path) -> Result<usize> {
    let order = fs::read_to_string(dir.join("order")).context("reading the module order")?;
    let mut n = 0;
    for name in order.lines().filter(|l| !l.is_empty()) {
        let path = dir.join(name);
        let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let params = c"";
        // SAFETY: finit_module(fd, params, flags): an open module file, a NUL-terminated
        // empty parameter string and no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_finit_module,
                file.as_raw_fd(),
                params.as_ptr(),
                0 as libc::c_int,
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // A module the kernel already has (built in, or loaded) is fine.
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e).with_context(|| format!("loading {name}"));
            }
        }
        n += 1;
    }
    Ok(n)
}

/// The virtio-serial ports by name (`/sys/class/virtio-ports/vportNpM/name`) → their
/// device nodes.
fn ports_by_name() -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let Ok(dir) = fs::read_dir("/sys/class/virtio-ports") else {
        return out;
    };
    for e in dir.flatten() {
        let node = e.file_name();
        if let Ok(name) = fs::read_to_string(e.path().join("name")) {
            let dev = Path::new("/dev").join(&node);
            if dev.exists() {
                out.insert(name.trim().to_string(), dev);
            }
        }
    }
    out
}

/// Waits until the rootfs disk and every port in `names` exist; returns the ports.
pub fn wait_for_devices(names: &[&str], limit: Duration) -> Result<BTreeMap<String, PathBuf>> {
    let start = Instant::now();
    loop {
        let ports = ports_by_name();
        if Path::new("/dev/vda").exists() && names.iter().all(|n| ports.contains_key(*n)) {
            return Ok(ports);
        }
        if start.elapsed() > limit {
            bail!(
                "after {limit:?}: disk {}, ports {:?}",
                if Path::new("/dev/vda").exists() {
                    "present"
                } else {
                    "missing"
                },
                ports.keys().collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The rootfs image, read-only, at `target`.
pub fn mount_rootfs(target: &str) -> Result<()> {
    mount_fs(
        "/dev/vda",
        target,
        "erofs",
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        None,
    )
}

/// cgroup v2 at `/sys/fs/cgroup`, where the sandbox code finds it.
pub fn mount_cgroup2() -> Result<()> {
    mount_fs(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )
}

/// Opens a port for reading and writing, non-blocking (the relay polls it).
pub fn open_port(ports: &BTreeMap<String, PathBuf>, name: &str) -> Result<File> {
    let path = ports.get(name).with_context(|| format!("no port {name}"))?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// `CLOCK_REALTIME` from the host's time.
pub fn set_clock(time_ns: u64) -> Result<()> {
    let ts = libc::timespec {
        tv_sec: (time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads a valid timespec on this stack frame.
    let r = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// `RNDADDENTROPY`: `_IOW('R', 0x03, int[2])`.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `RNDRESEEDCRNG`: `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes the host's seed (hex) into the kernel's pool, credited, and makes the kernel's
/// generator reseed from the pool now: every later `getrandom` of this guest (and of a
/// clone restored from it) derives from it.
pub fn reseed(seed_hex: &str) -> Result<()> {
    let seed = decode_hex(seed_hex).context("the seed is not hex")?;
    if seed.len() < 32 || seed.len() > 512 {
        bail!("a seed of {} bytes (32 to 512 expected)", seed.len());
    }
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&((seed.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(seed.len() as i32).to_ne_bytes());
    info.extend_from_slice(&seed);
    let random = File::open("/dev/urandom").context("opening /dev/urandom")?;
    // SAFETY: RNDADDENTROPY reads a rand_pool_info of 8 + buf_size bytes from `info`,
    // which holds exactly that.
    let r = unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("RNDADDENTROPY");
    }
    // SAFETY: RNDRESEEDCRNG takes no argument.
    let r = unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("RNDRESEEDCRNG");
    }
    Ok(())
}

pub fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_seeds_decode() {
        assert_eq!(decode_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex("é0"), None);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let ioc = |dir: u64, ty: u8, nr: u64, size: u64| {
            (dir << 30 | size << 16 | (ty as u64) << 8 | nr) as libc::c_ulong
        };
        assert_eq!(RNDADDENTROPY, ioc(1, b'R', 3, 8));
        assert_eq!(RNDRESEEDCRNG, ioc(0, b'R', 7, 0));
    }
}
