//! Page cursors: where the next page starts, bound to the catalog version and the query
//! so a cursor cannot silently walk a different result list.
//!
//! A cursor is 48 hex digits: the catalog version, the offset and a hash of the query
//! (its terms and server filter), each a big-endian `u64`. It is opaque to callers and
//! carries no secret; a forged one can only ask for another offset of the same list.

use crate::catalog::{Result, SearchError};

const FIELDS: usize = 3;
const HEX_LEN: usize = FIELDS * 16;

/// What a cursor says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub version: u64,
    pub offset: u64,
    pub query: u64,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!(
            "{:016x}{:016x}{:016x}",
            self.version, self.offset, self.query
        )
    }

    pub fn decode(text: &str) -> Result<Cursor> {
        let malformed = SearchError::BadCursor("it is not a cursor this search returned");
        if text.len() != HEX_LEN || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(malformed);
        }
        let field = |i: usize| u64::from_str_radix(&text[i * 16..(i + 1) * 16], 16);
        match (field(0), field(1), field(2)) {
            (Ok(version), Ok(offset), Ok(query)) => Ok(Cursor {
                version,
                offset,
                query,
            }),
            _ => Err(malformed),
        }
    }

    /// The offset, if the cursor belongs to this catalog version and query.
    pub fn offset_for(&self, version: u64, query: u64) -> Result<usize> {
        if self.version != version {
            return Err(SearchError::BadCursor(
                "the tool catalog changed since it was returned",
            ));
        }
        if self.query != query {
            return Err(SearchError::BadCursor(
                "it belongs to a different query or server",
            ));
        }
        usize::try_from(self.offset)
            .map_err(|_| SearchError::BadCursor("it is not a cursor this search returned"))
    }
}

/// FNV-1a over the query's parts (with a separator between them), stable across builds.
pub fn query_hash<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let c = Cursor {
            version: 7,
            offset: 40,
            query: u64::MAX,
        };
        let text = c.encode();
        assert_eq!(text.len(), 48);
        assert_eq!(Cursor::decode(&text), Ok(c));
        assert_eq!(c.offset_for(7, u64::MAX), Ok(40));
    }

    #[test]
    fn foreign_cursors_are_refused_with_the_reason() {
        let c = Cursor {
            version: 7,
            offset: 5,
            query: 1,
        };
        let err = |r: Result<usize>| r.unwrap_err().to_string();
        assert!(err(c.offset_for(8, 1)).contains("catalog changed"));
        assert!(err(c.offset_for(7, 2)).contains("different query"));
        for bad in [
            "",
            "xyz",
            &"g".repeat(48),
            &"0".repeat(47),
            "+0000000000000000000000000000000000000000000000",
        ] {
            let e = Cursor::decode(bad).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("invalid cursor: it is not a cursor"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn query_hash_separates_parts() {
        assert_ne!(query_hash(["ab", "c"]), query_hash(["a", "bc"]));
        assert_ne!(query_hash(["read"]), query_hash(["read", ""]));
        assert_eq!(query_hash(["read", "file"]), query_hash(["read", "file"]));
    }
}
