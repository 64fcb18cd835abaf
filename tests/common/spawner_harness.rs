//! For the `harness = false` test binaries that drive the spawner directly (`spawner`,
//! `pool`, `egress_kernel`): the spawner must be forked while the process is still
//! single-threaded, before libtest-mimic or tokio start a thread, so each binary's `main`
//! sets up here first, then runs its trials one at a time.

use std::sync::OnceLock;

use codebox::execution::Host;
use codebox::profile::Profile;
use codebox::rootfs;
use codebox::runtime::Language;
use codebox::sandbox::IdMapping;
use codebox::spawner::{self, SpawnSpec, SpawnerClient};
use libtest_mimic::Arguments;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
static CLIENT: OnceLock<SpawnerClient> = OnceLock::new();

/// The arguments of this run (trials one at a time) and the host its sandboxes run on.
/// When the host lacks the rootfs, or `also` reports something else missing, runs no
/// trial and exits after printing why — unless `CODEBOX_TEST_STRICT=1`, where that is a
/// failure. `what` names the suite in those messages.
pub fn arguments_and_host(
    what: &str,
    also: impl FnOnce() -> Result<(), String>,
) -> (Arguments, Host) {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let setup = (|| -> Result<Host, String> {
        also()?;
        let dir = rootfs::locate(None).map_err(|e| e.to_string())?;
        let rootfs = rootfs::verify(&dir, rootfs::default_stamp_dir().as_deref())
            .map_err(|e| e.to_string())?;
        Ok(Host::new(rootfs, IdMapping::for_current_process(65534)))
    })();
    match setup {
        Ok(host) => (args, host),
        Err(e) if super::strict() => {
            panic!("{what} need the rootfs and the kernel's features: {e}")
        }
        Err(e) => {
            eprintln!("SKIP {what}: {e}");
            libtest_mimic::run(&args, vec![]).exit();
        }
    }
}

/// Forks the spawner for `host`, then builds the tokio runtime and the client that
/// [`block_on`] and [`client`] use; returns the spawner's pid.
///
/// # Safety
/// The process must be single-threaded (no runtime, no test harness thread yet).
pub unsafe fn start_spawner(host: &Host) -> nix::unistd::Pid {
    // SAFETY: the caller guarantees no other thread exists.
    let (pid, sock) = unsafe { spawner::start(host) }.expect("spawner starts");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt
        .block_on(async { SpawnerClient::new(sock) })
        .expect("client");
    let _ = RUNTIME.set(rt);
    let _ = CLIENT.set(client);
    pid
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RUNTIME.get().expect("runtime").block_on(f)
}

pub fn client() -> &'static SpawnerClient {
    CLIENT.get().expect("client")
}

/// A cold spawn of `language` under the default profile, with nothing else.
pub fn spec(language: Language) -> SpawnSpec {
    SpawnSpec {
        language,
        profile: "default".into(),
        limits: Profile::load("default").unwrap().limits,
        workspace: None,
        servers: None,
        skills: None,
        workspace_mount: None,
        network: None,
        packages: None,
        pooled: false,
    }
}
