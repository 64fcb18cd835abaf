//! PII detection and tokenization (being written).
