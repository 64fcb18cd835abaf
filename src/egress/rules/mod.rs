//! What a connection may reach: host patterns, the run's policy built from them, the
//! addresses a name resolves to and which of them are allowed, and the `/why` answer.

pub(crate) mod address;
pub mod pattern;
pub mod policy;
pub mod resolve;
pub(crate) mod why;
