//! The output budget applied to a finished result: stdout and stderr cut to the call's
//! budget (head and tail around a marker naming the resource), the whole streams kept as
//! the caller's resources when anything was cut, and `output` in the result saying what
//! was left out. Runs after secrets were redacted and personal data tokenized, so what
//! is kept is what the model may see.

use serde_json::json;

use crate::execution::ExecutionResult;
use crate::output::{budget, kept};
use crate::server::CodeboxServer;

impl CodeboxServer {
    /// `id`: the execution's id in the kept store ([`kept::new_id`]).
    pub(in crate::server) fn fit_output(
        &self,
        client: &str,
        id: &str,
        result: &mut ExecutionResult,
        chars: usize,
    ) {
        // The last expression's value takes at most a quarter; the streams the rest.
        let budget_chars = chars;
        let mut value_cut = None;
        let mut chars = chars;
        if let Some(value) = &mut result.value {
            let kept = budget::keep_value(value, budget::value_room(chars));
            chars -= kept.cut.map_or(kept.text.chars().count(), |c| c.kept_chars);
            value_cut = kept.cut;
            *value = kept.text;
        }
        let (out, err) = budget::keep(&result.stdout, &result.stderr, chars, |stream| {
            kept::uri(id, stream)
        });
        if out.cut.is_none() && err.cut.is_none() {
            if let Some(c) = value_cut {
                result.output = Some(json!({"budget_chars": budget_chars, "value": c}));
            }
            return;
        }
        let whole = |k: &budget::Kept, text: &mut String| k.cut.map(|_| std::mem::take(text));
        let (stdout, stderr) = (
            whole(&out, &mut result.stdout),
            whole(&err, &mut result.stderr),
        );
        let kept = self
            .state
            .kept_outputs
            .keep(id, client, stdout.clone(), stderr.clone());
        let (out, err) = if kept {
            (out, err)
        } else {
            // Too large to keep: the marker must not name a resource that is not there.
            let none = |_: &str| "(not kept: larger than the kept-output store)".to_string();
            budget::keep(
                stdout.as_deref().unwrap_or(&out.text),
                stderr.as_deref().unwrap_or(&err.text),
                chars,
                none,
            )
        };
        let describe = |k: &budget::Kept, stream: &str| {
            k.cut.map(|c| {
                json!({
                    "left_out_bytes": c.left_out_bytes,
                    "left_out_lines": c.left_out_lines,
                    "kept_chars": c.kept_chars,
                    "resource": kept.then(|| kept::uri(id, stream)),
                })
            })
        };
        result.output = Some(json!({
            "budget_chars": budget_chars,
            "stdout": describe(&out, "stdout"),
            "stderr": describe(&err, "stderr"),
            "value": value_cut,
        }));
        tracing::debug!(
            execution = %id,
            stdout_cut = ?out.cut,
            stderr_cut = ?err.cut,
            kept,
            "the output budget cut the result"
        );
        result.stdout = out.text;
        result.stderr = err.text;
    }
}
