//! Credentials added to requests at the boundary and redacted from what comes back, in
//! every encoding a response may carry them.

pub(crate) mod credentials;
pub(crate) mod encodings;
pub(crate) mod redact;
