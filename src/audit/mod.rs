//! The audit log (being written).
