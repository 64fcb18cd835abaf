//! One execution on a fresh microVM: `codebox run --backend microvm`.
//!
//! The same request as the namespace backend's (`execution::execute`), the same boot
//! frame on fd 3 and the same capture (caps, head and tail, streaming to the sink), so
//! the two backends print the same thing for the same program. Steps: locate and verify
//! the guest tree, launch the jailed QEMU (from this single-threaded process), then on a
//! current-thread runtime: boot handshake, start, boot frame, capture, the VM's ending.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::image::GuestImage;
use super::qemu::{Accel, Machine, PortFds, Ram};
use super::vm::{MicroVmSandbox, VmEnding};
use super::wire::RunSpec;
use super::{jail, vm, Error};
use crate::execution::{ExecutionRequest, ExecutionResult, Host};
use crate::runtime::{self, Language};
use crate::sandbox::{self, Captured, Limits, OutputSink, ProgramStatus, SecurityPolicy};
use crate::spawner::Stream;

/// Guest RAM beyond the program's memory limit: the guest kernel, the initramfs (the
/// guest init binary), the page cache of what the program reads.
pub const GUEST_OVERHEAD_MIB: u64 = 192;
/// Guest RAM when the program has no memory limit.
pub const DEFAULT_PROGRAM_MIB: u64 = 512;
/// From QEMU's start to the guest init's `Hello`.
pub const BOOT_LIMIT: Duration = Duration::from_secs(60);

/// The machine for a program with `limits`.
pub fn machine_for(limits: &Limits, accel: Accel) -> Machine {
    let program_mib = limits
        .memory_bytes
        .map(|b| b.div_ceil(1024 * 1024))
        .unwrap_or(DEFAULT_PROGRAM_MIB);
    let vcpus = limits
        .cpu_millicores
        .map(|m| m.div_ceil(1000).clamp(1, 8) as u32)
        .unwrap_or(1);
    Machine {
        accel,
        memory_mib: program_mib + GUEST_OVERHEAD_MIB,
        vcpus,
        tb_size_mib: jail::TB_SIZE_MIB,
        ram: Ram::Anonymous,
        incoming: false,
        tsc_khz: super::tsc::host_khz(),
        // Set by jail::launch.
        fds: PortFds {
            qmp: -1,
            control: -1,
            stdout: -1,
            stderr: -1,
            channel: -1,
        },
    }
}

/// What the guest starts for `language` under `policy` and `limits`.
pub fn run_spec(
    language: Language,
    limits: &Limits,
    policy: &SecurityPolicy,
) -> Result<RunSpec, Error> {
    let mut program = language.program().map_err(Error::Sandbox)?;
    if language == Language::Python {
        program
            .set_env(&runtime::thread_env(limits.cpu_millicores))
            .map_err(Error::Sandbox)?;
    }
    let text = |c: &std::ffi::CString| c.to_string_lossy().into_owned();
    let seccomp = policy
        .seccomp
        .as_ref()
        .map(|f| f.policy().to_string())
        .ok_or_else(|| Error::Unsupported("a sandbox without a seccomp filter".into()))?;
    Ok(RunSpec {
        path: text(&program.path),
        argv: program.argv.iter().map(text).collect(),
        env: program.env.iter().map(text).collect(),
        cwd: text(&program.cwd),
        limits: limits.clone(),
        seccomp,
        landlock: policy.landlock,
        network: policy.network,
    })
}

/// Runs `request` in a fresh microVM. Single-threaded callers only (the jail is cloned
/// from this process), like `execution::execute`.
pub fn execute(
    host: &Host,
    image: &GuestImage,
    accel: Accel,
    request: &ExecutionRequest,
    sink: &mut dyn OutputSink,
) -> Result<(ExecutionResult, VmEnding), Error> {
    if request.code.len() > runtime::MAX_CODE_BYTES {
        return Err(Error::Unsupported(format!(
            "a program of {} bytes; the limit is {}",
            request.code.len(),
            runtime::MAX_CODE_BYTES
        )));
    }
    runtime::validate_files(&request.files, runtime::MAX_FILES_BYTES)
        .map_err(|e| Error::Unsupported(e.to_string()))?;
    if request.workspace.is_some() {
        return Err(Error::Unsupported(
            "a host directory as /workspace (files go in with --file)".into(),
        ));
    }
    if request.egress.is_some()
        || matches!(request.policy.network, sandbox::NetworkAccess::Proxy { .. })
    {
        return Err(Error::Unsupported(
            "proxy network mode, not built yet".into(),
        ));
    }
    if request.zygote {
        return Err(Error::Unsupported("--zygote".into()));
    }
    let build_id = image.check_build()?;
    let spec = run_spec(request.language, &request.limits, &request.policy)?;
    let frame = runtime::ephemeral(runtime::boot_frame_with_files(
        &request.code,
        &request.files,
    ));
    let machine = machine_for(&request.limits, accel);
    let launched = Instant::now();
    // The VM lives at most its boot, the run and a margin; the driver ends it sooner.
    let lifetime = BOOT_LIMIT + request.limits.timeout + Duration::from_secs(30);
    let jailed = jail::launch(
        host,
        &image.dir,
        machine,
        None,
        &jail::JailLimits { lifetime },
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| Error::Io {
            doing: "building the runtime",
            source,
        })?;
    rt.block_on(async move {
        let vm = vm::boot(jailed, &build_id, launched, BOOT_LIMIT).await?;
        let boot_ms = vm.boot_time.as_secs_f64() * 1000.0;
        let sb = vm.start(spec, lifetime).await?;
        tracing::debug!(boot_ms, "microVM booted");
        let limits = &request.limits;
        let (outcome, ending) = capture(
            sb,
            frame,
            None,
            (limits.stdout_cap, limits.stderr_cap),
            limits.timeout,
            std::future::pending::<()>(),
            |stream, bytes| match stream {
                Stream::Stdout => sink.stdout(bytes),
                Stream::Stderr => sink.stderr(bytes),
            },
        )
        .await?;
        let mut result = crate::execution::result_from(
            request.language,
            None,
            request.policy.landlock.is_some(),
            outcome,
        );
        result.backend = super::Backend::Microvm;
        Ok((result, ending))
    })
}

fn pipe_reader(fd: OwnedFd) -> Result<tokio::net::unix::pipe::Receiver, Error> {
    sandbox::set_nonblocking(fd.as_fd(), true)
        .and_then(|()| tokio::net::unix::pipe::Receiver::from_owned_fd(fd))
        .map_err(|source| Error::Io {
            doing: "reading the program's output",
            source,
        })
}

/// Where the run's fd 3 goes after the boot frame: to `codebox serve`'s tool proxy, or
/// (`codebox run`) nowhere, our end kept open.
pub type ChannelService = crate::spawner::client::ChannelService;

/// Writes `frame` to fd 3, then hands fd 3 to `service`; captures stdout and stderr within
/// `caps`, streaming what is kept to `on_output`; kills the VM at `timeout` or when
/// `cancel` resolves; reads the status. The same rules as the namespace backend's
/// `RemoteSandbox::run_with_channel`.
#[allow(clippy::too_many_arguments)]
pub async fn capture(
    mut sb: MicroVmSandbox,
    frame: Vec<u8>,
    service: Option<ChannelService>,
    (stdout_cap, stderr_cap): (usize, usize),
    timeout: Duration,
    cancel: impl std::future::Future<Output = ()>,
    mut on_output: impl FnMut(Stream, &[u8]),
) -> Result<(sandbox::Outcome, VmEnding), Error> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let take = |fd: &mut OwnedFd| -> Result<OwnedFd, Error> {
        let null = OwnedFd::from(
            std::fs::File::open("/dev/null").map_err(|source| Error::Io {
                doing: "opening /dev/null",
                source,
            })?,
        );
        Ok(std::mem::replace(fd, null))
    };
    let mut stdout = pipe_reader(take(&mut sb.stdout)?)?;
    let mut stderr = pipe_reader(take(&mut sb.stderr)?)?;
    let mut status_rx = pipe_reader(take(&mut sb.status)?)?;
    let mut channel = {
        let s = std::os::unix::net::UnixStream::from(take(&mut sb.channel)?);
        s.set_nonblocking(true).map_err(|source| Error::Io {
            doing: "the fd-3 socket",
            source,
        })?;
        tokio::net::UnixStream::from_std(s).map_err(|source| Error::Io {
            doing: "the fd-3 socket",
            source,
        })?
    };
    // The program reads its code, then runs; a program that never reads fd 3 leaves the
    // rest unwritten, as in a namespace sandbox. Then the proxy, if any, owns fd 3; it
    // ends when the guest announces fd 3's end and the pump closes our side.
    let channel_task = tokio::spawn(async move {
        if channel.write_all(&frame).await.is_err() {
            return;
        }
        match service {
            Some(serve) => serve(channel).await,
            // Keep our end open: the program may still read it (and see no EOF).
            None => std::future::pending::<()>().await,
        }
    });
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let (mut out_open, mut err_open) = (true, true);
    let (mut timed_out, mut cancelled) = (false, false);
    let mut status_record = Vec::new();
    let mut status_open = true;
    let (mut obuf, mut ebuf, mut sbuf) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024], [0u8; 16]);
    tokio::pin!(cancel);
    while out_open || err_open || status_open {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline), if !timed_out && !cancelled => {
                timed_out = true;
                sb.kill();
            }
            _ = &mut cancel, if !timed_out && !cancelled => {
                cancelled = true;
                sb.kill();
            }
            r = stdout.read(&mut obuf), if out_open => match r {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => {
                    let kept = out.push(&obuf[..n], stdout_cap);
                    if !kept.is_empty() { on_output(Stream::Stdout, kept) }
                }
            },
            r = stderr.read(&mut ebuf), if err_open => match r {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => {
                    let kept = err.push(&ebuf[..n], stderr_cap);
                    if !kept.is_empty() { on_output(Stream::Stderr, kept) }
                }
            },
            r = status_rx.read(&mut sbuf), if status_open => match r {
                Ok(0) | Err(_) => status_open = false,
                Ok(n) => {
                    if status_record.len() + n <= sandbox::report::STATUS_LEN {
                        status_record.extend_from_slice(&sbuf[..n]);
                    }
                }
            },
        }
    }
    let duration = started.elapsed();
    let landlock = sb.landlock;
    // The driver ends the VM once the guest reported the end and the output drained; a
    // guest that does not is killed after a grace period.
    let ending = match tokio::time::timeout(Duration::from_secs(5), sb.ended()).await {
        Ok(ending) => ending,
        Err(_) => {
            tracing::warn!("the microVM did not end after its program; killing it");
            sb.kill();
            sb.ended().await
        }
    };
    // The VM is gone, so fd 3 is at its end once the pump delivered what the program
    // wrote last (a tool call's record, output files' chunks): let the proxy finish them,
    // within a bound.
    let abort = channel_task.abort_handle();
    if tokio::time::timeout(CHANNEL_DRAIN, channel_task)
        .await
        .is_err()
    {
        abort.abort();
    }
    let status: Option<ProgramStatus> = if status_record.len() == sandbox::report::STATUS_LEN {
        let mut rec = [0u8; sandbox::report::STATUS_LEN];
        rec.copy_from_slice(&status_record);
        sandbox::report::decode_status(&rec)
    } else {
        None
    };
    Ok((
        sandbox::Outcome {
            status: if timed_out || cancelled { None } else { status },
            timed_out,
            stdout: out,
            stderr: err,
            duration,
            landlock,
            cgroup: ending.guest_cgroup,
        },
        ending,
    ))
}

/// How long a run whose VM ended still lets the proxy read what the program left on fd 3.
const CHANNEL_DRAIN: Duration = Duration::from_millis(500);
