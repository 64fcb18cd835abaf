//! The egress engine: the part shared by every execution ([`Egress`]) and one execution's
//! proxy ([`EgressRun`]): the accept loop on the listening socket inside the sandbox's
//! network namespace, one task per client connection, and the report.
//!
//! Each client connection is its own task, bounded by the head timeout, the idle timeout
//! (no byte either way) and the execution's end; a slow or silent client or upstream holds
//! only its own task. Over `max_concurrent_connections` (the run's) or the engine's cap on
//! client connections open across all runs (`max_open_connections`, from the descriptor
//! limit, see `limits::OpenCap`) a connection is answered 429 at once without being read.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::head::{self, FirstRequest, NoRequest, Prefixed, Refusal};
use super::interception::tls;
use super::limits::{human_duration, Activity, Budget, Counters, Metered, OpenCap};
use super::local::HostAddresses;
use super::record::{ConnectionKind, ConnectionRecord, EgressReport, PendingRecord, Recorder};
use super::{plain, tunnel};
use crate::egress::interception::ca::CertAuthority;
use crate::egress::rules::pattern::{clip, Target};
use crate::egress::rules::policy::{EgressPolicy, Narrowing};
use crate::egress::rules::resolve::Resolve;
use crate::egress::secrets::redact::Secrets;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Ca(#[from] crate::egress::interception::ca::Error),
    #[error(transparent)]
    Tls(#[from] crate::egress::interception::tls::Error),
    #[error(transparent)]
    Secrets(#[from] crate::egress::secrets::redact::TooLarge),
}

/// What [`Egress::new`] needs besides the policy.
pub struct EgressOptions {
    /// Where the CA (`egress-ca/`) and the sandbox trust bundle (`egress-trust/`) live.
    pub state_dir: PathBuf,
    /// [`super::SystemResolver`] in production; tests map names to loopback.
    pub resolver: Arc<dyn Resolve>,
}

/// What every execution's proxy shares.
pub(crate) struct Shared {
    pub policy: EgressPolicy,
    pub resolver: Arc<dyn Resolve>,
    pub client_tls: Arc<rustls::ClientConfig>,
    pub ca: Option<CertAuthority>,
    pub counters: Arc<Counters>,
    /// Every configured secret, redacted from responses of hosts with credentials.
    pub secrets: Secrets,
    /// The supervisor's own addresses, never connected to unless `allow_private` names one.
    pub host_addresses: HostAddresses,
    /// Client connections open at once across all runs.
    pub open: OpenCap,
}

/// The egress engine of a server: policy, resolver, TLS, CA, counters.
pub struct Egress {
    shared: Arc<Shared>,
    trust_dir: PathBuf,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("trust_dir", &self.trust_dir)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// Builds the shared part (policy, resolver, upstream TLS configuration with the system
    /// roots and `extra_roots`, and — only when the policy has credentials — the
    /// per-installation CA, made at first use) and writes the sandbox trust bundle
    /// `<state_dir>/egress-trust/ca-bundle.pem`: the host's roots, the extra roots, and the
    /// codebox CA if there is one.
    pub fn new(policy: EgressPolicy, options: EgressOptions) -> Result<Egress, Error> {
        let roots = tls::Roots::load(policy.extra_roots()).inspect_err(|err| {
            tracing::error!(?err, "egress: cannot load trust roots");
        })?;
        let client_tls = roots.client_config()?;
        let ca = if policy.has_credentials() {
            Some(
                CertAuthority::load_or_create(&options.state_dir).inspect_err(|err| {
                    tracing::error!(?err, "egress: cannot load or make the CA");
                })?,
            )
        } else {
            None
        };
        let trust_dir = tls::write_trust_bundle(
            &options.state_dir,
            &roots,
            ca.as_ref().map(|c| c.cert_pem()),
        )
        .inspect_err(|err| tracing::error!(?err, "egress: cannot write the trust bundle"))?;
        let secrets = Secrets::new(&policy.secret_values()).inspect_err(|err| {
            tracing::error!(%err, "egress: cannot build the secrets' matcher");
        })?;
        Ok(Egress {
            shared: Arc::new(Shared {
                policy,
                resolver: options.resolver,
                client_tls,
                ca,
                counters: Arc::default(),
                secrets,
                host_addresses: HostAddresses::default(),
                open: OpenCap::from_rlimit(),
            }),
            trust_dir,
        })
    }

    /// The same engine with at most `max` client connections open at once across all its
    /// runs (by default an eighth of the soft `RLIMIT_NOFILE`, see [`OpenCap`]). Only
    /// before the first run.
    pub fn with_max_open_connections(mut self, max: usize) -> Egress {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => shared.open = OpenCap::new(max),
            None => tracing::warn!("egress: the open-connection cap is set before any run"),
        }
        self
    }

    pub fn policy(&self) -> &EgressPolicy {
        &self.shared.policy
    }

    /// The `egress-trust` directory (holding `ca-bundle.pem`), to bind at `/etc/codebox`.
    pub fn trust_dir(&self) -> &Path {
        &self.trust_dir
    }

    /// Every configured secret: what results are redacted of.
    pub fn secrets(&self) -> &Secrets {
        &self.shared.secrets
    }

    /// The codebox CA certificate (PEM), when the policy has credentials.
    pub fn ca_certificate_pem(&self) -> Option<&str> {
        self.shared.ca.as_ref().map(|c| c.cert_pem())
    }

    /// Starts serving one execution's listening socket (bound and listening, inside the
    /// sandbox's network namespace). Must be called inside a tokio runtime; returns at once.
    pub fn start(&self, listener: std::net::TcpListener, narrowing: Narrowing) -> EgressRun {
        self.start_gated(listener, narrowing, None)
    }

    /// [`Egress::start`] with the execution's approval gate: a host an `approve` rule
    /// names is connected to only once `approval` says so (without a gate it is refused).
    pub fn start_gated(
        &self,
        listener: std::net::TcpListener,
        narrowing: Narrowing,
        approval: Option<Arc<crate::approval::Gate>>,
    ) -> EgressRun {
        self.shared
            .counters
            .runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let run = Arc::new(Run {
            shared: self.shared.clone(),
            budget: Arc::new(Budget::new(
                self.shared.policy.limits().clone(),
                self.shared.counters.clone(),
            )),
            recorder: Arc::default(),
            narrowing,
            approval,
            cancel: CancellationToken::new(),
            refusals: Default::default(),
            resolutions: Arc::new(tokio::sync::Semaphore::new(
                crate::egress::rules::resolve::MAX_RESOLUTIONS_PER_RUN,
            )),
        });
        let accept = tokio::spawn(accept_loop(run.clone(), listener));
        EgressRun {
            run,
            accept: Some(accept),
        }
    }

    /// For `health`: the policy summary and the counters since start.
    pub fn health(&self) -> serde_json::Value {
        let (open, max_open) = self.shared.open.usage();
        serde_json::json!({
            "policy": self.shared.policy.summary(),
            "counters": self.shared.counters.snapshot(),
            "open_connections": open,
            "max_open_connections": max_open,
            "ca": self.shared.ca.is_some(),
            "trust_dir": self.trust_dir.display().to_string(),
        })
    }
}

/// One execution's proxy.
pub(crate) struct Run {
    pub shared: Arc<Shared>,
    pub budget: Arc<Budget>,
    pub recorder: Arc<Recorder>,
    pub narrowing: Narrowing,
    /// The execution's approval gate, for hosts an `approve` rule names.
    pub approval: Option<Arc<crate::approval::Gate>>,
    pub cancel: CancellationToken,
    /// The latest refusals, for [`crate::egress::rules::why`].
    pub refusals: crate::egress::rules::why::Refusals,
    /// Slots for name lookups (see `connect.rs`).
    pub resolutions: Arc<tokio::sync::Semaphore>,
}

/// One execution's running proxy; [`EgressRun::finish`] ends it and gives the report.
pub struct EgressRun {
    run: Arc<Run>,
    accept: Option<tokio::task::JoinHandle<()>>,
}

/// How long [`EgressRun::finish`] lets connection tasks write their records before
/// aborting them (they stop at once on cancellation; this only bounds a stuck one).
const FINISH_GRACE: Duration = Duration::from_millis(500);

impl EgressRun {
    /// Stops accepting, ends every connection of this execution, and returns its report.
    /// Bounded: never waits on the network.
    pub async fn finish(mut self) -> EgressReport {
        self.run.cancel.cancel();
        if let Some(accept) = self.accept.take() {
            let abort = accept.abort_handle();
            if tokio::time::timeout(FINISH_GRACE * 3, accept)
                .await
                .is_err()
            {
                tracing::warn!("egress: the accept loop did not stop in time; aborted");
                abort.abort();
            }
        }
        self.report()
    }

    /// The report so far (the run goes on).
    pub fn report(&self) -> EgressReport {
        let b = &self.run.budget;
        self.run
            .recorder
            .report(b.bytes_up(), b.bytes_down(), b.limit_reached())
    }
}

impl Drop for EgressRun {
    fn drop(&mut self) {
        self.run.cancel.cancel();
    }
}

async fn accept_loop(run: Arc<Run>, listener: std::net::TcpListener) {
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(err) => {
            tracing::error!(?err, "egress: cannot serve the listening socket");
            return;
        }
    };
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = run.cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let slots = run.budget.concurrent_slot().and_then(|slot| {
                        let open = run.shared.open.slot().inspect_err(|limit| {
                            run.budget.reached(limit.clone());
                        })?;
                        Ok((slot, open))
                    });
                    match slots {
                        Ok(slots) => {
                            tasks.spawn(serve_client(run.clone(), stream, slots));
                        }
                        Err(limit) => refuse_at_once(&run, stream, peer, &limit),
                    }
                }
                Err(err) => {
                    tracing::warn!(?err, "egress: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(FINISH_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "egress: connections did not end in time; aborting them"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// Over a concurrency limit (the run's or the process's): a 429 written without waiting (the socket buffer takes
/// it), a record, and the socket closed.
fn refuse_at_once(run: &Run, stream: TcpStream, peer: SocketAddr, limit: &str) {
    let refusal = Refusal::limit("(not read)", limit);
    let _ = stream.try_write(&refusal.to_bytes());
    tracing::info!(%peer, limit, "egress: connection refused at once");
    crate::metrics::global().egress(crate::metrics::labels::EgressDecision::Limit);
    let mut rec = ConnectionRecord::new(ConnectionKind::Invalid, String::new(), 0);
    rec.reason = Some(format!("limit {limit} reached"));
    PendingRecord::new(
        rec,
        run.recorder.clone(),
        run.shared.counters.clone(),
        Arc::default(),
    );
}

/// One client connection's context.
#[derive(Clone)]
pub(crate) struct Conn {
    pub run: Arc<Run>,
    /// Bytes moving either way, on either side.
    pub activity: Arc<Activity>,
    /// Why the connection was ended from outside (idle timeout, the execution's end).
    pub end: Arc<OnceLock<String>>,
    /// Cancelled when the client connection ends: stops its upstream drivers.
    pub cancel: CancellationToken,
    /// Whether a record was made for this connection (one that is ended before its
    /// first request still gets one).
    recorded: Arc<AtomicBool>,
}

impl Conn {
    /// A new record for `target` (or for no host).
    pub fn record(&self, kind: ConnectionKind, target: Option<&Target>) -> PendingRecord {
        self.recorded.store(true, Ordering::Relaxed);
        let (host, port) = match target {
            Some(t) => (t.host_for_tls(), t.port),
            None => (String::new(), 0),
        };
        PendingRecord::new(
            ConnectionRecord::new(kind, host, port),
            self.run.recorder.clone(),
            self.run.shared.counters.clone(),
            self.end.clone(),
        )
    }

    pub fn shared(&self) -> &Shared {
        &self.run.shared
    }

    /// The connection only asked the proxy itself (`/why`, see [`crate::egress::rules::why`]): not a
    /// connection out, so it leaves no record.
    pub fn asked_the_proxy(&self) {
        self.recorded.store(true, Ordering::Relaxed);
    }
}

/// Serves one client connection; `_slots` (this run's and the process's) are given back
/// when it ends.
async fn serve_client(
    run: Arc<Run>,
    stream: TcpStream,
    _slots: (OwnedSemaphorePermit, OwnedSemaphorePermit),
) {
    // Small writes (a CONNECT answer, then TLS records) must not wait for an ACK.
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(
            ?err,
            "egress: cannot set TCP_NODELAY on a client connection"
        );
    }
    let conn = Conn {
        cancel: run.cancel.child_token(),
        run,
        activity: Arc::default(),
        end: Arc::default(),
        recorded: Arc::default(),
    };
    let _stop_drivers = conn.cancel.clone().drop_guard();
    let idle = conn.shared().policy.limits().idle_timeout;
    let client = Metered::activity(stream, conn.activity.clone());
    let mut work = Box::pin(handle(conn.clone(), client));
    tokio::select! {
        _ = &mut work => {}
        _ = conn.run.cancel.cancelled() => {
            let _ = conn.end.set("execution finished".into());
        }
        _ = conn.activity.idle(idle) => {
            tracing::info!("egress: connection idle; closing it");
            let _ = conn.end.set(format!("idle timeout ({})", human_duration(idle)));
        }
    }
    // The records inside `work` take `end` as their reason when they are dropped here.
    drop(work);
    if !conn.recorded.load(Ordering::Relaxed) {
        let mut rec = conn.record(ConnectionKind::Invalid, None);
        let ended = conn.end.get().cloned().unwrap_or_else(|| "closed".into());
        rec.deny(ended + " before a whole request head", None);
    }
}

async fn handle(conn: Conn, mut client: Metered<TcpStream>) {
    let limits = conn.shared().policy.limits().clone();
    match head::read_first(&mut client, limits.head_timeout, limits.max_head_bytes).await {
        Ok(FirstRequest::Connect { target, early }) => {
            tunnel::serve_connect(&conn, client, target, early).await
        }
        Ok(FirstRequest::Absolute { buffered }) => {
            plain::serve(&conn, Prefixed::new(buffered, client)).await
        }
        Err(NoRequest::Refuse { refusal, host }) => {
            let mut rec = conn.record(ConnectionKind::Invalid, None);
            rec.record.host = clip(&host);
            rec.deny(refusal.message.clone(), None);
            crate::metrics::global().egress(crate::metrics::labels::EgressDecision::Invalid);
            tracing::info!(status = refusal.status.as_u16(), message = %refusal.message, "egress: request refused");
            head::write_refusal(&mut client, &refusal).await;
        }
        Err(NoRequest::Closed { reason }) => {
            let mut rec = conn.record(ConnectionKind::Invalid, None);
            rec.deny(reason, None);
            let _ = client.shutdown().await;
        }
    }
}
