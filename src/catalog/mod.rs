//! Tool search over the [`Catalog`](crate::upstream::catalog::Catalog): what the model
//! and sandboxed code use to find tools among hundreds or thousands without reading them
//! all.
//!
//! - [`tokenize`]: text → terms (lowercase words split at non-alphanumerics and
//!   camelCase, a few stop words dropped, plural endings stemmed)
//! - [`bm25`]: an inverted index ranked with BM25F (Okapi BM25 over weighted fields)
//! - [`index`]: [`SearchIndex`]: one document per tool (fields: tool name ×3, title ×2,
//!   server, description, parameter names, parameter descriptions and enum values ×0.5),
//!   filters (server, the caller's allowlist) and pages
//! - [`render`]: a tool at the detail asked for ([`Detail`]), with the signatures of its
//!   generated wrappers from [`codegen::describe`](crate::codegen::describe), and as
//!   the text of a search answer ([`text_entry`])
//! - [`cursor`]: opaque page cursors bound to the catalog version and the query
//! - [`synthetic`]: made-up catalogs of any size for benchmarks and tests
//!
//! An empty query (or one of stop words only) lists every tool by name. Results are
//! ordered by score, then by name, so pages are stable for one catalog version.

pub mod bm25;
mod cursor;
mod index;
mod render;
pub mod synthetic;
pub mod tokenize;

use std::str::FromStr;

pub use index::SearchIndex;
pub use render::text_entry;

/// Most results one page may hold.
pub const MAX_LIMIT: usize = 100;
/// A page size for callers whose request does not say.
pub const DEFAULT_LIMIT: usize = 10;

/// How much of each tool a search returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// `{name}`.
    Name,
    /// `{name, server, description, typescript, python}`: the description's first
    /// sentence and the TypeScript and Python signatures, each on one line.
    Summary,
    /// `{name, server, tool, title, description, input_schema, output_schema, typescript,
    /// python}`: the schemas, the TypeScript declarations and the Python signature.
    Full,
}

impl FromStr for Detail {
    type Err = SearchError;

    fn from_str(s: &str) -> Result<Detail> {
        match s {
            "name" => Ok(Detail::Name),
            "summary" => Ok(Detail::Summary),
            "full" => Ok(Detail::Full),
            other => Err(SearchError::BadDetail(other.to_string())),
        }
    }
}

/// One search request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchQuery {
    /// Free text; empty lists every tool.
    pub text: String,
    /// Only tools of this server (its name as configured).
    pub server: Option<String>,
    pub detail: Detail,
    /// Page size, 1 to [`MAX_LIMIT`].
    pub limit: usize,
    /// `next_cursor` of the previous page of the same query.
    pub cursor: Option<String>,
}

/// One page of results.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchPage {
    /// The tools of this page, best first, at the detail asked for.
    pub tools: Vec<serde_json::Value>,
    /// Where the next page starts; `None` on the last page.
    pub next_cursor: Option<String>,
    /// How many tools match in all pages.
    pub total: usize,
}

/// Why a search was refused; the messages are written for a model to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error("invalid cursor: {0}; repeat the search without a cursor")]
    BadCursor(&'static str),
    #[error("limit must be from 1 to {MAX_LIMIT}, not {0}")]
    BadLimit(usize),
    #[error("unknown server {server:?}; {}", known_servers(.known))]
    UnknownServer { server: String, known: Vec<String> },
    #[error("detail {0:?} is not one of \"name\", \"summary\", \"full\"")]
    BadDetail(String),
}

fn known_servers(known: &[String]) -> String {
    if known.is_empty() {
        "no servers are connected".to_string()
    } else {
        format!("the servers are: {}", known.join(", "))
    }
}

pub type Result<T> = std::result::Result<T, SearchError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_parses_and_explains() {
        assert_eq!("name".parse::<Detail>(), Ok(Detail::Name));
        assert_eq!("summary".parse::<Detail>(), Ok(Detail::Summary));
        assert_eq!("full".parse::<Detail>(), Ok(Detail::Full));
        let err = "Full".parse::<Detail>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "detail \"Full\" is not one of \"name\", \"summary\", \"full\""
        );
    }

    #[test]
    fn messages_name_the_way_out() {
        let e = SearchError::UnknownServer {
            server: "fs".into(),
            known: vec!["filesystem".into(), "time".into()],
        };
        assert_eq!(
            e.to_string(),
            "unknown server \"fs\"; the servers are: filesystem, time"
        );
        let e = SearchError::UnknownServer {
            server: "fs".into(),
            known: vec![],
        };
        assert!(e.to_string().ends_with("no servers are connected"));
        assert_eq!(
            SearchError::BadLimit(0).to_string(),
            "limit must be from 1 to 100, not 0"
        );
    }
}
