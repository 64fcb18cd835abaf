//! Log messages to the client (`notifications/message`), at each revision's opt-in:
//!
//! - 2025-11-25: `logging/setLevel` sets the threshold (server-wide; `info` until set);
//! - 2026-07-28 (SEP-2575): no `logging/setLevel`; a request asks for the messages it
//!   causes with `_meta` `io.modelcontextprotocol/logLevel`, and a request without it
//!   gets none. The messages go on that request's response stream.
//!
//! MCP logging is deprecated by SEP-2577 in the newest revision but is part of both.

#![allow(deprecated)]

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::server::CodeboxServer;

/// Whether `ctx` is a request of 2026-07-28 or later (its own `_meta`, or the revision
/// its connection negotiated).
pub(in crate::server) fn is_stateless_request(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| crate::server::transport::framing::is_stateless_revision(v.as_str()))
}

/// The least severe level the caller of `ctx` wants, or `None` for no messages.
fn threshold(ctx: &RequestContext<RoleServer>, set_level: LoggingLevel) -> Option<LoggingLevel> {
    if is_stateless_request(ctx) {
        ctx.meta.log_level()
    } else {
        Some(set_level)
    }
}

impl CodeboxServer {
    /// Sends a log message to the caller of `ctx` if its opt-in lets it through.
    pub(in crate::server) async fn log(
        &self,
        ctx: &RequestContext<RoleServer>,
        level: LoggingLevel,
        data: serde_json::Value,
    ) {
        let set_level = *self.state.log_level.lock().expect("log level lock");
        let Some(threshold) = threshold(ctx, set_level) else {
            return;
        };
        if severity(level) >= severity(threshold) {
            let param = LoggingMessageNotificationParam::new(level, data).with_logger("codebox");
            if let Err(e) = ctx.peer.notify_logging_message(param).await {
                tracing::debug!(error = %e, "log message not sent to the client");
            }
        }
    }

    /// `logging/setLevel`: a 2025-11-25 method; 2026-07-28 removed it (`-32601`).
    pub(in crate::server) fn set_log_level(
        &self,
        level: LoggingLevel,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), rmcp::ErrorData> {
        if is_stateless_request(ctx) {
            return Err(rmcp::ErrorData::method_not_found::<
                rmcp::model::SetLevelRequestMethod,
            >());
        }
        *self.state.log_level.lock().expect("log level lock") = level;
        Ok(())
    }
}

/// RFC 5424 order, least severe first.
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::severity;
    use rmcp::model::LoggingLevel;

    #[test]
    fn severity_follows_rfc_5424() {
        assert!(severity(LoggingLevel::Debug) < severity(LoggingLevel::Info));
        assert!(severity(LoggingLevel::Notice) < severity(LoggingLevel::Warning));
        assert!(severity(LoggingLevel::Critical) < severity(LoggingLevel::Emergency));
    }
}
