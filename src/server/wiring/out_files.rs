//! A run's output files into its result: kept as the caller's resources
//! (`codebox://executions/<id>/files/<path>`), listed in `files`, and shown as image,
//! embedded-text or resource-link content (`output::files::plan`). With personal-data
//! handling on, paths and text are tokenized and binary content (images included, which
//! cannot be scanned) is withheld; configured egress secrets never leave in any form.

use base64::Engine as _;
use rmcp::model::{ContentBlock, Resource, ResourceContents};

use crate::execution::ExecutionResult;
use crate::output::files::{self, FileRecord, OutFiles, Shown};
use crate::output::kept::{self, FilePage, KeptFile};
use crate::server::CodeboxServer;

impl CodeboxServer {
    /// Fills `files`, `files_skipped` and `files_omitted` of `result` and returns the
    /// content blocks that show the files. `id`: the execution's id in the kept store.
    pub(in crate::server) fn present_out_files(
        &self,
        client: &str,
        id: &str,
        out: OutFiles,
        vault: Option<&crate::pii::Vault>,
        result: &mut ExecutionResult,
    ) -> Vec<ContentBlock> {
        let s = &self.state;
        let limits = s.settings.proxy_limits.out_files;
        let secrets = s
            .settings
            .egress
            .as_ref()
            .map(|e| e.secrets())
            .filter(|s| !s.is_empty());
        // Everything that leaves, names and reasons too: secrets redacted, then personal
        // data tokenized.
        let model_facing = |text: &str| {
            let text = match secrets {
                Some(secrets) => {
                    String::from_utf8_lossy(&secrets.redact_all(text.as_bytes())).into_owned()
                }
                None => text.to_string(),
            };
            match vault {
                Some(v) => v.tokenize(&text),
                None => text,
            }
        };
        result.files_omitted = out.omitted;
        result.files_skipped = out
            .skipped
            .into_iter()
            .map(|k| files::Skipped {
                path: model_facing(&k.path),
                why: model_facing(&k.why),
            })
            .collect();
        // File contents: secrets redacted; with PII on, text tokenized (binary is withheld
        // by the plan below and never kept). The type is told from what the program
        // wrote.
        let mut ready = out.files;
        let mimes: Vec<&'static str> = ready
            .iter()
            .map(|f| files::mime_of(&f.path, &f.bytes))
            .collect();
        for f in &mut ready {
            if let Some(secrets) = secrets {
                f.bytes = secrets.redact_all(&f.bytes);
            }
            if vault.is_some() {
                if let Ok(text) = std::str::from_utf8(&f.bytes) {
                    f.bytes = model_facing(text).into_bytes();
                }
            }
            f.path = model_facing(&f.path);
        }
        let shown = files::plan(&ready, &limits, vault.is_none());
        let mut blocks = Vec::new();
        let mut records = Vec::with_capacity(ready.len());
        for ((f, mime), shown) in ready.iter().zip(&mimes).zip(&shown) {
            let uri = kept::file_uri(id, &f.path);
            match shown {
                Shown::Image => blocks.push(ContentBlock::image(
                    base64::engine::general_purpose::STANDARD.encode(&f.bytes),
                    *mime,
                )),
                Shown::Embedded => blocks.push(ContentBlock::resource(
                    ResourceContents::TextResourceContents {
                        uri: uri.clone(),
                        mime_type: Some((*mime).into()),
                        text: String::from_utf8_lossy(&f.bytes).into_owned(),
                        meta: None,
                    },
                )),
                Shown::Link => {
                    let mut link = Resource::new(uri.clone(), f.path.clone());
                    link.mime_type = Some((*mime).into());
                    link.size = Some(f.bytes.len() as u64);
                    blocks.push(ContentBlock::resource_link(link));
                }
                Shown::Withheld => {}
            }
            records.push(FileRecord {
                path: f.path.clone(),
                mime,
                bytes: f.bytes.len(),
                shown: *shown,
                resource: (*shown != Shown::Withheld).then_some(uri),
            });
        }
        // The files move into the store (no copy); withheld ones are not kept.
        let kept: Vec<KeptFile> = ready
            .into_iter()
            .zip(mimes)
            .zip(&shown)
            .filter(|(_, shown)| **shown != Shown::Withheld)
            .map(|((f, mime), _)| KeptFile {
                path: f.path,
                mime,
                bytes: f.bytes,
            })
            .collect();
        if !kept.is_empty() && !s.kept_outputs.keep_files(id, client, kept) {
            // A link to nothing is no use: say the file was not kept.
            tracing::info!(
                execution = %id,
                files = records.len(),
                "output files larger than the kept-output store were not kept"
            );
            blocks.retain(|b| b.as_resource_link().is_none());
            for r in &mut records {
                r.resource = None;
                if r.shown == Shown::Link {
                    r.shown = Shown::Withheld;
                }
            }
        }
        result.files = records;
        blocks
    }
}

impl CodeboxServer {
    /// The caller's kept streams and output files, as listed resources.
    pub(in crate::server) fn kept_resources(&self, client: &str) -> Vec<Resource> {
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
    pub(in crate::server) fn read_out_file(
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
            Err(why) => Err(crate::server::tools::resources::not_found(why, uri)),
        })
    }
}
