//! Rate limits per client (being written).
