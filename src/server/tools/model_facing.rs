//! What reaches the model from the tools that do not run code: with PII handling on,
//! every string of their results (text content and structuredContent, errors too) is
//! tokenized with the connection's token map, as execution results are. `resources/list`
//! and resource reads do the same in `extra_resources`.
//!
//! Skills come back tokenized too (`list_skills`, `get_skill`); `save_skill` restores
//! the connection's tokens in what it saves, so a skill read, edited and saved again in
//! one connection keeps its real values.

use rmcp::model::{CallToolResult, ContentBlock};

use crate::pii::PiiMode;
use crate::server::CodeboxServer;

impl CodeboxServer {
    /// Whether results reaching the model are tokenized.
    pub(in crate::server) fn pii_on(&self) -> bool {
        self.state.settings.pii_mode != PiiMode::Off
    }

    /// `text` tokenized when PII handling is on.
    pub(in crate::server) fn pii_text(&self, text: &str) -> String {
        match self.pii_on() {
            true => self.vault().tokenize(text),
            false => text.to_string(),
        }
    }

    /// `text` with this connection's tokens restored when PII handling is on.
    pub(in crate::server) fn pii_restored(&self, text: &str) -> String {
        match self.pii_on() {
            true => self.vault().restore(text),
            false => text.to_string(),
        }
    }

    /// `result` as the model may see it: tokenized when PII handling is on.
    pub(in crate::server) fn for_model(&self, mut result: CallToolResult) -> CallToolResult {
        if !self.pii_on() {
            return result;
        }
        for content in &mut result.content {
            if let ContentBlock::Text(t) = content {
                t.text = self.vault().tokenize(&t.text);
            }
        }
        if let Some(value) = &mut result.structured_content {
            self.vault().tokenize_json(value);
        }
        result
    }
}

/// The proxy tokenizes what sandboxed code sends upstream and restores what comes back
/// with the execution's vault.
impl crate::proxy::Redactor for crate::pii::Vault {
    fn tokenize(&self, text: &str) -> String {
        crate::pii::Vault::tokenize(self, text)
    }

    fn tokenize_json(&self, value: &mut serde_json::Value) {
        crate::pii::Vault::tokenize_json(self, value)
    }

    fn restore_json(&self, value: &mut serde_json::Value) {
        crate::pii::Vault::restore_json(self, value)
    }
}
