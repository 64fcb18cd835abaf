//! What the proxy reports per execution: one record per connection, and the totals.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::limits::{ConnMeter, Counters};

use schemars::JsonSchema;
use serde::Serialize;

/// Records kept per execution; the rest are counted in [`EgressReport::dropped`].
pub const MAX_RECORDS: usize = 100;

/// How a connection went through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionKind {
    /// A CONNECT tunnel: the proxy sees only bytes.
    Connect,
    /// A CONNECT whose TLS the proxy terminated to add credentials.
    Intercept,
    /// Plain HTTP requests in absolute form (`GET http://host/path`).
    Http,
    /// A request the proxy could not read or does not serve (no host decided).
    Invalid,
}

/// One connection (or, for plain HTTP, one upstream host of a client connection).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ConnectionRecord {
    pub host: String,
    pub port: u16,
    pub kind: ConnectionKind,
    pub allowed: bool,
    /// Why it was denied, or how it failed or ended early.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The allow / deny / allow_private rule that decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The address actually connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: f64,
    /// HTTP requests seen (plain HTTP and intercepted connections).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<u32>,
    /// The last HTTP status seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub credential_added: bool,
}

impl ConnectionRecord {
    pub fn new(kind: ConnectionKind, host: String, port: u16) -> ConnectionRecord {
        ConnectionRecord {
            host,
            port,
            kind,
            allowed: false,
            reason: None,
            rule: None,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0.0,
            requests: None,
            status: None,
            credential_added: false,
        }
    }
}

/// One execution's egress, as it goes into the result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, JsonSchema)]
pub struct EgressReport {
    /// The first [`MAX_RECORDS`] connections.
    pub connections: Vec<ConnectionRecord>,
    /// Connections past the cap, counted.
    pub dropped: u64,
    /// The first limit reached, named with its value: `max_connections (64)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_reached: Option<String>,
    pub allowed: u32,
    pub denied: u32,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Collects one execution's records.
#[derive(Debug, Default)]
pub struct Recorder {
    records: Mutex<Vec<ConnectionRecord>>,
    dropped: AtomicU64,
    allowed: AtomicU32,
    denied: AtomicU32,
}

impl Recorder {
    pub fn push(&self, record: ConnectionRecord) {
        if record.allowed {
            self.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        let mut records = self.records.lock().expect("recorder lock");
        if records.len() < MAX_RECORDS {
            records.push(record);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The report so far; byte totals and the limit come from the run's budget.
    pub fn report(
        &self,
        bytes_up: u64,
        bytes_down: u64,
        limit_reached: Option<String>,
    ) -> EgressReport {
        EgressReport {
            connections: self.records.lock().expect("recorder lock").clone(),
            dropped: self.dropped.load(Ordering::Relaxed),
            limit_reached,
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            bytes_up,
            bytes_down,
        }
    }
}

/// A record being filled in; it reaches the [`Recorder`] when dropped, so a connection
/// task that is aborted still leaves its record.
pub struct PendingRecord {
    pub record: ConnectionRecord,
    started: Instant,
    recorder: Arc<Recorder>,
    counters: Arc<Counters>,
    /// Byte counts of this connection (read at the end).
    pub meter: Arc<ConnMeter>,
    /// Why the client connection ended, when something outside it ended it (idle
    /// timeout, the execution finishing): the reason of a record that has none.
    end: Arc<OnceLock<String>>,
}

impl PendingRecord {
    pub fn new(
        record: ConnectionRecord,
        recorder: Arc<Recorder>,
        counters: Arc<Counters>,
        end: Arc<OnceLock<String>>,
    ) -> PendingRecord {
        PendingRecord {
            record,
            started: Instant::now(),
            recorder,
            counters,
            meter: Arc::default(),
            end,
        }
    }

    /// Sets the reason unless one is already there (the first cause wins).
    pub fn reason(&mut self, reason: impl Into<String>) {
        if self.record.reason.is_none() {
            self.record.reason = Some(reason.into());
        }
    }

    /// Marks it denied with `reason` (and the rule, if one decided).
    pub fn deny(&mut self, reason: impl Into<String>, rule: Option<String>) {
        self.record.allowed = false;
        self.record.reason = Some(reason.into());
        if rule.is_some() {
            self.record.rule = rule;
        }
    }
}

impl Drop for PendingRecord {
    fn drop(&mut self) {
        let mut record = std::mem::replace(
            &mut self.record,
            ConnectionRecord::new(ConnectionKind::Invalid, String::new(), 0),
        );
        record.duration_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        record.bytes_up = self.meter.up.load(Ordering::Relaxed);
        record.bytes_down = self.meter.down.load(Ordering::Relaxed);
        if record.reason.is_none() {
            record.reason = self
                .meter
                .limit_hit
                .get()
                .or_else(|| self.end.get())
                .cloned();
        }
        let c = &self.counters;
        if record.allowed {
            c.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            c.denied.fetch_add(1, Ordering::Relaxed);
        }
        if record.kind == ConnectionKind::Intercept && record.allowed {
            c.intercepted.fetch_add(1, Ordering::Relaxed);
        }
        tracing::info!(
            host = %record.host,
            port = record.port,
            kind = ?record.kind,
            allowed = record.allowed,
            reason = record.reason.as_deref().unwrap_or(""),
            address = record.address.as_deref().unwrap_or(""),
            bytes_up = record.bytes_up,
            bytes_down = record.bytes_down,
            "egress connection"
        );
        self.recorder.push(record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_past_the_cap_are_counted() {
        let r = Arc::new(Recorder::default());
        for i in 0..(MAX_RECORDS + 5) {
            let mut rec = ConnectionRecord::new(ConnectionKind::Connect, format!("h{i}"), 443);
            rec.allowed = i % 2 == 0;
            r.push(rec);
        }
        let report = r.report(1, 2, None);
        assert_eq!(report.connections.len(), MAX_RECORDS);
        assert_eq!(report.dropped, 5);
        assert_eq!(report.allowed + report.denied, (MAX_RECORDS + 5) as u32);
    }

    #[test]
    fn a_dropped_pending_record_is_kept_with_its_bytes() {
        let r = Arc::new(Recorder::default());
        {
            let mut p = PendingRecord::new(
                ConnectionRecord::new(ConnectionKind::Http, "a.example".into(), 80),
                r.clone(),
                Arc::default(),
                Arc::default(),
            );
            p.record.allowed = true;
            p.meter.up.store(7, Ordering::Relaxed);
            p.reason("idle timeout (60s)");
            p.reason("later reasons do not overwrite");
        }
        let rep = r.report(0, 0, None);
        assert_eq!(rep.connections[0].bytes_up, 7);
        assert_eq!(
            rep.connections[0].reason.as_deref(),
            Some("idle timeout (60s)")
        );
        let json = serde_json::to_value(&rep).unwrap();
        assert_eq!(json["connections"][0]["kind"], "http");
    }
}
