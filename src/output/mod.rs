//! What of a program's output reaches the model: a budget in characters per result
//! (`budget.rs`: head and tail of each stream around a marker), the whole streams of cut
//! results kept for a while as the caller's resources (`kept.rs`), and `[output]` of
//! `codebox.toml` (`config.rs`).

pub mod budget;
pub mod config;
pub mod files;
pub mod json_text;
pub mod kept;

pub use budget::{Budget, Cut, Kept, MIN_CHARS};
pub use config::{OutputSection, OutputSettings};
pub use files::{OutFile, OutFiles, OutFilesLimits};
pub use kept::{KeptLimits, KeptOutputs};
