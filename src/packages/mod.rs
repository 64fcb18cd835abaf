//! Packages on request: a call asks for Python requirements or npm/jsr packages; the
//! supervisor installs them outside the program's sandbox, into a read-only layer that
//! the execution binds at `/packages`.
//!
//! - [`spec`]: what a call may ask for, checked and normalised (the set's key);
//! - [`config`]: `[packages]` in `codebox.toml` (indexes, allow/deny, sizes, time);
//! - [`install`]: a set's layer, kept or installed once by the installer sandbox
//!   (`installer.py`), and failures in words the model can act on;
//! - [`store`]: layers on disk, named by their content, requests resolved to them,
//!   committed atomically and read-only, least recently used evicted past the cache size;
//! - [`seal`]: a staged layer checked, made read-only and digested.
//!
//! The install runs in a codebox sandbox of its own whose only way out is the egress
//! proxy narrowed to the configured index and registries; wheels only, npm lifecycle
//! scripts never run: no package code runs while installing.

pub mod config;
pub mod install;
pub mod preinstalled;
pub mod seal;
pub mod spec;
pub mod store;

pub use config::{Limits, NamePolicy, PackagesSection};
pub use install::{Discover, InstallError, InstallRunner, Installer, RunOutput, Sourced, Sources};
pub use preinstalled::Preinstalled;
pub use spec::{PackageSet, Spec};
pub use store::{Layer, LayerMeta, LayerStore, Staging};
