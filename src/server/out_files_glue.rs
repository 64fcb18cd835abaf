//! A run's output files into its result: kept as the caller's resources
//! (`codebox://executions/<id>/files/<path>`), listed in `files`, and shown as image,
//! embedded-text or resource-link content (`output::files::plan`). With personal-data
//! handling on, paths and text are tokenized and binary content (images included, which
//! cannot be scanned) is withheld; configured egress secrets never leave in any form.

use base64::Engine as _;
use rmcp::model::{ContentBlock, Resource, ResourceContents};

use super::CodeboxServer;
use crate::execution::ExecutionResult;
use crate::output::files::{self, FileRecord, OutFiles, Shown};
use crate::output::kept::{self, FilePage, KeptFile};

impl CodeboxServer {
    /// Fills `files`, `files_skipped` and `files_omitted` of `result` and returns the
    /// content blocks that show the files. `id`: the execution's id in the kept store.
    pub(super) fn present_out_files(
        &self,
        client: &str,
        id: &str,
        out: OutFiles,
        vault: Option<&crate::pii::Vault>,
        result: &mut ExecutionResult,
    ) -> Vec<ContentBlock> {
        let s = &self.state;
        let limits = s.settings.proxy_limits.out_files;
        let secrets = s.settings.egress.as_ref().map(|e| e.secrets());
        let tokenized = |text: &str| match vault {
            Some(v) => v.tokenize(text),
            None => text.to_string(),
        };
        result.files_omitted = out.omitted;
        result.files_skipped = out
            .skipped
            .into_iter()
            .map(|mut k| {
                k.path = tokenized(&k.path);
                k
            })
            .collect();
        // What leaves: secrets redacted; with PII on, text tokenized (binary is withheld
        // by the plan below and never kept).
        let mut ready: Vec<(files::OutFile, &'static str)> = out
            .files
            .into_iter()
            .map(|mut f| {
                let mime = files::mime_of(&f.path, &f.bytes);
                if let Some(secrets) = secrets.filter(|s| !s.is_empty()) {
                    f.bytes = secrets.redact_all(&f.bytes);
                }
                if vault.is_some() {
                    if let Ok(text) = std::str::from_utf8(&f.bytes) {
                        f.bytes = tokenized(text).into_bytes();
                    }
                }
                f.path = tokenized(&f.path);
                (f, mime)
            })
            .collect();
        let plain: Vec<files::OutFile> = ready.iter().map(|(f, _)| f.clone()).collect();
        let shown = files::plan(&plain, &limits, vault.is_none());
        drop(plain);
        let kept: Vec<KeptFile> = ready
            .iter()
            .zip(&shown)
            .filter(|(_, shown)| **shown != Shown::Withheld)
            .map(|((f, mime), _)| KeptFile {
                path: f.path.clone(),
                mime,
                bytes: f.bytes.clone(),
            })
            .collect();
        let is_kept = kept.is_empty() || s.kept_outputs.keep_files(id, client, kept);
        let mut blocks = Vec::new();
        for ((f, mime), shown) in ready.drain(..).zip(shown) {
            let uri = kept::file_uri(id, &f.path);
            let resource = (is_kept && shown != Shown::Withheld).then(|| uri.clone());
            let shown = match shown {
                // A link to nothing is no use: say it was not kept instead.
                Shown::Link if !is_kept => Shown::Withheld,
                other => other,
            };
            match shown {
                Shown::Image => blocks.push(ContentBlock::image(
                    base64::engine::general_purpose::STANDARD.encode(&f.bytes),
                    mime,
                )),
                Shown::Embedded => blocks.push(ContentBlock::resource(
                    ResourceContents::TextResourceContents {
                        uri: uri.clone(),
                        mime_type: Some(mime.into()),
                        text: String::from_utf8_lossy(&f.bytes).into_owned(),
                        meta: None,
                    },
                )),
                Shown::Link => {
                    let mut link = Resource::new(uri.clone(), f.path.clone());
                    link.mime_type = Some(mime.into());
                    link.size = Some(f.bytes.len() as u64);
                    blocks.push(ContentBlock::resource_link(link));
                }
                Shown::Withheld => {}
            }
            result.files.push(FileRecord {
                path: f.path,
                mime,
                bytes: f.bytes.len(),
                shown,
                resource,
            });
        }
        if !is_kept {
            tracing::info!(
                execution = %id,
                files = result.files.len(),
                "output files larger than the kept-output store were not kept"
            );
        }
        blocks
    }
}

impl CodeboxServer {
    /// The caller's kept streams and output files, as listed resources.
    pub(super) fn kept_resources(&self, client: &str) -> Vec<Resource> {
        let mut items = Vec::new();
        for k in self.state.kept_outputs.list(client) {
            let mut r = Resource::new(k.uri.clone(), k.uri.clone());
            r.mime_type = Some(k.mime.into());
            r.size = Some(k.bytes as u64);
            let what = match k.uri.contains("/files/") {
                true => "an execution's output file",
                false => "an execution's whole output",
            };
            r.description = Some(format!("{what}, {} pages: ?page=1..{}", k.pages, k.pages));
            items.push(r);
        }
        items
    }

    /// A kept output file's page: text, or a base64 blob with its MIME type; `None` when
    /// `uri` is not an output file's.
    pub(super) fn read_out_file(
        &self,
        uri: &str,
        client: &str,
    ) -> Option<Result<rmcp::model::ReadResourceResponse, rmcp::ErrorData>> {
        let read = self.state.kept_outputs.read_file(client, uri)?;
        Some(match read {
            Ok((page, mime, _pages)) => {
                let contents = match page {
                    FilePage::Text(text) => ResourceContents::TextResourceContents {
                        uri: uri.to_string(),
                        mime_type: Some(mime.into()),
                        text,
                        meta: None,
                    },
                    FilePage::Blob(blob) => ResourceContents::BlobResourceContents {
                        uri: uri.to_string(),
                        mime_type: Some(mime.into()),
                        blob,
                        meta: None,
                    },
                };
                Ok(rmcp::model::ReadResourceResult::new(vec![contents]).into())
            }
            Err(why) => Err(rmcp::ErrorData::resource_not_found(why, None)),
        })
    }
}
