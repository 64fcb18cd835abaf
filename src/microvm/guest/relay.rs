//! The guest's relay: the program's stdout, stderr and fd 3 to and from their ports,
//! one `poll(2)` loop, a fixed buffer per direction (the guest's memory use does not grow
//! with what the program writes; a port the host does not drain stalls that stream only).
//!
//! Ends when the sandbox has ended and both output streams are drained; then each
//! stream's end and `Exited` go to the host on the control port.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::trees::LateTrees;
use super::Ports;
use crate::microvm::wire::{self, FrameReader, GuestMessage, HostMessage, Stream};
use crate::sandbox::{set_nonblocking, Limits, Sandbox};

const BUF: usize = 64 * 1024;

/// One direction: bytes read from `from`, written to `to`.
struct Pump {
    from: RawFd,
    to: RawFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    total: u64,
    /// The source said end of file (or the host announced the end of this stream and it
    /// has all arrived).
    eof: bool,
}

impl Pump {
    fn new(from: RawFd, to: RawFd) -> Self {
        Pump {
            from,
            to,
            buf: vec![0u8; BUF].into_boxed_slice(),
            start: 0,
            end: 0,
            total: 0,
            eof: false,
        }
    }

    fn wants_read(&self) -> bool {
        !self.eof && self.end < self.buf.len()
    }

    fn wants_write(&self) -> bool {
        self.start < self.end
    }

    fn done(&self) -> bool {
        self.eof && !self.wants_write()
    }

    /// Reads what is there; `limit`: stop after this many bytes in all (the host's count
    /// of a stream it ended).
    fn read(&mut self, limit: Option<u64>) -> std::io::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let mut room = self.buf.len() - self.end;
        if let Some(limit) = limit {
            room = room.min(limit.saturating_sub(self.total) as usize);
        }
        if room == 0 {
            return Ok(());
        }
        // SAFETY: the destination is the free tail of `buf`, `room` bytes long.
        let n = unsafe { libc::read(self.from, self.buf[self.end..].as_mut_ptr().cast(), room) };
        match n {
            0 => self.eof = true,
            n if n > 0 => {
                self.end += n as usize;
                self.total += n as u64;
            }
            _ => {
                let e = std::io::Error::last_os_error();
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn write(&mut self) -> std::io::Result<()> {
        let data = &self.buf[self.start..self.end];
        // SAFETY: `data` is a valid readable slice.
        let n = unsafe { libc::write(self.to, data.as_ptr().cast(), data.len()) };
        if n >= 0 {
            self.start += n as usize;
            if self.start == self.end {
                // Drained: the whole buffer is free for the next read.
                self.start = 0;
                self.end = 0;
            }
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(()),
            _ => Err(e),
        }
    }
}

fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: every descriptor polled here is owned by `run`'s frame (the sandbox's I/O
    // and the ports) and outlives the loop.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// How long fd 3 may take, after the program's end, to pass on what it wrote last.
const UP_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Relays until the sandbox has ended; reports the ending on the control port.
/// `deferred`: the program is handed out later (a template's, a pooled clone's): its
/// deadline waits for the `Resume`, and these trees may still come before it.
pub fn run(
    sandbox: Sandbox,
    limits: &Limits,
    ports: &mut Ports,
    mut deferred: Option<LateTrees>,
) -> Result<()> {
    let (io, watch) = sandbox.into_parts();
    for fd in [
        io.stdout.as_fd(),
        io.stderr.as_fd(),
        io.channel.as_fd(),
        ports.stdout.as_fd(),
        ports.stderr.as_fd(),
        ports.channel.as_fd(),
        ports.control.as_fd(),
    ] {
        set_nonblocking(fd, true).context("making the relay's descriptors non-blocking")?;
    }
    // The program's own deadline, in the guest too (the host's is the one that counts);
    // a deferred one's is armed when it is handed out (`Resume`).
    let arm = |watch: &crate::sandbox::Watch, timeout: std::time::Duration| {
        if let Err(e) = watch.arm(crate::sandbox::lifeline::run_deadline(timeout)) {
            eprintln!("codebox guest-init: arming the deadline failed: {e}");
        }
    };
    if deferred.is_none() {
        arm(&watch, limits.timeout);
    }
    let mut control_out: Vec<u8> = wire::encode(&GuestMessage::Started {
        landlock: io.landlock,
    });
    let mut out = Pump::new(io.stdout.as_raw_fd(), ports.stdout.as_raw_fd());
    let mut err = Pump::new(io.stderr.as_raw_fd(), ports.stderr.as_raw_fd());
    let mut up = Pump::new(io.channel.as_raw_fd(), ports.channel.as_raw_fd());
    let mut down = Pump::new(ports.channel.as_raw_fd(), io.channel.as_raw_fd());
    // How many bytes the host sent on fd 3 before it closed its side.
    let mut down_limit: Option<u64> = None;
    let mut down_shut = false;
    let mut announced = [false; 3];
    let mut reader = FrameReader::default();
    let mut exited = false;
    let mut exited_at: Option<std::time::Instant> = None;
    let mut control_buf = [0u8; 4096];

    loop {
        // Streams that ended and were flushed are announced once.
        for (i, (pump, stream)) in [
            (&out, Stream::Stdout),
            (&err, Stream::Stderr),
            (&up, Stream::Channel),
        ]
        .into_iter()
        .enumerate()
        {
            if pump.done() && !announced[i] {
                announced[i] = true;
                control_out.extend(wire::encode(&GuestMessage::Eof {
                    stream,
                    bytes: pump.total,
                }));
            }
        }
        if let Some(limit) = down_limit {
            if !down_shut && down.total >= limit && !down.wants_write() {
                // SAFETY: shutdown(2) of the socket's write side; no memory is passed.
                unsafe { libc::shutdown(io.channel.as_raw_fd(), libc::SHUT_WR) };
                down_shut = true;
            }
        }
        // fd 3 too: what the program wrote last (its value, its output files' last
        // chunks, `codebox/exit`) may still be in its socket or our buffer. Every process
        // of the sandbox is gone, so its end comes once that is through; a host that does
        // not take it is not waited for past `UP_DRAIN`.
        let up_waited = exited_at.is_some_and(|at| at.elapsed() >= UP_DRAIN);
        if exited && out.done() && err.done() && (up.done() || up_waited) {
            break;
        }

        let mut fds: Vec<PollFd> = Vec::with_capacity(12);
        let mut roles: Vec<Role> = Vec::with_capacity(12);
        let mut add = |fd: RawFd, flags: PollFlags, role: Role| {
            fds.push(PollFd::new(borrow(fd), flags));
            roles.push(role);
        };
        for (i, pump) in [&out, &err, &up, &down].into_iter().enumerate() {
            let limited_down = i == 3 && down_limit.is_some_and(|l| down.total >= l);
            if pump.wants_read() && !limited_down {
                add(pump.from, PollFlags::POLLIN, Role::Read(i));
            }
            if pump.wants_write() {
                add(pump.to, PollFlags::POLLOUT, Role::Write(i));
            }
        }
        if !exited {
            add(watch.pidfd().as_raw_fd(), PollFlags::POLLIN, Role::Exit);
        }
        add(
            ports.control.as_raw_fd(),
            if control_out.is_empty() {
                PollFlags::POLLIN
            } else {
                PollFlags::POLLIN | PollFlags::POLLOUT
            },
            Role::Control,
        );
        // Once the program has ended, the poll wakes for the drain's bound.
        let timeout = match exited_at {
            Some(at) => PollTimeout::try_from(UP_DRAIN.saturating_sub(at.elapsed()))
                .unwrap_or(PollTimeout::ZERO),
            None => PollTimeout::NONE,
        };
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(std::io::Error::from(e)).context("polling the relay"),
        }
        let ready: Vec<(Role, PollFlags)> = fds
            .iter()
            .zip(&roles)
            .filter_map(|(p, r)| p.revents().filter(|e| !e.is_empty()).map(|e| (*r, e)))
            .collect();
        drop(fds);
        for (role, events) in ready {
            let pumps = [&mut out, &mut err, &mut up, &mut down];
            match role {
                Role::Read(i) => {
                    let limit = (i == 3).then_some(down_limit).flatten();
                    let pump = pumps.into_iter().nth(i).expect("four pumps");
                    if let Err(e) = pump.read(limit) {
                        // A program that closed its end: that stream has ended.
                        eprintln!("codebox guest-init: reading stream {i}: {e}");
                        pump.eof = true;
                    }
                }
                Role::Write(i) => {
                    let pump = pumps.into_iter().nth(i).expect("four pumps");
                    if let Err(e) = pump.write() {
                        // The program closed fd 3: nobody reads the rest.
                        eprintln!("codebox guest-init: writing stream {i}: {e}");
                        pump.start = pump.end;
                        pump.eof = true;
                    }
                }
                Role::Exit => {
                    exited = true;
                    exited_at = Some(std::time::Instant::now());
                }
                Role::Control => {
                    if events.contains(PollFlags::POLLOUT) && !control_out.is_empty() {
                        // SAFETY: a valid readable slice.
                        let n = unsafe {
                            libc::write(
                                ports.control.as_raw_fd(),
                                control_out.as_ptr().cast(),
                                control_out.len(),
                            )
                        };
                        if n > 0 {
                            control_out.drain(..n as usize);
                        }
                    }
                    if events.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) {
                        let want = reader.want().min(control_buf.len());
                        // SAFETY: `control_buf` is valid for writes of `want` bytes.
                        let n = unsafe {
                            libc::read(
                                ports.control.as_raw_fd(),
                                control_buf.as_mut_ptr().cast(),
                                want,
                            )
                        };
                        if n > 0 {
                            match reader.push::<HostMessage>(&control_buf[..n as usize])? {
                                (
                                    _,
                                    Some(HostMessage::Eof {
                                        stream: Stream::Channel,
                                        bytes,
                                    }),
                                ) => {
                                    down_limit = Some(bytes);
                                }
                                (_, Some(HostMessage::Tree { tree, data, end })) => {
                                    // A deferred program's trees, before its code; the
                                    // host ends the VM on the `Failed` this may cause.
                                    match deferred.as_mut() {
                                        Some(late) => late.take(tree, &data, end)?,
                                        None => anyhow::bail!(
                                            "{} sent to a program that was not deferred",
                                            tree.name()
                                        ),
                                    }
                                }
                                (
                                    _,
                                    Some(HostMessage::Resume {
                                        time_ns,
                                        seed,
                                        timeout_ms,
                                    }),
                                ) => {
                                    // Before the program runs with the host's bytes: its
                                    // trees sealed, its clock and the kernel's entropy.
                                    if let Some(late) = deferred.as_mut() {
                                        late.seal()?;
                                    }
                                    super::system::set_clock(time_ns)?;
                                    super::system::reseed(&seed)?;
                                    let timeout = timeout_ms
                                        .map(std::time::Duration::from_millis)
                                        .unwrap_or(limits.timeout);
                                    arm(&watch, timeout);
                                    control_out.extend(wire::encode(&GuestMessage::Resumed));
                                }
                                (_, Some(other)) => {
                                    eprintln!("codebox guest-init: ignoring {other:?}");
                                }
                                (_, None) => {}
                            }
                        }
                    }
                }
            }
        }
    }
    let ending = watch.finish().context("finishing the sandbox")?;
    control_out.extend(wire::encode(&GuestMessage::Exited {
        status: ending.status,
        cgroup: ending.cgroup,
    }));
    set_nonblocking(ports.control.as_fd(), false)?;
    ports.control.write_all(&control_out)?;
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Read(usize),
    Write(usize),
    Exit,
    Control,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;

    /// A stream longer than the buffer goes through whole, written in pieces smaller
    /// than the buffer (virtio-console takes at most 32 KiB per write): a drained buffer
    /// is read into again.
    #[test]
    fn a_stream_longer_than_the_buffer_goes_through() {
        let (mut src_w, src_r) = std::os::unix::net::UnixStream::pair().unwrap();
        let (dst_w, mut dst_r) = std::os::unix::net::UnixStream::pair().unwrap();
        for s in [&src_r, &dst_w, &dst_r] {
            s.set_nonblocking(true).unwrap();
        }
        let total = 5 * BUF + 123;
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let feeder = {
            let data = data.clone();
            std::thread::spawn(move || {
                src_w.write_all(&data).unwrap();
            })
        };
        let mut pump = Pump::new(src_r.as_raw_fd(), dst_w.as_raw_fd());
        let mut got = Vec::new();
        let mut idle = 0;
        while got.len() < total {
            let before = (pump.total, got.len());
            if pump.wants_read() {
                pump.read(None).unwrap();
            }
            if pump.wants_write() {
                pump.write().unwrap();
            }
            let mut chunk = [0u8; 7000];
            if let Ok(n) = dst_r.read(&mut chunk) {
                got.extend_from_slice(&chunk[..n]);
            }
            idle = if (pump.total, got.len()) == before {
                idle + 1
            } else {
                0
            };
            assert!(idle < 1_000_000, "stalled after {} bytes", got.len());
        }
        feeder.join().unwrap();
        assert_eq!(got, data);
    }
}
