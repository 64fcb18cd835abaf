//! The skills store (being written).
